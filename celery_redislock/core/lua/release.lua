-- release.lua: give back a lease (one reentry level, or all of it) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done (see common.lua)
-- ARGV: 1 token, 2 the lock's spec (see parse_spec in common.lua),
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

-- Fast path: nobody waits, so nothing is handed on; a live lease of this token is given back
-- in a few calls.
local fast = not queue_exists()
if fast and purge_leases(now) then
  fast = false -- a lapsed hand-over put a parked task back in line: hand the lock on below
end
if fast then
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry and tonumber(expiry) > now then
    local rec = read_lease(tok)
    if applied(rec, request) then -- this partial release ran before
      return reply({1, rec.c})
    end
    if rec.c > 1 and not whole then
      rec.c = rec.c - 1
      note_request(rec, request)
      write_lease(tok, rec)
      return reply({1, rec.c})
    end
    redis.call('ZREM', K.leases, tok)
    local fields = {'l:' .. tok, 'i:' .. tok}
    if string.sub(tok, 1, 1) == LINE_PREFIX then -- a hand-over this task claimed
      fields[#fields + 1] = 'c:' .. tok
    end
    if rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
      fields[#fields + 1] = 'o:' .. rec.o
    end
    local empty = redis.call('EXISTS', K.leases) == 0
    if empty then -- as tidy() does: only the fence mark (and the last release ids) is left
      fields[#fields + 1] = 'm'
      fields[#fields + 1] = 'qseq'
      fields[#fields + 1] = 'qw'
      fields[#fields + 1] = 'qp'
    end
    redis.call('HDEL', K.meta, unpack(fields))
    note_released(request)
    if empty then
      redis.call('PEXPIRE', K.meta, keep_ms)
    end
    return reply({1, 0})
  end
else
  start(now)
end
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
