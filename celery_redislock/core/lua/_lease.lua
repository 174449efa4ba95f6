-- _lease.lua (a part, not a script; see scripts.py): a lease's record and its writes, and the
-- ids that make a call run twice count once.
-- Defines: REQUESTS_KEPT, parse_lease, read_lease, write_lease, applied, recent, note_request,
-- note_released, was_released, put_lease, lease_fields, keep_lease_keys.

-- #include _lock.lua

-- How many request ids a lease record, and release ids 'g', remember: enough for a call run
-- again right after its reply was lost.
local REQUESTS_KEPT = 16

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

-- Keeps the `n` most recent of the space-separated ids in `list`, with `id` first.
local function recent(id, list, n)
  local kept, count = id, 1
  if list then
    for t in string.gmatch(list, '%S+') do
      if count >= n then
        break
      end
      kept = kept .. ' ' .. t
      count = count + 1
    end
  end
  return kept
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

-- Writes a new lease of `mode` under `tok`, with the next fence: its expiry, its record, its
-- info (the holder's JSON record, stored as given) and, when it has an owner, the owner's entry,
-- in one HSET. Returns its fence and expiry. How long the keys live is the caller's concern.
-- The fence follows the fence mark, and the server's clock in us when that is ahead.
local function put_lease(tok, mode, ttl, owner, info, now, now_us)
  local last = tonumber(redis.call('HGET', K.meta, 'fence') or '0')
  local fence = int(math.max(last + 1, now_us))
  local expiry = now + ttl
  redis.call('ZADD', K.leases, int(expiry), tok)
  local rec = mode .. '|1|' .. fence .. '||' .. owner
  if owner ~= '' then
    redis.call('HSET', K.meta, 'fence', fence, 'm', mode, 'l:' .. tok, rec, 'i:' .. tok, info,
      'o:' .. owner, tok)
  else
    redis.call('HSET', K.meta, 'fence', fence, 'm', mode, 'l:' .. tok, rec, 'i:' .. tok, info)
  end
  return fence, expiry
end

-- The meta fields of lease `tok` (`rec` its record, nil if it has none), for dropping it: its
-- record, its info, a parked task's claim, and its owner's entry while that still names it.
local function lease_fields(tok, rec)
  local fields = {'l:' .. tok, 'i:' .. tok}
  if is_parked_token(tok) then
    fields[3] = 'c:' .. tok
  end
  if rec and rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
    fields[#fields + 1] = 'o:' .. rec.o
  end
  return fields
end

-- Makes the leases key live at least `need` ms (with `slack` more when it is extended, so that
-- renewals seldom need to touch it; `fresh`: the key was just made, it has no ttl yet), and the
-- meta key at least as long as the leases key (and `keep_ms`, when given, if it is extended):
-- renew.lua extends the meta key only when it extends the leases key, so without this a lease
-- renewed before that could outlive its own record. Never shortens a key's life.
local function keep_lease_keys(need, slack, fresh, keep_ms)
  local life = fresh and -2 or redis.call('PTTL', K.leases)
  if life < need then
    life = need + slack
    redis.call('PEXPIRE', K.leases, int(life))
  end
  if redis.call('PTTL', K.meta) < life then
    redis.call('PEXPIRE', K.meta, int(math.max(life + slack, keep_ms or 0)))
  end
end
