-- _grant.lua (a part, not a script; see scripts.py): the lock handed on to those in line.
-- Defines: runtime_cap, lock_paused, forget_runtime_limits, limits_present,
-- read_runtime_limits, pause_left, fits, line_head, grant, wake_one, tidy, hand_on.
-- #include _line.lua

-- K.limits as read once per call (nil: not yet; false: no cap; 0 or past: not paused).
local runtime_cap = nil
local lock_paused = nil

local function forget_runtime_limits()
  runtime_cap, lock_paused = nil, nil
end

local function limits_present(present)
  if not present then
    runtime_cap, lock_paused = false, 0
  end
end

local function read_runtime_limits()
  if runtime_cap == nil then
    local set = redis.call('HMGET', K.limits, 'cap', 'lock_paused')
    runtime_cap, lock_paused = tonumber(set[1]) or false, tonumber(set[2]) or 0
  end
end

-- No new lease while paused; held leases still renew and release, a re-entry is no new lease.
local function pause_left()
  read_runtime_limits()
  return lock_paused > call_ms and lock_paused - call_ms or 0
end

-- Never while paused; a limit of 2 or more gives way to a runtime cap. Second: no lease at all.
local function fits(mode, limit)
  if pause_left() > 0 then
    return false
  end
  local n = lease_count()
  if n == 0 then
    return true, true
  end
  if limit >= 2 then
    limit = runtime_cap or limit
  end
  return (limit == 0 or n < limit) and redis.call('HGET', K.meta, 'm') == mode
end

local function line_head()
  while true do
    local head = redis.call('ZRANGE', K.queue, 0, 0)[1]
    if not head or string.sub(head, 1, 1) ~= SLOT then
      return head
    end
    local member, tok = tenant_next(head)
    if member then
      return tok, member, head
    end
    redis.call('ZREM', K.queue, head)
  end
end

-- Fair mode: a grant lasts no longer than its place in line (a dead waiter holds seconds).
local function grant(now, now_us, skip, keep_ms, skip_raw)
  local out = {}
  while true do
    local head, member, place = line_head()
    if not head then
      break
    end
    local raw = head == skip and skip_raw or redis.call('HGET', K.meta, 'q:' .. head)
    local q = raw and cjson.decode(raw)
    -- An owner's waiter gets no second lease: woken with fence 0 to re-enter; before capacity.
    local mine = q and not q.p and q.o ~= '' and redis.call('HGET', K.meta, 'o:' .. q.o)
    local fence, expiry = nil, nil -- what the waiter is told (nil: it is not woken)
    if mine and redis.call('ZSCORE', K.leases, mine) then
      q = nil
      fence, expiry = 0, 0
    end
    local room, empty = true, nil
    if q then
      room, empty = fits(q.m, q.n)
    end
    if not room then
      break
    end
    -- (Read once served: every call that finds the lock full looks at the head.)
    local turn = place and q and q.p and head ~= skip and redis.call('ZSCORE', K.queue, place)
    local rest = dequeue(head, raw, nil, member)
    if rest then -- the tenant has tasks left: its next turn is at the end of the line
      redis.call('ZADD', K.queue, redis.call('HINCRBY', K.meta, 'qseq', 1), rest)
    end
    if q then
      -- A parked task's lease lasts until its hand-over is published, unclaimed until then.
      local ttl = head == skip and q.t or (q.p or math.min(q.t, q.e))
      fence, expiry = new_lease(head, q.m, ttl, q.o, q.i, now, now_us, empty or false,
        keep_ms, not q.p and q.t or nil)
      if q.p then
        if head == skip then
          redis.call('HDEL', K.meta, 'p:' .. head)
        elseif turn then
          redis.call('HSET', K.meta, 'c:' .. head, '', 't:' .. head, turn)
        else
          redis.call('HSET', K.meta, 'c:' .. head, '')
        end
      end
    end
    if fence and head ~= skip then
      append(out, {head, fence, expiry})
    end
  end
  return out
end

local function wake_one()
  redis.call('RPUSH', K.wake, '1')
  redis.call('PEXPIRE', K.wake, WAKE_MS)
end

-- Nothing held or queued: only the fence mark stays (stale line counts would block newcomers).
local function tidy(keep_ms)
  if no_leases or redis.call('EXISTS', K.leases) == 0 then
    redis.call('HDEL', K.meta, unpack(STATE_FIELDS))
    -- (Never shorter than a pause: the fast path reads its end, 'P', in the meta key.)
    redis.call('PEXPIRE', K.meta, int(math.max(keep_ms, pause_left())))
  end
end

local function hand_on(out, now, now_us, fair, freed, keep_ms)
  if queue_exists() then
    -- Parked tasks are served in order whatever the fairness: no wake-up reaches them.
    if fair or parked_count() > 0 then
      append(out, grant(now, now_us, '', keep_ms))
    elseif freed then
      wake_one()
    end
  else
    if freed and lean_waiting then
      wake_one() -- a waiter refused on the fast path blocks on the wake list, not in line
    end
    tidy(keep_ms)
  end
  return out
end
