-- redlock_fence.lua: a RedLock lease's fence, agreed over the masters that granted it: raises
-- this master's fence mark, and the lease's own record, to the highest fence any of them gave,
-- so that a later acquisition on any majority (which shares a master with this one) gets a
-- higher fence. Running it twice changes nothing more.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants
--   (see _lock.lua; only 1 and 2 touched)
-- ARGV: 1 token, 2 fence
-- Returns 1 if the lease is live here (its fence and the mark are now at least ARGV[2]), 0 if
--   it is not (expired or gone).

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
