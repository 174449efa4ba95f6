-- unique_claim.lua: claim a unique task's key as its message is published.
-- KEYS: 1 queued (string: the id of the task whose message holds the key; '!' and the id once
--         a once_per_period run started, see _claim.lua),
--       2 leases, 3 meta (the run lock's keys, read only: a live run lease means the job runs),
--       4 replaced (set: ids of copies replaced, which must not run when delivered)
-- ARGV: 1 task id, 2 lifetime ms,
--       3 kind: 'n' a new call, 'x' a new call that replaces a queued holder,
--               'k' a new call that replaces a queued holder or cancels a running one,
--               'r' a re-publish of the same job (its retry),
--               'c' the confirmation of a publish: extends this id's claim, never makes one
--                 (the copy may have started and given its claim up already)
--       4 '1' if a running copy counts as a duplicate (until_finished), else '0'
-- Returns 'status holder ms state [also]' (one string):
--   1 claimed, or this id's already (lifetime extended, never shortened); holder = this id
--   2 claimed from the holder (replace, cancel): holder = the replaced id, for the caller to
--     revoke; state 'r' if it runs (cancel: the caller stops it), and `also` a queued copy
--     replaced in the same step (a cancel that found both), else '-'
--   0 a duplicate: holder = the id holding the key, ms = what its claim has left,
--     state 'q' (queued), 'r' (running) or 's' (a once_per_period run started in the period)
--   3 a re-publish that found another id holding the key: published without it; a
--     confirmation that found the key not this id's (holder '-' if nobody holds it)

-- #include _time.lua
-- #include _claim.lua

local id, ttl, kind, count_running = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'

-- Another id takes the key from a queued `cur`, which must not run if it is delivered anyway.
local function take_from(cur, left)
  redis.call('SET', KEYS[1], id, 'PX', ttl)
  redis.call('SADD', KEYS[4], cur)
  redis.call('PEXPIRE', KEYS[4], math.max(ttl, left, redis.call('PTTL', KEYS[4])))
end

-- A live run lease: the job runs (its leases key exists only while a lease may be live).
-- A re-publish or a confirmation is the job that may hold the lease itself.
if count_running and kind ~= 'r' and kind ~= 'c' and redis.call('EXISTS', KEYS[2]) == 1 then
  local now = server_now()
  local live = redis.call('ZRANGEBYSCORE', KEYS[2], string.format('(%d', now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if live[1] then
    local raw = redis.call('HGET', KEYS[3], 'i:' .. live[1])
    local holder = raw and cjson.decode(raw).task_id or '?'
    if holder ~= id then
      if kind ~= 'k' then
        return string.format('0 %s %d r', holder, tonumber(live[2]) - now)
      end
      -- Cancel: this call takes the key; the running copy is stopped by the caller, and a
      -- copy queued by an earlier cancel is replaced (run twice, it changes nothing more).
      redis.call('SADD', KEYS[4], holder)
      redis.call('PEXPIRE', KEYS[4], math.max(ttl, redis.call('PTTL', KEYS[4])))
      local queued = holder_of(redis.call('GET', KEYS[1]))
      if queued == id then
        return string.format('2 %s 0 r -', holder)
      end
      if queued then
        take_from(queued, math.max(redis.call('PTTL', KEYS[1]), 0))
      else
        redis.call('SET', KEYS[1], id, 'PX', ttl)
      end
      return string.format('2 %s 0 r %s', holder, queued or '-')
    end
  end
end

if kind == 'c' then
  local cur = redis.call('GET', KEYS[1])
  local holder, started = holder_of(cur)
  if holder ~= id then
    return string.format('3 %s 0 q', holder or '-')
  end
  -- Never shortened: run twice (a lost reply), it answers the same. A started period stays.
  if not started then
    redis.call('PEXPIRE', KEYS[1], math.max(ttl, redis.call('PTTL', KEYS[1])))
  end
  return string.format('1 %s 0 q', id)
end

-- The common case, a new call and nobody holds the key: one command.
if kind ~= 'r' and redis.call('SET', KEYS[1], id, 'NX', 'PX', ttl) then
  return string.format('1 %s 0 q', id)
end

local cur = redis.call('GET', KEYS[1])
local holder, started = holder_of(cur)
if not cur or cur == id then
  local left = cur and redis.call('PTTL', KEYS[1]) or 0
  redis.call('SET', KEYS[1], id, 'PX', math.max(ttl, left))
  return string.format('1 %s 0 q', id)
end
if holder == id then  -- this job's once_per_period run started: its period stands
  return string.format('1 %s 0 q', id)
end
local left = math.max(redis.call('PTTL', KEYS[1]), 0)
if kind == 'r' then
  return string.format('3 %s %d q', holder, left)
end
if started then  -- a run in its period is no queued copy: nothing replaces it
  return string.format('0 %s %d s', holder, left)
end
if kind == 'x' or kind == 'k' then
  take_from(cur, left)
  return string.format('2 %s 0 q -', cur)
end
return string.format('0 %s %d q', cur, left)
