-- release.lua: give back a lease (one reentry level, or all of it) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 token, 2 spec, 3 whole ('1' the lease or a parked task's place, '0' one level),
--   4 request id (run again, it counts once), 5 job ('' none): recorded finished, 6 for ms
-- Returns 'status left granted...': 1 released, 0 not held; left the reentry count left;
--   granted: token, fence, expiry of each waiter handed the lock (fair mode).
-- #include _lease.lua

local tok, whole, request = ARGV[1], ARGV[3] == '1', ARGV[4]
local _, _, _, fair, _, keep_ms = parse_spec(ARGV[2])
local now, now_us = server_now()
if (ARGV[5] or '') ~= '' then
  record_done(ARGV[5], tonumber(ARGV[6]), now)
end

-- The reentry count left while the lease stays, and whether this ran before; nil: it goes.
local function release_level(rec)
  if applied(rec, request) then
    return rec.c, true
  end
  if rec.c > 1 and not whole then
    rec.c = rec.c - 1
    note_request(rec, request)
    write_lease(tok, rec)
    return rec.c, false
  end
  return nil
end

-- Fast path: no line, no runtime limits (a pause's mark must outlive it: tidy sees to that),
-- this token's only, live lease: given back before the other helpers are defined.
local present = redis.call('EXISTS', K.queue, K.limits, K.limits)
if present == 0 then
  local first = redis.call('ZRANGE', K.leases, 0, 1, 'WITHSCORES')
  local rec = first[1] == tok and first[3] == nil and tonumber(first[2]) > now
    and read_lease(tok)
  if rec then
    local left = release_level(rec)
    if left then
      return reply({1, left})
    end
    redis.call('DEL', K.leases)
    redis.call('HDEL', K.meta, unpack(append(lease_fields(tok, rec), STATE_FIELDS)))
    note_released(request)
    redis.call('PEXPIRE', K.meta, keep_ms)
    return reply({1, 0})
  end
end

-- #include _grant.lua

-- A lean lease moves to the leases key (not before the fast path: a lease there means none here).
promote(now)
limits_present(present >= 2)
queue_present(present % 2 == 1)
start(now)
local status, left = 0, 0
local expiry = redis.call('ZSCORE', K.leases, tok)
if expiry and tonumber(expiry) > now then
  status = 1
  local rec = read_lease(tok)
  local level, again = release_level(rec)
  if again then
    return reply({1, level})
  end
  if level then
    left = level
  else
    drop_lease(tok, rec)
    note_released(request)
  end
elseif was_released(request) then -- this very release ran before
  return reply({1, 0})
elseif whole and is_parked_token(tok) and in_line(tok) then
  -- A park whose reply was lost (the caller gave up): its entry leaves the line.
  dequeue(tok)
  redis.call('HDEL', K.meta, 'p:' .. tok)
end
return reply(hand_on({status, left}, now, now_us, fair, status == 1 and left == 0, keep_ms))
