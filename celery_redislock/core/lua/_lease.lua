-- _lease.lua (a part, not a script; see scripts.py): a lease's record, the ids that make a call
-- run twice count once, and what is dropped with a lease.
-- Defines: REQUESTS_KEPT, STATE_FIELDS, parse_lease, read_lease, write_lease, applied, recent,
-- note_request, note_released, was_released, lease_fields.

-- #include _lock.lua

-- How many request ids a lease record, and release ids 'g', remember: enough for a call run
-- again right after its reply was lost.
local REQUESTS_KEPT = 16

-- The meta fields about the live leases and the line (mode, arrival counter, queued writers,
-- parked entries): once nothing is held or queued, none can be right but unset.
local STATE_FIELDS = {'m', 'qseq', 'qw', 'qp'}

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
  return string.find(' ' .. rec.r .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end

-- Keeps the `n` most recent of the ids in `list` (as this writes it: one space between ids),
-- with `id` first. The list is cut where its (n-1)th id ends, in one piece: building it id by id
-- made a new string per id, a good share of a release's work inside Redis.
local function recent(id, list, n)
  if not list then
    return id
  end
  local at = 0
  for _ = 1, n - 1 do
    at = string.find(list, ' ', at + 1, true)
    if not at then
      return id .. ' ' .. list
    end
  end
  return id .. ' ' .. string.sub(list, 1, at - 1)
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
  local prev = redis.call('HGET', K.meta, 'g')
  return prev ~= false and string.find(' ' .. prev .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
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
