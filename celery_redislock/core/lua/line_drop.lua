-- line_drop.lua: a parked task's hand-over will never be claimed (its message was revoked, or
-- expired, and discarded): its lease goes now, rather than at the end of the hand-over window,
-- and the lock is handed on. A hand-over already claimed is left alone (a delivery runs it).
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 the lock's spec (see parse_spec in _lock.lua), 2 the hand-over's token
-- Returns 'dropped granted...' (one string, space-separated): dropped 1 or 0, and token, fence,
--   expiry of each hand-over made (as in release.lua). Run twice, the second drops nothing.

-- #include _grant.lua

local _, _, _, fair, _, keep_ms = parse_spec(ARGV[1])
local tok = ARGV[2]
local now, now_us = server_now()
promote(now)
start(now)
local dropped = 0
if redis.call('ZSCORE', K.leases, tok) and redis.call('HGET', K.meta, 'c:' .. tok) == '' then
  redis.call('HDEL', K.meta, 'p:' .. tok) -- published already: nothing to put back in line
  drop_lease(tok)
  dropped = 1
elseif in_line(tok) then
  -- Still waiting in line (revoked meanwhile): its place goes, and with it the task.
  dequeue(tok)
  redis.call('HDEL', K.meta, 'p:' .. tok)
  dropped = 1
end
return reply(hand_on({dropped}, now, now_us, fair, dropped == 1, keep_ms))
