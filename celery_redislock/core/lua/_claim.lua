-- _claim.lua (a part, not a script; see scripts.py): a unique key's claim value. A queued
-- copy's claim holds its task id; once a once_per_period run started, '!' and its id: the key
-- stays taken for the period whatever the run's outcome, and giving the claim up leaves it.
-- Defines: STARTED, holder_of.

local STARTED = '!'

-- The task id a claim value names, and whether its run started (nil for no claim).
local function holder_of(value)
  if value and string.sub(value, 1, 1) == STARTED then
    return string.sub(value, 2), true
  end
  return value, false
end
