-- acquire.lua: take a lease, re-enter one, or wait in line for one.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 token (chosen by the client: run again with the same token, this call returns the
--         lease it made, never a second one nor a second re-entry),
--       2 the lock's spec 'mode limit ttl fair entry keep' (see parse_spec in _lock.lua),
--       3 this call's flags 'wait woke once park': wait 1 = stay queued on failure, woke 1 = the
--         caller was woken by a signal, once 1 = an owner holding a live lease is refused instead
--         of re-entering, park 1 = a task that finds the lock taken is parked in the task line
--         (all 0 | 1, e.g. '1000'),
--       4 owner ('' = none), 5 info (JSON object, stored as given),
--       6 job ('' = none): refuse with status 2 if this job is recorded as finished (finish.lua),
--       7 claim id ('' = none; chosen per call): a lease handed to a parked task (token
--         'L...') is claimed by the first call that comes with its token; a call with another
--         claim id is refused as status 3 (another delivery of the same hand-over holds it),
--       park = 1 only: 8 payload (stored as given, published again on hand-over),
--         9 wait ms (the entry's deadline), 10 max parked entries (0 = unbounded),
--         11 publish ms (how long a lease handed to it lasts until the hand-over is published),
--         12 tenant ('' or absent = none): 24 hex, the tenant's id (16) and the priority
--         within it (8, 0 the highest), see _line.lua: parked tasks with a tenant are served
--         tenant by tenant in turn
-- Returns 'status token fence expiry count next mode granted...' (one string, space-separated):
--   expiry in server ms, count the reentry count, next the ms until the earliest lease expires
--   or the lock's pause ends, whichever comes first (0: neither), mode the held lease's mode;
--   status 1 held, 0 not held (queued when wait = 1), -1 read-to-write upgrade refused,
--   2 the job is finished already, 3 not held: the owner holds a live lease (once = 1; next is
--   then the ms that lease has left), 4 parked (count = the parked entries in line),
--   5 not parked: the line is full (count = the parked entries);
--   granted is token, fence, expiry of other waiters this call handed the lock to (fair mode).

-- #include _lock.lua

local tok, owner, info, job = ARGV[1], ARGV[4], ARGV[5], ARGV[6]
local mode, limit, ttl, fair, entry_ms, keep_ms = parse_spec(ARGV[2])
local wait, woke = string.sub(ARGV[3], 1, 1) == '1', string.sub(ARGV[3], 2, 2) == '1'
local once, park = string.sub(ARGV[3], 3, 3) == '1', string.sub(ARGV[3], 4, 4) == '1'
local claim_id = ARGV[7] or ''
local now, now_us = server_now()
promote(now)

-- Whether job `job` is recorded as finished (finish.lua).
local function job_done()
  if job == '' then
    return false
  end
  local until_ms = redis.call('ZSCORE', K.done, job)
  return until_ms and tonumber(until_ms) > now
end

-- Fast path: no lease (not even a lapsed one), nobody waits, and nothing is set at runtime for
-- the name (no cap, no pause: a paused lock takes the path below, where fits refuses). Then
-- this token has no lease yet (a second run of this call finds the first run's lease and takes
-- the path below), the owner holds none, and the lease is taken at once, in fair mode too (an
-- empty line), before the other parts are included (defining their helpers costs each run
-- about as much as a few Redis commands). The fence still follows the fence mark (put_lease).
-- One EXISTS says which of the three keys exist: it counts a key once per time it is named
-- (leases 1, queue 2, limits 4: see keys_present in _line.lua).
local present = redis.call('EXISTS', K.leases, K.queue, K.queue, K.limits, K.limits, K.limits,
  K.limits)
if present == 0 then
  if job_done() then
    return reply({2, '-', 0, 0, 0, 0, mode})
  end
  local fence, expiry = put_lease(tok, mode, ttl, owner, info, now, now_us)
  if claim_id ~= '' then -- a parked task's token: this call's delivery holds it (see held())
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id)
  end
  -- Nothing else lives in the lock's keys now: the meta key (the fence mark) is set to live
  -- `keep_ms` from this use (at least as long as the lease), as tidy() sets it after the last
  -- release; the leases key is new. (What new_lease does with keep_lease_keys, without its PTTL:
  -- no other life in these keys needs keeping.)
  local need = ttl + GRACE_MS
  redis.call('PEXPIRE', K.meta, int(math.max(need + ttl, keep_ms)))
  redis.call('PEXPIRE', K.leases, need + ttl)
  return reply({1, tok, fence, expiry, 1, 0, mode})
end

-- #include _grant.lua
-- #include _wait.lua

keys_present(present)
limits_present(present >= 4)
local waiters = start(now)

