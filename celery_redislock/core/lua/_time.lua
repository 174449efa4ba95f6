-- _time.lua (a part, not a script; see scripts.py): server time (clients' clocks may disagree).
-- Defines: GRACE_MS, call_ms, server_now, int.

local GRACE_MS = 1000 -- the keys' life past the last lease or waiter (the fence mark's: `keep`)

-- The call's time (server_now, ms), for parts not passed it (the pause's end, _grant.lua).
local call_ms = 0

local function server_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  call_ms = s * 1000 + math.floor(us / 1000)
  return call_ms, s * 1000000 + us
end

-- Exact integers (Lua's default keeps 14 digits); '%d' is several times cheaper than '%.0f'.
local function int(n)
  if n % 1 == 0 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end
