-- line_lapse.lua: hand-overs nobody can publish lapse now: the task is put back, handed over anew.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (only leases is written)
-- ARGV: token, fence of each hand-over (the fence tells it from a later one to the same entry)
-- Returns the number of hand-overs lapsed. Run twice, the second changes nothing.
-- #include _lease.lua

local now = server_now()
promote(now)
local lapsed = 0
for i = 1, #ARGV, 2 do
  local tok, fence = ARGV[i], ARGV[i + 1]
  local rec = read_lease(tok)
  -- Unclaimed and unpublished (payload still here): nobody else publishes it before it lapses.
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
