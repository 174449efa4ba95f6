-- release_where.lua: drop every lease whose owner record matches, e.g. the task id and pid of a
-- worker child that was killed and cannot release for itself, or an operator's choice of leases
-- (by token), and hand the lock on: the one way a lease is freed by someone other than its
-- holder.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (see _lock.lua)
-- ARGV: 1 the lock's spec (see parse_spec in _lock.lua),
--       2 match (JSON object: every field must equal the lease's info field; {} matches any),
--       3 request id (chosen by the client; '' = none),
--       4... tokens (optional): only these leases are looked at, whatever their re-entry count
--         (a token that holds no live lease, e.g. a parked task's place in line, is left alone)
-- Returns {number released, released tokens..., granted...} (granted as in release.lua).
-- Run twice with the same request id, the second run returns the first one's answer (the
-- meta field 'w' keeps the last release that freed anything: its id and answer), so that the
-- caller hands the lock to those the first run granted it to; only if another such release ran
-- on the lock in between does it find nothing left and return 0 and no tokens.

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
  -- (The meta key exists: the leases released had their records there. Written as the
  -- answer's items, numbers as exact integers: reply() on a copy, `out` is the answer.)
  redis.call('HSET', K.meta, 'w', request .. ' ' .. reply(append({}, out)))
end
return out
