-- release_where.lua: drop the leases whose info matches (a killed child's) and hand the lock on.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 spec, 2 match (JSON: fields the info must equal), 3 request id ('' none), 4... tokens
-- Returns {number released, released tokens..., granted...}; run again, the first answer ('w').
-- #include _grant.lua

local _, _, _, fair, _, keep_ms = parse_spec(ARGV[1])
local request = ARGV[3] or ''
if request ~= '' then
  local last = redis.call('HGET', K.meta, 'w')
  if last and string.sub(last, 1, #request + 1) == request .. ' ' then
    local again = {}
    for item in string.gmatch(string.sub(last, #request + 2), '%S+') do
      again[#again + 1] = item
    end
    return again
  end
end
local match = cjson.decode(ARGV[2])
local now, now_us = server_now()
promote(now)
start(now)
local released = {}
local candidates = {}
if #ARGV > 3 then
  local seen = {}
  for i = 4, #ARGV do
    if not seen[ARGV[i]] and redis.call('ZSCORE', K.leases, ARGV[i]) then
      seen[ARGV[i]] = true
      candidates[#candidates + 1] = ARGV[i]
    end
  end
else
  candidates = redis.call('ZRANGE', K.leases, 0, -1)
end
for _, tok in ipairs(candidates) do
  local raw = redis.call('HGET', K.meta, 'i:' .. tok)
  local info = raw and cjson.decode(raw) or {}
  local same = true
  for field, want in pairs(match) do
    if tostring(info[field]) ~= tostring(want) then
      same = false
      break
    end
  end
  if same then
    drop_lease(tok)
    released[#released + 1] = tok
  end
end
local out = hand_on(append({#released}, released), now, now_us, fair, #released > 0, keep_ms)
if request ~= '' and #released > 0 then
  -- (Meta exists: the released records were there. reply() on a copy: `out` is the answer.)
  redis.call('HSET', K.meta, 'w', request .. ' ' .. reply(append({}, out)))
end
return out