local function held(token, fence, expiry, count, granted, lease_mode)
  -- A lease under a parked task's token is held by the delivery that took it: another delivery
  -- coming with the same token (the hand-over published twice) must not take it as its own.
  -- (HGET then HSET rather than HSETNX: only the commands the docs list for ACL users.)
  if token == tok and claim_id ~= '' and redis.call('HGET', K.meta, 'c:' .. tok) == false then
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id)
  end
  return reply(append({1, token, fence, expiry, count, 0, lease_mode or mode}, granted))
end

-- `status` 0 not held, 4 parked, 5 the line is full; `count` the parked entries (4, 5).
local function not_held_as(status, count, granted)
  if queue_exists() then
    keep_waiters(entry_ms)
  else
    tidy(keep_ms)
  end
  return reply(append({status, '-', 0, 0, count, next_expiry(now), mode}, granted))
end

local function not_held(granted)
  return not_held_as(0, 0, granted)
end

-- This very call ran before (its reply was lost and the client sent it again), or, in fair mode,
-- the lock was handed to us while we waited (our wake-up is late, or its sender died): the lease
-- is ours. A lease handed over in fair mode is claimed for the full ttl.
local mine_at = lease_expiry(tok)
if mine_at then
  local expiry = tonumber(mine_at)
  -- A lease handed to a parked task: the first delivery of the hand-over claims it (and the
  -- full ttl); a second delivery of it (the hand-over published twice) is refused as another
  -- copy holding it.
  local claim = is_parked_token(tok) and redis.call('HGET', K.meta, 'c:' .. tok)
  if claim and claim ~= claim_id then
    local rec = read_lease(tok)
    if claim ~= '' then
      return reply({3, tok, rec.f, 0, rec.c, expiry - now, rec.m})
    end
    -- The claimant's info replaces the parker's: a parent releasing a dead process's leases
    -- (release_where by pid) must find the process that runs the task now.
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id, 'i:' .. tok, info)
    redis.call('HDEL', K.meta, 'p:' .. tok)
    -- The ttl from now, not the rest of the hand-over window: a claimant that dies at once
    -- holds the lock a ttl, as any holder (its heartbeat renews it meanwhile).
    expiry = now + ttl
    redis.call('ZADD', K.leases, int(expiry), tok)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
    return held(tok, rec.f, expiry, rec.c, {}, rec.m)
  end
  if fair and expiry < now + ttl then
    expiry = now + ttl
    redis.call('ZADD', K.leases, int(expiry), tok)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
  end
  local rec = read_lease(tok)
  return held(tok, rec.f, expiry, rec.c, {}, rec.m)
end

if job_done() then
  return reply({2, '-', 0, 0, 0, 0, mode})
end

-- The owner's lease answers this call (re-entry, or a refusal) while this call may still have a
-- place in line from an earlier try of the same blocking acquire: that place goes now, or it
-- would hold up the line (a queued writer blocks readers) until its deadline. The line then
-- advances as it would have if the waiter had left.
-- This call's own entry in line, when it is a plain caller's, need not be read (see dequeue).
local own = not park and not is_parked_token(tok) and mode or nil

-- Whether this call has a place in line (a parked task with a tenant has none of its own in
-- the queue: its record says it waits).
local function placed_in_line()
  if is_parked_token(tok) then
    return in_line(tok)
  end
  return redis.call('ZSCORE', K.queue, tok) ~= false
end

local function leave_line()
  if not (waiters and placed_in_line()) then
    return {}
  end
  dequeue(tok, nil, own)
  if fair then
    return grant(now, now_us, tok, keep_ms)
  end
  if queue_exists() then
    wake_one()
  end
  return {}
end

if owner ~= '' then
  local mine = redis.call('HGET', K.meta, 'o:' .. owner)
  -- (Its expiry, read once: nothing below changes it before it is used.)
  local mine_expiry = mine and lease_expiry(mine)
  if mine_expiry then
    mine_expiry = tonumber(mine_expiry)
    local rec = read_lease(mine)
    local granted = leave_line()
    if applied(rec, tok) then -- this re-entry ran before: it counts once
      return held(mine, rec.f, mine_expiry, rec.c, granted, rec.m)
    end
    if once then -- the owner holds a lease already: say so, with the ms it has left
      local left = mine_expiry - now
      return reply(append({3, mine, rec.f, 0, rec.c, left, rec.m}, granted))
    end
    if rec.m == 'r' and mode == 'w' then
      return reply(append({-1, mine, rec.f, 0, rec.c, 0, rec.m}, granted))
    end
    rec.c = rec.c + 1
    note_request(rec, tok)
    write_lease(mine, rec)
    local expiry = math.max(mine_expiry, now + ttl)
    redis.call('ZADD', K.leases, int(expiry), mine)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
    return held(mine, rec.f, expiry, rec.c, granted, rec.m)
  end
