-- line_sweep.lua: look after a lock's task line when nobody else touches the lock: purge what
-- lapsed (a hand-over whose publisher died puts its task back in line; a parked task past its
-- wait deadline leaves the line as expired) and hand free capacity to the parked tasks in order.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 the lock's spec (see parse_spec in _lock.lua)
-- Returns 'parked leases expired tokens... granted...' (one string, space-separated): the
--   parked entries left in line, the leases on the lock, the number of expired entries and
--   their tokens (to publish as expired, then line_sent.lua), and token, fence, expiry of each
--   hand-over made (as in release.lua).
-- Run twice, it hands over nothing twice: the second run finds the grants made.

-- #include _grant.lua

local _, _, _, fair, _, keep_ms = parse_spec(ARGV[1])
local now, now_us = server_now()
promote(now)
start(now)
local granted = hand_on({}, now, now_us, fair, false, keep_ms)
local out = {parked_count(), redis.call('ZCARD', K.leases), 0}
local expired = redis.call('HGET', K.meta, 'x')
if expired then
  for tok in string.gmatch(expired, '%S+') do
    out[#out + 1] = tok
    out[3] = out[3] + 1
  end
end
return reply(append(out, granted))
