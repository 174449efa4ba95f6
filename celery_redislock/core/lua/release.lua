-- release.lua: give back a lease (one reentry level, or all of it) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done (see lockbase.lua)
-- ARGV: 1 token, 2 the lock's spec (see parse_spec in lockbase.lua),
--       3 whole: '1' drops the lease whatever its reentry count (or, for a parked task's token
--         'L...' still in line, its place), '0' one level,
--       4 request id (chosen by the client: run again, the call does not count twice),
--       5 job ('' = none): record it as finished (see finish.lua) in the same step, whether or
--         not the lease was still held, 6 how long to keep that record (ms)
-- Returns 'status left granted...' (one string, space-separated): status 1 released, 0 not held
--   by this token; left the reentry count left;
--   granted is token, fence, expiry of each waiter the lock was handed to (fair mode).
local tok, whole, request = ARGV[1], ARGV[3] == '1', ARGV[4]
local _, _, _, fair, _, keep_ms = parse_spec(ARGV[2])
local now, now_us = server_now()
if (ARGV[5] or '') ~= '' then
  record_done(ARGV[5], tonumber(ARGV[6]), now)
end

-- Fast path: nobody waits and this token holds the lock's only lease, live. Then nothing is
-- purged nor handed on, and the lease is given back in a few calls, before common.lua's
-- helpers are even defined.
if redis.call('EXISTS', K.queue) == 0 then
  local first = redis.call('ZRANGE', K.leases, 0, 1, 'WITHSCORES')
  local rec = first[1] == tok and first[3] == nil and tonumber(first[2]) > now
    and parse_lease(redis.call('HGET', K.meta, 'l:' .. tok))
  if rec then
    if applied(rec, request) then -- this partial release ran before
      return reply({1, rec.c})
    end
    if rec.c > 1 and not whole then
      rec.c = rec.c - 1
      note_request(rec, request)
      write_lease(tok, rec)
      return reply({1, rec.c})
    end
    -- As tidy() (common.lua) leaves a lock nobody holds: only the fence mark (and the last
    -- release ids) is left, for `keep_ms`.
    redis.call('DEL', K.leases)
    local fields = {'l:' .. tok, 'i:' .. tok, 'm', 'qseq', 'qw', 'qp'}
    if string.sub(tok, 1, 1) == LINE_PREFIX then -- a hand-over this task claimed
      fields[#fields + 1] = 'c:' .. tok
    end
    if rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
      fields[#fields + 1] = 'o:' .. rec.o
    end
    redis.call('HDEL', K.meta, unpack(fields))
    note_released(request)
    redis.call('PEXPIRE', K.meta, keep_ms)
    return reply({1, 0})
  end
end

-- #include common

start(now)
local status, left = 0, 0
local expiry = redis.call('ZSCORE', K.leases, tok)
if expiry and tonumber(expiry) > now then
  status = 1
  local rec = read_lease(tok)
  if applied(rec, request) then -- this partial release ran before
    return reply({1, rec.c})
  end
  if rec.c > 1 and not whole then
    rec.c = rec.c - 1
    left = rec.c
    note_request(rec, request)
    write_lease(tok, rec)
  else
    drop_lease(tok, rec)
    note_released(request)
  end
elseif was_released(request) then -- this very release ran before
  return reply({1, 0})
elseif whole and string.sub(tok, 1, 1) == LINE_PREFIX and redis.call('ZSCORE', K.queue, tok) then
  -- A park whose reply was lost (the caller gave up on it): its entry leaves the line.
  dequeue(tok)
  redis.call('HDEL', K.meta, 'p:' .. tok)
end
return reply(hand_on({status, left}, now, now_us, fair, status == 1 and left == 0, keep_ms))
