-- _grant.lua (a part, not a script; see scripts.py): the lock handed on to those in line when
-- leases are freed or the line moves.
-- Defines: runtime_cap, lock_paused, forget_runtime_limits, limits_present,
-- read_runtime_limits, pause_left, fits, line_head, grant, wake_one, tidy, hand_on.

-- #include _line.lua

-- What is set at runtime for the name (K.limits), read once per call, in one HMGET:
-- runtime_cap, a cap (redislock limit set NAME --cap N), false none; lock_paused, the server ms
-- until which the lock hands out no new lease (redislock pause NAME SECONDS; 0 or a time past:
-- not paused). nil: not read yet.
local runtime_cap = nil
local lock_paused = nil

-- Forgets what this call read of the runtime limits (a script that works on several locks,
-- acquire_all.lua, calls it as it turns from one lock to the next).
local function forget_runtime_limits()
  runtime_cap, lock_paused = nil, nil
end

-- What the caller learnt already of K.limits (an EXISTS it ran anyway): `present` false, the
-- key does not exist, so there is nothing to read (no cap, no pause) and nothing is asked.
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

-- The ms left of the lock's pause at the call's time (0: not paused). While paused, no new
-- lease is handed out by any path (fits refuses); leases held keep renewing and releasing,
-- and an owner's re-entry into its own live lease is no new lease.
local function pause_left()
  read_runtime_limits()
  return lock_paused > call_ms and lock_paused - call_ms or 0
end

-- Whether a new lease of `mode` fits beside the live ones; never while the lock is paused.
-- Limit 0 means unbounded, and a limit of 2 or more (a cap in code) gives way to a cap set at
-- runtime. A second answer true: the lock has no lease at all.
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
  -- The count first: a full lock needs no look at the mode.
  return (limit == 0 or n < limit) and redis.call('HGET', K.meta, 'm') == mode
end

-- A tenant's place at the head of the line stands for the tenant's first task (highest
-- priority, then first come); once that task is served the place goes to the end of the line
-- (a new arrival number) while the tenant has tasks left. The turn it was served at is kept
-- ('t:') for the task to go back to if its hand-over lapses unpublished.

-- The head of the line: a waiter's token; or, for a tenant's place, its first task's token,
-- member in K.tenants and the place. (A place with no task left is never kept; one found
-- anyway is dropped, not served.)
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

-- Fair mode: hands free capacity to waiters strictly in arrival order. Returns a flat list of
-- token, fence, expiry for each grant, so the caller can wake exactly those waiters. A lease
-- handed to a waiter lasts no longer than its place in line would have: a waiter that died in
-- line holds the lock for seconds, not a whole ttl; a live one claims the full ttl on waking.
-- The waiter `skip` is the caller itself, alive by definition: it gets its full ttl, and no
-- entry in the list. `skip_raw`: the caller's own entry record, when it wrote it in this call.
local function grant(now, now_us, skip, keep_ms, skip_raw)
  local out = {}
  while true do
    local head, member, place = line_head()
    if not head then
      break
    end
    local raw = head == skip and skip_raw or redis.call('HGET', K.meta, 'q:' .. head)
    local q = raw and cjson.decode(raw)
    -- A waiter whose owner holds a lease already (another call of the same owner was served
    -- first) gets no second lease: it leaves the line and is woken with none (fence 0), to try
    -- again and re-enter the owner's lease (or be refused, reentrant=False) as any call of an
    -- owner holding one. Capacity is not its concern, so this comes first.
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
    -- (The turn it is served at, read only once it is served: the head is looked at on every
    -- call that finds the lock full.)
    local turn = place and q and q.p and head ~= skip and redis.call('ZSCORE', K.queue, place)
    local rest = dequeue(head, raw, nil, member)
    if rest then -- the tenant has tasks left: its next turn is at the end of the line
      redis.call('ZADD', K.queue, redis.call('HINCRBY', K.meta, 'qseq', 1), rest)
    end
    if q then
      -- A parked task's lease lasts until its hand-over is published (line_sent.lua extends
      -- it until the task starts); unclaimed ('c:' empty) until then.
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

-- Non-fair mode: one signal wakes the longest-blocked waiter, which then competes for the lock.
local function wake_one()
  redis.call('RPUSH', K.wake, '1')
  redis.call('PEXPIRE', K.wake, WAKE_MS)
end

-- After a release: once nothing is held or queued, only the fence mark (and the tokens last
-- released) is left, for `keep_ms` (Redis drops the emptied sorted sets by itself). With no
-- line, no count of queued writers or parked tasks can be right but 0: a stale one would keep
-- newcomers out of free capacity.
local function tidy(keep_ms)
  if no_leases or redis.call('EXISTS', K.leases) == 0 then
    redis.call('HDEL', K.meta, unpack(STATE_FIELDS))
    -- (Never shorter than a pause: the fast path reads its end, 'P', in the meta key.)
    redis.call('PEXPIRE', K.meta, int(math.max(keep_ms, pause_left())))
  end
end

-- After leases were dropped: hands the lock on to waiters (fair: granted in order, appended to
-- `out` as token, fence, expiry; else one wake-up if anything was freed), or, when nobody
-- waits, lets the keys go once nothing is held. Returns `out`.
local function hand_on(out, now, now_us, fair, freed, keep_ms)
  if queue_exists() then
    -- Parked tasks are served in arrival order whatever the lock's fairness: no wake-up
    -- reaches them, and newcomers queue behind them.
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
