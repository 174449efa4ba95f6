-- unique_claim.lua: claim a unique task's key as its message is published.
-- KEYS: 1 queued (the claim, see _claim.lua), 2 replaced (set: ids not to run), 3-10 run lock
--   (for kind 'n' its leases and meta alone, 3-4: a new claim never touches the line; none for
--   a confirm)
-- ARGV: 1 task id, 2 lifetime ms, 3 kind: 'n' new, 'x' new replacing a queued holder, 'k' also
--   cancelling a running one, 'r' re-publish, 'c' confirm a publish (never claims: the copy may
--   have started and given it up); 4 '1': a running copy is a duplicate; 5 ('r') parked token
-- Returns 'status holder ms state [also]': 1 claimed or this id's (never shortened); 2 taken
--   from `holder` (state 'r': the caller stops it; `also` a queued copy replaced too); 0 a
--   duplicate: ms left, state 'q' queued, 'r' running, 's' period started; 3 not this id's.
-- #include _time.lua
-- #include _claim.lua
-- #include _lock.lua

local id, ttl, kind, count_running = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
local parked_as = kind == 'r' and ARGV[5] ~= '' and ARGV[5] or nil
use_lock_keys(2) -- the run lock's eight keys follow the claim's two

-- Only the kinds that may meet the task line ('r' a parked copy, 'x' and 'k' replacing one)
-- make its helpers: a new claim, the publish's, never does (its call makes none of them).
local drop_replaced
local parked = function() end
if kind == 'r' or kind == 'x' or kind == 'k' then
-- #include _line.lua

  -- `tok` nil: the key's parked copy noted in meta 'u', if it is `task`'s.
  drop_replaced = function(task, tok)
    if not tok then
      local noted = redis.call('HGET', K.meta, 'u')
      local who, at = string.match(noted or '', '^(%S+) (%S+)$')
      if who ~= task then
        return
      end
      tok = at -- (the note stays: once its entry has left, it is ignored)
    end
    local raw = redis.call('HGET', K.meta, 'q:' .. tok)
    local record = raw and redis.call('HGET', K.meta, 'p:' .. tok)
    if not record or cjson.decode(raw).o ~= task then
      return
    end
    dequeue(tok, raw)
    local rec = cjson.decode(record)
    rec.r = 1
    local x = redis.call('HGET', K.meta, 'x')
    redis.call('HSET', K.meta, 'p:' .. tok, cjson.encode(rec), 'x', x and (x .. ' ' .. tok) or tok)
  end

  -- A copy just parked: holding the key, noted (while in line) for a replace; else it leaves.
  parked = function(holds)
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
end

local function take_from(cur, left) -- (kinds 'x' and 'k' alone)
  redis.call('SET', KEYS[1], id, 'PX', ttl)
  redis.call('SADD', KEYS[2], cur)
  redis.call('PEXPIRE', KEYS[2], math.max(ttl, left, redis.call('PTTL', KEYS[2])))
  drop_replaced(cur)
end

-- The running copy, read where its lease is: a fast-path lease (meta 'L', its info 'I'), else,
-- while 'm' says the general path holds it, the leases key. Returns its id and ms left, or nil.
local function running()
  local s = redis.call('HMGET', K.meta, 'L', 'm', 'I')
  if s[1] and s[1] ~= '' then
    local now = server_now()
    local _, expiry = parse_lean(s[1])
    if tonumber(expiry) > now then
      return s[3] and s[3] ~= '' and cjson.decode(s[3]).task_id or '?', tonumber(expiry) - now
    end
  elseif s[2] then
    local now = server_now()
    local live = redis.call('ZRANGEBYSCORE', K.leases, string.format('(%d', now), '+inf',
      'WITHSCORES', 'LIMIT', 0, 1)
    if live[1] then
      local raw = redis.call('HGET', K.meta, 'i:' .. live[1])
      return raw and cjson.decode(raw).task_id or '?', tonumber(live[2]) - now
    end
  end
end

if count_running and kind ~= 'r' and kind ~= 'c' then
  local holder, left = running()
  if holder then
    if holder ~= id then
      if kind ~= 'k' then
        return string.format('0 %s %d r', holder, left)
      end
      -- Cancel: the caller stops the running copy; one queued by an earlier cancel is replaced.
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
  -- Never shortened: run twice, it answers the same.
  if not started then
    redis.call('PEXPIRE', KEYS[1], math.max(ttl, redis.call('PTTL', KEYS[1])))
  end
  return string.format('1 %s 0 q', id)
end

if kind ~= 'r' and redis.call('SET', KEYS[1], id, 'NX', 'PX', ttl) then
  return string.format('1 %s 0 q', id)
end

local cur = redis.call('GET', KEYS[1])
local holder, started = holder_of(cur)
-- A replaced parked copy (its replacer may have started and gone) claims nothing.
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
