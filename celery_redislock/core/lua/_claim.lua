-- _claim.lua (a part, not a script; see scripts.py): a claim: a queued copy's task id, or '!' and
-- it once a once_per_period run started (the key then stays taken for the period).
-- Defines: STARTED, holder_of.

local STARTED = '!'

local function holder_of(value)
  if value and string.sub(value, 1, 1) == STARTED then
    return string.sub(value, 2), true
  end
  return value, false
end
