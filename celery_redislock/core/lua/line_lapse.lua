-- line_lapse.lua: hand-overs their caller cannot publish (it has no publisher: an operator's
-- release from a command that knows no framework, a lock made without a handover). Each short
-- lease handed to a parked task lapses now rather than at the end of the publish window: the
-- next call on the lock, or a worker's sweeper within its interval, puts the task back at its
-- place at the head of the line and hands it over again, publishing it. Newcomers meanwhile
-- find the parked task in line first, as they would have found its hand-over.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua; only leases is
--   written)
-- ARGV: token, fence of each hand-over (the fence tells this hand-over from a later one made to
--   the same entry, which this call must leave alone)
-- Returns the number of hand-overs lapsed. Run twice, the second run finds the same leases
-- lapsed already (or gone, or handed over anew under another fence) and changes nothing.

-- #include _lease.lua

local now = server_now()
promote(now)
local lapsed = 0
for i = 1, #ARGV, 2 do
  local tok, fence = ARGV[i], ARGV[i + 1]
  local rec = read_lease(tok)
  -- Unclaimed ('c:' empty) and unpublished (its payload still here): nobody else publishes it
  -- before the lease lapses.
  if rec and rec.f == fence and redis.call('HGET', K.meta, 'c:' .. tok) == ''
    and redis.call('HGET', K.meta, 'p:' .. tok) then
    local expiry = redis.call('ZSCORE', K.leases, tok)
    if expiry and tonumber(expiry) > now then
      redis.call('ZADD', K.leases, int(now), tok)
    end
    lapsed = lapsed + 1
  end
end
return lapsed
