-- release.lua: give back a lease (one reentry level, or all of it) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake (see common.lua)
-- ARGV: 1 token, 2 flags 'fair whole' (each 0 | 1, e.g. '10'): fair mode; whole = drop the
--       lease whatever its reentry count
-- Returns 'status left granted...' (one string, space-separated): status 1 released, 0 not held
--   by this token; left the reentry count left;
--   granted is token, fence, expiry of each waiter the lock was handed to (fair mode).
local tok = ARGV[1]
local fair, whole = string.sub(ARGV[2], 1, 1) == '1', string.sub(ARGV[2], 2, 2) == '1'
local now, now_us = server_now()
start(now)
local status, left = 0, 0
local expiry = redis.call('ZSCORE', K.leases, tok)
if expiry and tonumber(expiry) > now then
  status = 1
  local rec = read_lease(tok)
  if rec.c > 1 and not whole then
    rec.c = rec.c - 1
    left = rec.c
    write_lease(tok, rec)
  else
    drop_lease(tok)
  end
end
return reply(hand_on({status, left}, now, now_us, fair, status == 1 and left == 0))
