-- line_sweep.lua: purge a lock's task line and hand free room to its parked tasks in order.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 spec
-- Returns 'parked leases expired tokens... granted...': the expired entries' tokens to publish
--   (then line_sent.lua); hand-overs as in release.lua, never made twice.
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
