-- _lean.lua (a part, not a script; see scripts.py): the one-lease record of the fast path
-- (lean_acquire.lua, lean_release.lua). A plain mutex (mode w, limit 1, not fair) that is free
-- or held once, with nobody in line and no pause, lives in its meta hash alone: each side of a
-- call is one read and one write there. Its meta fields (upper case: the general path's are not):
--   'L' the lease: 'token|expiry ms|fence|count|owner|requests' ('' or none: no lease here),
--       requests the ids of re-entries and partial releases applied to it (see _ids.lua)
--   'I' its holder info (JSON, as given)
--   'Q' the latest deadline (server ms) of a refused waiter's place: a release before it pushes
--       one wake-up (a waiter has no entry of its own: it blocks on the wake list, and looks
--       again when the lease lapses or within a second)
--   'E' the meta key's expiry (server ms) as the fast path set it with its PEXPIRE, so that it
--       is not sent again while the key outlives the lease; gone with the general path's state
--       fields (STATE_FIELDS in _lease.lua), whose PEXPIREs may have shortened the key's life
--   'P' the end of the lock's pause (server ms; limits.lua): until then the general path decides
-- and, shared with the general path, 'fence' (the fence mark) and 'g' (the last release ids).
-- The general path's 'm', 'qseq' and 'qp' are set while a lease lives in the leases key or
-- anyone waits in the line: the fast path then answers '9' and the caller sends the call to the
-- general script, which first moves a fast-path lease into its own keys (promote in _lock.lua).
-- Defines: WAKE_MS, parse_lean, lean_record.

-- #include _time.lua

-- How long a non-fair lock's wake-up signals live (a signal nobody pops must not linger).
local WAKE_MS = 2000

-- The fields of a lease record 'L' (strings): token, expiry, fence, count, owner, requests (an
-- owner may hold '|': it is what lies between the count and the last '|').
local function parse_lean(raw)
  return string.match(raw, '^([^|]*)|(%d+)|(%d+)|(%d+)|(.*)|([^|]*)$')
end

local function lean_record(tok, expiry, fence, count, owner, requests)
  return tok .. '|' .. int(expiry) .. '|' .. fence .. '|' .. int(count) .. '|' .. owner .. '|'
    .. requests
end
