-- limits.lua: a name's runtime rate, burst and cap; the lock's pause ('lock_paused', server ms).
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 op: 'r' read; 's' set: field, value...; 'c' clear rate, burst, cap; 'p' pause: 2 ms;
--   'q' resume, handing on as a release: 2 spec, 3 request id (run twice, the same: meta 'r')
-- Returns {now ms, pause end (0: none), rate, burst, cap, then each hand-over of a resume}.
-- No expiry while it holds a limit; a pause alone lives until it ends (never shortened).
-- #include _grant.lua

local op = ARGV[1]
local now, now_us = server_now()
local FIELDS = {'rate', 'burst', 'cap', 'lock_paused'}

local function stored()
  return redis.call('HMGET', K.limits, unpack(FIELDS))
end

local function limits_answer(granted)
  local set = stored()
  local paused = tonumber(set[4]) or 0
  if paused <= now then
    paused = 0
  end
  return append({now, paused, set[1], set[2], set[3]}, granted or {})
end

local function live_until(ends)
  local want = ends - now
  if redis.call('PTTL', K.limits) < want then
    redis.call('PEXPIRE', K.limits, int(want))
  end
end

if op == 'r' then
  return limits_answer()
end

if op == 's' then
  -- A runtime limit has no expiry: rewritten (DEL and HSET: PERSIST is not among the ACL commands).
  if redis.call('PTTL', K.limits) >= 0 then
    local set = stored()
    local kept = {}
    for i, field in ipairs(FIELDS) do
      if set[i] then
        kept[#kept + 1] = field
        kept[#kept + 1] = set[i]
      end
    end
    redis.call('DEL', K.limits)
    if #kept > 0 then
      redis.call('HSET', K.limits, unpack(kept))
    end
  end
  redis.call('HSET', K.limits, unpack(ARGV, 2))
  return limits_answer()
end

if op == 'c' then
  redis.call('HDEL', K.limits, 'rate', 'burst', 'cap')
  local paused = tonumber(redis.call('HGET', K.limits, 'lock_paused') or '0') or 0
  if paused > now then
    live_until(paused)
  else
    redis.call('DEL', K.limits) -- (a pause past: the hash says nothing more)
  end
  return limits_answer()
end

if op == 'p' then
  local set = stored()
  local ends = math.max(tonumber(set[4]) or 0, now + tonumber(ARGV[2]))
  redis.call('HSET', K.limits, 'lock_paused', int(ends))
  if not (set[1] or set[2] or set[3]) then
    live_until(ends)
  end
  -- The fast path reads the pause's end in the meta key, which lives as long.
  redis.call('HSET', K.meta, 'P', int(ends))
  if redis.call('PTTL', K.meta) < ends - now then
    redis.call('PEXPIRE', K.meta, int(ends - now))
  end
  return limits_answer()
end

if op == 'q' then
  local _, _, _, fair, _, keep_ms = parse_spec(ARGV[2])
  local request = ARGV[3]
  local last = redis.call('HGET', K.meta, 'r')
  if last and string.sub(last, 1, #request + 1) == request .. ' ' then
    local again = {}
    for item in string.gmatch(string.sub(last, #request + 2), '%S+') do
      again[#again + 1] = item
    end
    return limits_answer(again)
  end
  if not redis.call('HGET', K.limits, 'lock_paused') then
    return limits_answer() -- not paused: nothing to end, nothing to hand on
  end
  redis.call('HDEL', K.limits, 'lock_paused') -- (the hash goes with it if it held nothing else)
  redis.call('HDEL', K.meta, 'P')
  promote(now)
  forget_runtime_limits()
  local granted = {}
  if start(now) or queue_exists() then
    granted = hand_on({}, now, now_us, fair, true, keep_ms)
    if #granted > 0 then
      redis.call('HSET', K.meta, 'r', request .. ' ' .. reply(append({}, granted)))
    end
  end
  return limits_answer(granted)
end

return redis.error_reply('limits: unknown op ' .. tostring(op))
