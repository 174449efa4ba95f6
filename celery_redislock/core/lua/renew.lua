-- renew.lua: extend many leases in one call; a lease that has expired or is gone is not revived.
-- Not built on _lock.lua: its keys are those of any number of locks (all in one cluster slot).
-- KEYS: leases and meta key of each lease, in pairs: 2i-1 leases, 2i meta
-- A lease taken on the fast path lives in its meta hash ('L', see _lean.lua): it is renewed
-- there, and the meta key made to outlive it.
-- ARGV: 1 ttl ms (the same for every lease of the call), then the token of each lease
-- Returns one string, space-separated: each lease's new expiry (server ms), or 0 when it is lost
-- (one reply element, quicker to read than thousands).

-- #include _lean.lua

local now = server_now()
local ttl = tonumber(ARGV[1])
-- Keys are given a ttl of slack beyond the lease, so most renewals need not touch them; the meta
-- key outlives the leases key (keep_lease_keys in _lease.lua), so it is looked at only when the
-- leases key is extended.
local keep = ttl
local out = {}
for i = 1, #ARGV - 1 do
  local leases, meta, tok = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  local lean = redis.call('HMGET', meta, 'L', 'E')
  local ltok, lexp, lfence, lcount, lowner, requests
  if lean[1] and lean[1] ~= '' then
    ltok, lexp, lfence, lcount, lowner, requests = parse_lean(lean[1])
  end
  local current = ltok ~= tok and redis.call('ZSCORE', leases, tok)
  if ltok == tok then
    if tonumber(lexp) > now then
      local expiry = math.max(tonumber(lexp), now + ttl)
      local need = expiry + GRACE_MS
      if lean[2] and tonumber(lean[2]) >= need then
        redis.call('HSET', meta, 'L', lean_record(ltok, expiry, lfence, lcount, lowner, requests))
      else
        redis.call('HSET', meta, 'L', lean_record(ltok, expiry, lfence, lcount, lowner, requests),
          'E', int(need + keep))
        redis.call('PEXPIRE', meta, int(need + keep - now))
      end
      out[i] = expiry
    else
      out[i] = 0
    end
  elseif current and tonumber(current) > now then
    local expiry = math.max(tonumber(current), now + ttl)
    redis.call('ZADD', leases, int(expiry), tok)
    local need = expiry - now + GRACE_MS
    if redis.call('PTTL', leases) < need then
      redis.call('PEXPIRE', leases, int(need + keep))
      if redis.call('PTTL', meta) < need + keep then
        redis.call('PEXPIRE', meta, int(need + keep))
      end
    end
    out[i] = expiry
  else
    out[i] = 0
  end
end
-- Expiries are integers below 1e14 ms (year 5138): concat writes them exactly (%.14g).
return table.concat(out, ' ')
