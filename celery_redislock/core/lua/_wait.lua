-- _wait.lua (a part, not a script; see scripts.py): what a call that waits in line needs
-- beside the line and its hand-over (acquire.lua): the pause of the lock is in _grant.lua.
-- Defines: keep, keep_waiters, next_expiry.

-- #include _grant.lua

-- Makes each key live at least `need` ms, with `slack` ms more so that later calls seldom need
-- to touch it again. Never shortens a key's life: others may need it for longer.
local function keep(keys, need, slack)
  for _, key in ipairs(keys) do
    if redis.call('PTTL', key) < need then
      redis.call('PEXPIRE', key, int(need + slack))
    end
  end
end

-- After a waiter joined or refreshed its place: the keys waiters need (their records in meta,
-- the line, the deadlines) live at least as long as the entry.
local function keep_waiters(entry_ms)
  keep({K.meta, K.queue, K.qdl}, entry_ms + GRACE_MS, entry_ms)
end

-- Milliseconds until the earliest live lease expires, or the lock's pause ends if that comes
-- first (0: neither): when a waiter should look again even if nobody wakes it (a holder that
-- crashed never releases; a pause ends by time, with nothing to push a wake-up).
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
