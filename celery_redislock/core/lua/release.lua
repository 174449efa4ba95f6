-- release.lua: give back a lease (one reentry level, or all of it) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 token, 2 the lock's spec (see parse_spec in _lock.lua),
--       3 whole: '1' drops the lease whatever its reentry count (or, for a parked task's token
--         'L...' still in line, its place), '0' one level,
--       4 request id (chosen by the client: run again, the call does not count twice),
--       5 job ('' = none): record it as finished (see finish.lua) in the same step, whether or
--         not the lease was still held, 6 how long to keep that record (ms)
-- Returns 'status left granted...' (one string, space-separated): status 1 released, 0 not held
--   by this token; left the reentry count left;
--   granted is token, fence, expiry of each waiter the lock was handed to (fair mode).

-- #include _lease.lua

local tok, whole, request = ARGV[1], ARGV[3] == '1', ARGV[4]
local _, _, _, fair, _, keep_ms = parse_spec(ARGV[2])
local now, now_us = server_now()
if (ARGV[5] or '') ~= '' then
  record_done(ARGV[5], tonumber(ARGV[6]), now)
end

-- Gives back one level of this token's lease (its record `rec`), unless the call is `whole` or
-- the lease is held once. Returns the reentry count left while the lease stays, and whether this
-- very partial release ran before (it counts once); nil when the lease itself is to go.
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

-- Fast path: nobody waits, nothing is set at runtime for the name (a pause's mark must outlive
-- it: tidy sees to that), and this token holds the lock's only lease, live. Then nothing is
-- purged nor handed on, and the lease is given back in a few calls, before the other helpers
-- are even defined. The same EXISTS says which of the two keys exist (limits 2, the queue 1: it
-- counts a key once per time it is named), for the hand-over below.
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
    -- As drop_lease then tidy() (_line.lua, _grant.lua) leave a lock nobody holds, in fewer
    -- calls: only the fence mark (and the last release ids) is left, for `keep_ms`.
    redis.call('DEL', K.leases)
    redis.call('HDEL', K.meta, unpack(append(lease_fields(tok, rec), STATE_FIELDS)))
    note_released(request)
    redis.call('PEXPIRE', K.meta, keep_ms)
    return reply({1, 0})
  end
end

-- #include _grant.lua

-- A lease the fast path took (see _lean.lua) is moved into the leases key first: this token's
-- (a release that records a job, or one sent after the layout was switched back), or another's
-- that the hand-over must see. (Not before the fast path above: a lease there means none here.)
promote(now)

-- (The fast path's EXISTS said whether the line and the limits exist: not asked again.)
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
  -- A park whose reply was lost (the caller gave up on it): its entry leaves the line.
  dequeue(tok)
  redis.call('HDEL', K.meta, 'p:' .. tok)
end
return reply(hand_on({status, left}, now, now_us, fair, status == 1 and left == 0, keep_ms))
