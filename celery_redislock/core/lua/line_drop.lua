-- line_drop.lua: a hand-over never to be claimed (message revoked or expired) goes; claimed, stays.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 spec, 2 the hand-over's token
-- Returns 'dropped granted...' (1 or 0, then hand-overs as in release.lua); dropped once.
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
