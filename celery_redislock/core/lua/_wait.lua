-- _wait.lua (a part, not a script; see scripts.py): what a call waiting in line needs.
-- Defines: keep, keep_waiters, next_expiry.
-- #include _grant.lua

-- `slack` more, so later calls seldom touch it; never shorter: others may need it for longer.
local function keep(keys, need, slack)
  for _, key in ipairs(keys) do
    if redis.call('PTTL', key) < need then
      redis.call('PEXPIRE', key, int(need + slack))
    end
  end
end

local function keep_waiters(entry_ms)
  keep({K.meta, K.queue, K.qdl}, entry_ms + GRACE_MS, entry_ms)
end

-- When a waiter looks again unwoken: a crashed holder never releases, a pause just ends.
local function next_expiry(now)
  local next_ms = 0
  if not no_leases then
    local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
    if first[2] then
      next_ms = tonumber(first[2]) - now
    end
  end
  local paused = pause_left()
  if paused > 0 and (next_ms <= 0 or paused < next_ms) then
    return paused
  end
  return next_ms
end
