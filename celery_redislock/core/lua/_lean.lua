-- _lean.lua (a part, not a script; see scripts.py): a plain mutex, free or held once, no line or
-- pause, lives in meta alone: 'L' 'token|expiry ms|fence|count|owner|requests', 'I' info, 'Q' a
-- refused waiter's deadline (a release before it wakes one), 'E' the expiry it set, 'P' the pause's
-- end. While 'm', 'qseq' or 'qp' is set the fast path answers '9': the general script decides.
-- Defines: WAKE_MS, parse_lean, lean_record.
-- #include _time.lua

local WAKE_MS = 2000 -- a wake-up nobody pops must not linger

-- (An owner may hold '|': it is what lies between the count and the last '|'.)
local function parse_lean(raw)
  return string.match(raw, '^([^|]*)|(%d+)|(%d+)|(%d+)|(.*)|([^|]*)$')
end

local function lean_record(tok, expiry, fence, count, owner, requests)
  return tok .. '|' .. int(expiry) .. '|' .. fence .. '|' .. int(count) .. '|' .. owner .. '|'
    .. requests
end
