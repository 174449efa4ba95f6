-- _time.lua (a part, not a script; see scripts.py): the server's clock. Server time, never the
-- client's: the clients' clocks may disagree.
-- Defines: GRACE_MS, call_ms, server_now, int.

-- How long a lock's keys outlive its last lease or waiter (the fence mark: far longer, `keep`).
local GRACE_MS = 1000

-- The time the call read (server_now, ms): what the parts compare with when the caller does
-- not pass its time along (the end of a lock's pause, see _grant.lua).
local call_ms = 0

-- The server's TIME, in ms and in us.
local function server_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  call_ms = s * 1000 + math.floor(us / 1000)
  return call_ms, s * 1000000 + us
end

-- Numbers go to Redis as exact integers (Lua's default formatting keeps only 14 digits). A whole
-- number is written as one ('%d', a 64-bit integer here), several times cheaper than '%.0f',
-- which formats a float; anything else is rounded as before.
local function int(n)
  if n % 1 == 0 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end
