-- redlock_fence.lua: lift mark and lease fence to the masters' highest: later majorities go higher.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (only 1 and 2 touched)
-- ARGV: 1 token, 2 fence
-- Returns 1 if the lease is live here (its fence and the mark now at least ARGV[2]), else 0.
-- #include _lease.lua

local tok, fence = ARGV[1], ARGV[2]
local now = server_now()
promote(now)
local expiry = redis.call('ZSCORE', K.leases, tok)
local rec = read_lease(tok)
if not expiry or tonumber(expiry) <= now or not rec then
  return 0
end
if tonumber(rec.f) < tonumber(fence) then
  rec.f = fence
  write_lease(tok, rec)
end
if tonumber(redis.call('HGET', K.meta, 'fence') or '0') < tonumber(fence) then
  redis.call('HSET', K.meta, 'fence', fence)
end
return 1
