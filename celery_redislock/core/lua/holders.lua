-- holders.lua: the live leases of one lock, read atomically with the server's clock.
-- KEYS: 1 leases, 2 meta
-- ARGV: none
-- Returns {now ms, then per live lease: token, expiry ms, record (see _lock.lua), info (JSON)}.
-- #include _lean.lua

local now = server_now()
local out = {now}
local lean = redis.call('HMGET', KEYS[2], 'L', 'I')
if lean[1] and lean[1] ~= '' then
  local tok, expiry, fence, count, owner, requests = parse_lean(lean[1])
  if tonumber(expiry) > now then
    out[#out + 1] = tok
    out[#out + 1] = tonumber(expiry)
    out[#out + 1] = 'w|' .. count .. '|' .. fence .. '|' .. requests .. '|' .. owner
    out[#out + 1] = lean[2] or '{}'
  end
end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(now), '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local rec = redis.call('HGET', KEYS[2], 'l:' .. live[i])
  if rec then
    out[#out + 1] = live[i]
    out[#out + 1] = tonumber(live[i + 1])
    out[#out + 1] = rec
    out[#out + 1] = redis.call('HGET', KEYS[2], 'i:' .. live[i]) or '{}'
  end
end
return out
