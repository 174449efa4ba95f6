-- _lease.lua (a part, not a script; see scripts.py): a lease's record, request ids and fields.
-- Defines: STATE_FIELDS, parse_lease, read_lease, write_lease, applied, note_request,
-- note_released, was_released, lease_fields.
-- #include _lock.lua

-- None is right but unset once nothing is held or queued ('E': the general path may change it).
local STATE_FIELDS = {'m', 'qseq', 'qw', 'qp', 'E'}

-- A plain string (cheaper than JSON on the hot path): mode|count|fence|requests|owner.
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

local function applied(rec, id)
  return listed(rec.r, id)
end

-- Only the last few: reruns come right after a lost reply; a record must not grow all day.
local function note_request(rec, id)
  rec.r = recent(id, rec.r ~= '' and rec.r or nil, REQUESTS_KEPT)
end

local function note_released(id)
  local prev = redis.call('HGET', K.meta, 'g') or nil
  redis.call('HSET', K.meta, 'g', recent(id, prev, REQUESTS_KEPT))
end

local function was_released(id)
  return listed(redis.call('HGET', K.meta, 'g') or '', id)
end

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
