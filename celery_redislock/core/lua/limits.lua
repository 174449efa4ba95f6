-- limits.lua: what is set at runtime for a name, in its limits hash (K.limits): the rate limit's
-- rate and burst and the lock's cap, set and cleared; the lock paused and resumed (field
-- 'lock_paused': the server ms until which the lock hands out no new lease, see fits in
-- _grant.lua); or only read.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 op: 'r' read only;
--         's' set: field, value, field, value... follow (rate, burst, cap; checked by the
--           caller);
--         'c' clear the rate, the burst and the cap (a pause of the lock stays);
--         'p' pause the lock: ARGV 2 how long (ms); a longer pause already set is kept;
--         'q' resume the lock: its pause ends now and the lock is handed on to its line as a
--           release hands it on. ARGV 2 the lock's spec (see parse_spec in _lock.lua; its
--           fairness and keep are used), 3 request id (chosen by the client: run again, the
--           call answers the first run's hand-overs; kept in the meta field 'r')
-- Returns {now ms, the end of the lock's pause (server ms; 0: not paused), rate, burst, cap
--   (as stored; nil: not set), then token, fence, expiry of each waiter or parked task a resume
--   handed the lock to (as in release.lua)}.
--
-- The hash lives as long as it says something: holding a rate, a burst or a cap, with no
-- expiry (until cleared); holding only a pause, until the pause ends (its TTL is never
-- shortened): a pause outlives no one. Run twice, each op leaves the same state (a pause run
-- again may end a few ms later, as a rate limit's does).

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

-- The hash, holding only a pause ending at `ends`, lives until then (never shorter).
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
  -- A hash that lived only for a pause has an expiry: a limit set at runtime has none, so the
  -- hash is written anew without it (DEL and HSET rather than PERSIST: only the commands the
  -- docs list for ACL users).
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
  -- The fast path (see _lean.lua) reads the pause's end in the meta key, which lives as long.
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
    -- This very resume ran before (its reply was lost): its hand-overs are answered again, for
    -- the caller to wake and publish.
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
  -- The line does not wait for a release nor for a sweeper: the lock is handed on now, as a
  -- release that freed capacity hands it on (parked tasks and a fair lock's waiters served in
  -- order, or a non-fair lock's longest-blocked waiter woken).
  local granted = {}
  if start(now) or queue_exists() then
    granted = hand_on({}, now, now_us, fair, true, keep_ms)
    if #granted > 0 then
      -- (Written as the answer's items, numbers as exact integers: reply() on a copy.)
      redis.call('HSET', K.meta, 'r', request .. ' ' .. reply(append({}, granted)))
    end
  end
  return limits_answer(granted)
end

return redis.error_reply('limits: unknown op ' .. tostring(op))
