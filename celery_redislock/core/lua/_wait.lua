-- _wait.lua (a part, not a script; see scripts.py): what a call that waits in line needs
-- beside the line itself (acquire.lua).
-- Defines: keep, keep_waiters, next_expiry.

-- #include _line.lua

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

-- Milliseconds until the earliest live lease expires: when a waiter should look again even if
-- nobody wakes it (a holder that crashed never releases).
local function next_expiry(now)
  if no_leases then
    return 0
  end
  local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end
