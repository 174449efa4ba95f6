-- renew.lua: extend many leases (any locks in one cluster slot); a lapsed one is not revived.
-- KEYS: 2i-1 leases, 2i meta of each lease (a fast-path lease is renewed in meta 'L')
-- ARGV: 1 ttl ms (the same for every lease of the call), then the token of each lease
-- Returns one string (quicker to read than thousands): each new expiry (server ms), 0 if lost.
-- #include _lean.lua

local now = server_now()
local ttl = tonumber(ARGV[1])
-- A ttl of slack, so most renewals need not touch the keys; meta outlives the leases key.
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
