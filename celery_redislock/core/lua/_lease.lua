-- _lease.lua (a part, not a script; see scripts.py): a lease's record, the ids that make a call
-- run twice count once, and what is dropped with a lease.
-- Defines: STATE_FIELDS, parse_lease, read_lease, write_lease, applied, note_request,
-- note_released, was_released, lease_fields.

-- #include _lock.lua

-- The meta fields about the live leases and the line (mode, arrival counter, queued writers,
-- parked entries): once nothing is held or queued, none can be right but unset. With them goes
-- 'E', the key's expiry as the fast path last set it (see _lean.lua): the general path may have
-- set another since.
local STATE_FIELDS = {'m', 'qseq', 'qw', 'qp', 'E'}

-- A lease record is a plain string (cheaper than JSON on the hot path):
-- mode|count|fence|requests|owner.
local function parse_lease(raw)
  if not raw then
    return nil
  end
  local m, c, f, r, o = string.match(raw, '^(%a)|(%d+)|(%d+)|([^|]*)|(.*)$')
  return {m = m, c = tonumber(c), f = f, r = r, o = o}
end

local function read_lease(tok)
  return parse_lease(redis.call('HGET', K.meta, 'l:' .. tok))
end

local function write_lease(tok, rec)
  redis.call('HSET', K.meta, 'l:' .. tok,
    rec.m .. '|' .. rec.c .. '|' .. rec.f .. '|' .. rec.r .. '|' .. rec.o)
end

-- Whether request `id` was already applied to the lease `rec` (then it must not count again).
local function applied(rec, id)
  return listed(rec.r, id)
end

-- Notes request `id` as applied to `rec` (written with the record). Only the last few are kept:
-- a call is run again right after its reply was lost, and a lease re-entered all day must not
-- carry a record that grows all day.
local function note_request(rec, id)
  rec.r = recent(id, rec.r ~= '' and rec.r or nil, REQUESTS_KEPT)
end

-- Remembers that release `id` dropped a lease, so that the same release run again says so.
local function note_released(id)
  local prev = redis.call('HGET', K.meta, 'g') or nil
  redis.call('HSET', K.meta, 'g', recent(id, prev, REQUESTS_KEPT))
end

local function was_released(id)
  return listed(redis.call('HGET', K.meta, 'g') or '', id)
end

-- The meta fields of lease `tok` (`rec` its record, nil if it has none), for dropping it: its
-- record, its info, a parked task's claim and turn, and its owner's entry while that still
-- names it.
local function lease_fields(tok, rec)
  local fields = {'l:' .. tok, 'i:' .. tok}
  if is_parked_token(tok) then
    fields[3] = 'c:' .. tok
    fields[4] = 't:' .. tok
  end
  if rec and rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
    fields[#fields + 1] = 'o:' .. rec.o
  end
  return fields
end
