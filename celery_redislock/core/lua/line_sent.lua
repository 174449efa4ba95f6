-- line_sent.lua: parked tasks published: payloads go, unclaimed leases last the hand-over window.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 hand-over window ms, 2... the tokens published
-- Returns the number of leases extended. Run twice, the same leases to the same end.
-- #include _line.lua

local now = server_now()
promote(now)
local window = tonumber(ARGV[1])
local expired = redis.call('HGET', K.meta, 'x')
local left = {}
local sent = {}
for i = 2, #ARGV do
  sent[ARGV[i]] = true
end
if expired then
  for tok in string.gmatch(expired, '%S+') do
    if not sent[tok] then
      left[#left + 1] = tok
    end
  end
  if #left > 0 then
    redis.call('HSET', K.meta, 'x', table.concat(left, ' '))
  else
    redis.call('HDEL', K.meta, 'x')
  end
end
local extended = 0
for i = 2, #ARGV do
  local tok = ARGV[i]
  redis.call('HDEL', K.meta, 'p:' .. tok)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry and redis.call('HGET', K.meta, 'c:' .. tok) == '' then
    local until_ms = now + window
    if tonumber(expiry) < until_ms then
      redis.call('ZADD', K.leases, int(until_ms), tok)
      keep_lease_keys(window + GRACE_MS, window)
    end
    extended = extended + 1
  end
end
return extended
