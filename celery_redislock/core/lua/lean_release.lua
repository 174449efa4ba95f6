-- lean_release.lua: give back a fast-path lease (see _lean.lua): one re-entry level, or all of
-- it; then one wake-up if a refused waiter may still wait. A lease the general path holds (or
-- a release that records a job) answers '9': the caller sends the same call to release.lua.
-- KEYS: 1 meta, 2 wake (see _lock.lua)
-- ARGV: as release.lua's (token, spec, whole, request id); the caller sends only a release
--   that records no job
-- Returns release.lua's reply ('status left': 1 released, 0 not held by this token), or '9'.

-- #include _ids.lua
-- #include _lean.lua

local tok, request = ARGV[1], ARGV[4]
local keep_ms = tonumber(string.match(ARGV[2], '^w 1 %d+ 0 %d+ (%d+)$'))
local t = redis.call('TIME') -- (server_now inlined: this is the hot path)
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local s = redis.call('HMGET', KEYS[1], 'L', 'g', 'Q', 'E', 'm', 'qseq', 'qp', 'P')
local ltok, lexp, lfence, lcount, lowner, requests
if s[1] and s[1] ~= '' then
  ltok, lexp, lfence, lcount, lowner, requests = parse_lean(s[1])
end
if ltok ~= tok or tonumber(lexp) <= now then
  if s[2] and listed(s[2], request) then
    return '1 0' -- this very release ran before
  end
  if s[5] or s[6] or s[7] then
    return '9' -- the general path may hold it (moved there by promote)
  end
  return '0 0'
end
if s[8] and tonumber(s[8]) > now then
  return '9' -- paused: the general path keeps the pause's mark as long as the pause
end
if requests ~= '' and listed(requests, request) then
  return '1 ' .. lcount -- this partial release ran before: it counts once
end
local count = tonumber(lcount)
if count > 1 and ARGV[3] ~= '1' then
  redis.call('HSET', KEYS[1], 'L', lean_record(ltok, lexp, lfence, count - 1, lowner,
    recent(request, requests ~= '' and requests or nil, REQUESTS_KEPT)))
  return '1 ' .. (count - 1)
end
local released = recent(request, s[2] or nil, REQUESTS_KEPT)
-- The fence mark outlives the last use by `keep_ms`: set again when less than 99% of it is
-- left, or more than all of it (the key lived as long as the lease and a ttl more).
local left = s[4] and tonumber(s[4]) - now
if left and left >= keep_ms - math.floor(keep_ms / 100) and left <= keep_ms then
  redis.call('HSET', KEYS[1], 'L', '', 'I', '', 'g', released)
else
  redis.call('HSET', KEYS[1], 'L', '', 'I', '', 'g', released, 'E', int(now + keep_ms))
  redis.call('PEXPIRE', KEYS[1], keep_ms)
end
if s[3] and tonumber(s[3]) > now then -- someone may wait: one wake-up
  if redis.call('RPUSH', KEYS[2], '1') == 1 then
    redis.call('PEXPIRE', KEYS[2], WAKE_MS)
  end
end
return '1 0'