end

if park then
  local parked = waiters and parked_count() or 0
  -- A task that may not run now leaves its worker and waits in line as data: it is published
  -- again when the lock is handed to it. A lock with nobody parked and room is taken as any
  -- newcomer would take it (non-fair); otherwise the task joins the line behind everyone.
  local own_raw = nil -- this call's entry record, when it wrote it
  local tenant = ARGV[12] or ''
  if tenant == '' then
    tenant = nil
  elseif not string.match(tenant, '^' .. string.rep('%x', 24) .. '$') then
    return redis.error_reply('acquire: the tenant must be 24 hex digits, got ' .. tenant)
  end
  if not placed_in_line() then
    if not fair and parked == 0 then
      local writer_waits = mode == 'r' and tonumber(redis.call('HGET', K.meta, 'qw') or '0') or 0
      local room, empty = fits(mode, limit)
      if room and writer_waits == 0 then
        local fence, expiry = new_lease(tok, mode, ttl, owner, info, now, now_us, empty or false,
          keep_ms)
        return held(tok, fence, expiry, 1, {})
      end
    end
    local most = tonumber(ARGV[10])
    if most > 0 and parked >= most then
      return not_held_as(5, parked, {})
    end
    local wait_ms = tonumber(ARGV[9])
    local seq, raw = enqueue(tok, mode, limit, ttl, owner, info, entry_ms, tonumber(ARGV[11]),
      tenant)
    own_raw = raw
    redis.call('ZADD', K.qdl, int(now + wait_ms), tok)
    redis.call('HSET', K.meta, 'p:' .. tok,
      cjson.encode({s = seq, d = int(now + wait_ms), q = raw, x = ARGV[8]}))
    -- The line outlives the wait by the fence mark's keep (a day by default): with every
    -- worker down past the deadline, nobody purges the entry, and a sweep must still find it
    -- to publish it as expired when one comes back (the payload is the only copy of the task).
    keep({K.meta, K.queue, K.qdl}, wait_ms + keep_ms, entry_ms)
    if tenant then
      keep({K.tenants}, wait_ms + keep_ms, entry_ms)
    end
  end
  local granted = grant(now, now_us, tok, keep_ms, own_raw)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry then
    return held(tok, read_lease(tok).f, tonumber(expiry), 1, granted)
  end
  return not_held_as(4, parked_count(), granted)
end

if fair then
  -- Join the line (or refresh our place), let the line advance, and see whether we got it.
  local own_raw = nil -- this call's entry record, when it wrote it
  if not redis.call('ZSCORE', K.queue, tok) then
    local _, raw = enqueue(tok, mode, limit, ttl, owner, info, entry_ms)
    own_raw = raw
  end
  redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
  local granted = grant(now, now_us, tok, keep_ms, own_raw)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry then
    return held(tok, read_lease(tok).f, tonumber(expiry), 1, granted)
  end
  if not wait then
    dequeue(tok, nil, own)
    append(granted, grant(now, now_us, tok, keep_ms))
  end
  return not_held(granted)
end

-- Non-fair: take free capacity, except that readers yield to a queued writer and everyone to
-- a parked task.
local queued = waiters and redis.call('ZSCORE', K.queue, tok)
local room, empty = fits(mode, limit)
-- Readers yield to a queued writer, everyone to a parked task: asked only when there is room.
if room and (tonumber(mode == 'r' and redis.call('HGET', K.meta, 'qw') or '0') or 0) == 0
  and (not waiters or parked_count() == 0) then
  if queued then
    dequeue(tok, nil, own)
  end
  local fence, expiry = new_lease(tok, mode, ttl, owner, info, now, now_us, empty or false,
    keep_ms)
  -- Readers may share: pass the wake-up on so queued readers follow (a lock of one holder is
  -- full now, without asking).
  if waiters and limit ~= 1 and fits(mode, limit) and queue_exists() then
    wake_one()
  end
  return held(tok, fence, expiry, 1, {})
end
if wait then
  if not queued then
    enqueue(tok, mode, limit, ttl, owner, info, entry_ms)
  end
  redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
elseif queued then
  dequeue(tok, nil, own)
end
-- A waiter woken for a free lock it may not take (a writer is queued) passes the signal on;
-- not while the lock is paused (nobody may take it: the waiters would wake each other in turn
-- until the pause ends; each looks again by itself when it ends, see next_expiry).
if woke and lease_count() == 0 and pause_left() == 0 and queue_exists() then
  wake_one()
end
return not_held({})
