-- unique_claim.lua: claim a unique task's key as its message is published.
-- KEYS: 1 queued (string: the id of the task whose message holds the key),
--       2 leases, 3 meta (the run lock's keys, read only: a live run lease means the job runs),
--       4 replaced (set: ids of queued copies replaced, which must not run when delivered)
-- ARGV: 1 task id, 2 lifetime ms,
--       3 kind: 'n' a new call, 'x' a new call that replaces a queued holder,
--               'r' a re-publish of the same job (its retry),
--               'c' the confirmation of a publish: extends this id's claim, never makes one
--                 (the copy may have started and given its claim up already)
--       4 '1' if a running copy counts as a duplicate (until_finished), else '0'
-- Returns 'status holder ms state' (one string):
--   1 claimed, or this id's already (lifetime extended, never shortened); holder = this id
--   2 claimed from a queued holder (replace): holder = the replaced id, for the caller to revoke
--   0 a duplicate: holder = the id holding the key, ms = what its claim has left,
--     state 'q' (queued) or 'r' (running)
--   3 a re-publish that found another id holding the key: published without it; a
--     confirmation that found the key not this id's (holder '-' if nobody holds it)

-- #include _time.lua

local id, ttl, kind, count_running = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
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
      return string.format('0 %s %d r', holder, tonumber(live[2]) - now)
    end
  end
end

if kind == 'c' then
  local cur = redis.call('GET', KEYS[1])
  if cur ~= id then
    return string.format('3 %s 0 q', cur or '-')
  end
  -- Never shortened: run twice (a lost reply), it answers the same.
  redis.call('PEXPIRE', KEYS[1], math.max(ttl, redis.call('PTTL', KEYS[1])))
  return string.format('1 %s 0 q', id)
end

-- The common case, a new call and nobody holds the key: one command.
if kind ~= 'r' and redis.call('SET', KEYS[1], id, 'NX', 'PX', ttl) then
  return string.format('1 %s 0 q', id)
end

local cur = redis.call('GET', KEYS[1])
if not cur or cur == id then
  local left = cur and redis.call('PTTL', KEYS[1]) or 0
  redis.call('SET', KEYS[1], id, 'PX', math.max(ttl, left))
  return string.format('1 %s 0 q', id)
end
local left = math.max(redis.call('PTTL', KEYS[1]), 0)
if kind == 'r' then
  return string.format('3 %s %d q', cur, left)
end
if kind == 'x' then
  redis.call('SET', KEYS[1], id, 'PX', ttl)
  redis.call('SADD', KEYS[4], cur)
  redis.call('PEXPIRE', KEYS[4], math.max(ttl, left, redis.call('PTTL', KEYS[4])))
  return string.format('2 %s 0 q', cur)
end
return string.format('0 %s %d q', cur, left)
