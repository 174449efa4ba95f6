-- unique_claim.lua: claim a unique task's key as its message is published.
-- KEYS: 1 queued (string: the id of the task whose message holds the key; '!' and the id once
--         a once_per_period run started, see _claim.lua),
--       2 replaced (set: ids of copies replaced, which must not run when delivered),
--       3-10 the eight keys of the run lock named like the unique key (see _lock.lua): a live
--         run lease means the job runs; a replaced copy parked in its task line leaves it here
-- ARGV: 1 task id, 2 lifetime ms,
--       3 kind: 'n' a new call, 'x' a new call that replaces a queued holder,
--               'k' a new call that replaces a queued holder or cancels a running one,
--               'r' a re-publish of the same job (its retry, or its claim kept as it parks),
--               'c' the confirmation of a publish: extends this id's claim, never makes one
--                 (the copy may have started and given its claim up already)
--       4 '1' if a running copy counts as a duplicate (until_finished), else '0'
--       5 (kind 'r' only, optional) the token of the task line entry the job has just parked
--         as: a copy replaced meanwhile leaves the line at once; else the entry is noted as the
--         key's parked copy (meta 'u': '<task id> <token>'), for a later replace to find it
-- Returns 'status holder ms state [also]' (one string):
--   1 claimed, or this id's already (lifetime extended, never shortened); holder = this id
--   2 claimed from the holder (replace, cancel): holder = the replaced id, for the caller to
--     revoke; state 'r' if it runs (cancel: the caller stops it), and `also` a queued copy
--     replaced in the same step (a cancel that found both), else '-'
--   0 a duplicate: holder = the id holding the key, ms = what its claim has left,
--     state 'q' (queued), 'r' (running) or 's' (a once_per_period run started in the period)
--   3 a re-publish that found another id holding the key (or this id replaced, holder '-'
--     when no id holds it): published without it; a confirmation that found the key not this
--     id's (holder '-' if nobody holds it)
-- A replaced copy parked in the task line leaves it (O(log n)): it is never handed the lock.
-- Its parked record stays, marked replaced ('r'), listed with the expired entries ('x') for a
-- sweeper to end it without running it (line_sweep.lua, core/handover.py). Run twice, nothing
-- more leaves the line: the entry is gone from it.

-- #include _time.lua
-- #include _claim.lua
-- #include _line.lua

local id, ttl, kind, count_running = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
local parked_as = kind == 'r' and ARGV[5] ~= '' and ARGV[5] or nil

use_lock_keys(2) -- the run lock's eight keys follow the claim's two

-- The entry `tok` of task `task` leaves the line, if it waits there, as replaced: its record
-- stays, marked, listed with the expired ones for a sweeper to end it (never to run it).
-- `tok` nil: the key's parked copy noted in meta 'u', if it is `task`'s.
local function drop_replaced(task, tok)
  if not tok then
    local noted = redis.call('HGET', K.meta, 'u')
    local who, at = string.match(noted or '', '^(%S+) (%S+)$')
    if who ~= task then
      return
    end
    tok = at -- (the note stays: once its entry has left, it is ignored)
  end
  local raw = redis.call('HGET', K.meta, 'q:' .. tok)
  local parked = raw and redis.call('HGET', K.meta, 'p:' .. tok)
  if not parked or cjson.decode(raw).o ~= task then
    return
  end
  dequeue(tok, raw)
  local rec = cjson.decode(parked)
  rec.r = 1
  local x = redis.call('HGET', K.meta, 'x')
  redis.call('HSET', K.meta, 'p:' .. tok, cjson.encode(rec), 'x', x and (x .. ' ' .. tok) or tok)
end

-- Another id takes the key from a queued `cur`, which must not run if it is delivered anyway
-- (and leaves the task line now if it waits there).
local function take_from(cur, left)
  redis.call('SET', KEYS[1], id, 'PX', ttl)
  redis.call('SADD', KEYS[2], cur)
  redis.call('PEXPIRE', KEYS[2], math.max(ttl, left, redis.call('PTTL', KEYS[2])))
  drop_replaced(cur)
end

-- A copy that has just parked as `parked_as` (not replaced: asked first): holding the key, it
-- is noted as the key's parked copy (only while its entry is in line: the meta key then
-- exists); another id holding the key, it leaves the line, as it would have been skipped when
-- handed the lock.
local function parked(holds)
  if not parked_as then
    return
  end
  if holds then
    if in_line(parked_as) then
      redis.call('HSET', K.meta, 'u', id .. ' ' .. parked_as)
    end
  else
    drop_replaced(id, parked_as)
  end
end

-- A live run lease: the job runs (its leases key exists only while a lease may be live).
-- A re-publish or a confirmation is the job that may hold the lease itself.
local asks_running = count_running and kind ~= 'r' and kind ~= 'c'
if asks_running then
  promote(server_now()) -- (a fast-path lease, see _lean.lua, is looked for in the leases key)
end
if asks_running and redis.call('EXISTS', K.leases) == 1 then
  local now = call_ms
  local live = redis.call('ZRANGEBYSCORE', K.leases, string.format('(%d', now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if live[1] then
    local raw = redis.call('HGET', K.meta, 'i:' .. live[1])
    local holder = raw and cjson.decode(raw).task_id or '?'
    if holder ~= id then
      if kind ~= 'k' then
        return string.format('0 %s %d r', holder, tonumber(live[2]) - now)
      end
      -- Cancel: this call takes the key; the running copy is stopped by the caller, and a
      -- copy queued by an earlier cancel is replaced (run twice, it changes nothing more).
      redis.call('SADD', KEYS[2], holder)
      redis.call('PEXPIRE', KEYS[2], math.max(ttl, redis.call('PTTL', KEYS[2])))
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
-- A parked copy that was replaced (its replacer may have started and gone) claims nothing.
if parked_as and redis.call('SISMEMBER', KEYS[2], id) == 1 then
  parked(false)
  return string.format('3 %s %d q', holder or '-', cur and redis.call('PTTL', KEYS[1]) or 0)
end
if not cur or cur == id then
  local left = cur and redis.call('PTTL', KEYS[1]) or 0
  redis.call('SET', KEYS[1], id, 'PX', math.max(ttl, left))
  parked(true)
  return string.format('1 %s 0 q', id)
end
if holder == id then  -- this job's once_per_period run started: its period stands
  parked(true)
  return string.format('1 %s 0 q', id)
end
local left = math.max(redis.call('PTTL', KEYS[1]), 0)
if kind == 'r' then
  parked(false)
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
