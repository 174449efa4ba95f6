-- lockbase.lua: the lock's keys and the few helpers a script's fast path needs, prepended to
-- every lock script at load time (after _time.lua, whose server_now and int it uses); not a
-- script of its own. The rest of the helpers are in common.lua, which a script includes after
-- its fast path: defining them costs each run about as much as a few Redis commands.
--
-- Every lock script takes the same six keys, all sharing the lock's hash tag:
--   KEYS[1] leases  sorted set: lease token -> expiry (server ms)
--   KEYS[2] meta    hash: 'fence' high-water mark, 'm' mode of the live leases,
--                   'l:<token>' lease record 'mode|count|fence|requests|owner' (requests: the
--                   space-separated ids of re-entries and partial releases applied to it, so a
--                   call run twice counts once), 'i:<token>' its info (JSON),
--                   'o:<owner>' owner -> token, 'q:<token>' waiter record (JSON),
--                   'qseq' arrival counter, 'qw' number of queued writers,
--                   'g' ids of the last releases that dropped a lease (run twice, such a
--                   release still says released), 'w' the id and answer of the last
--                   release_where that freed a lease (run twice, it answers the same),
--                   the task line (parked tasks, see line.lua): 'qp' number of parked entries,
--                   'p:<token>' a parked task's record (JSON: s arrival number, d wait deadline,
--                   q its line record, x the payload to publish it again) kept until its
--                   hand-over is published, 'c:<token>' '' while a lease handed to a parked
--                   task is unclaimed, then the id of the call that claimed it,
--                   'x' tokens of parked entries whose wait deadline passed (to publish as
--                   expired)
--   KEYS[3] queue   sorted set: waiter token -> arrival number
--   KEYS[4] qdl     sorted set: waiter token -> deadline (server ms) of its queue entry
--   KEYS[5] wake    list: wake-up signals for waiters of a non-fair lock
--   KEYS[6] done    sorted set: job id -> server ms until which it is known finished
-- and the lock's spec 'mode limit ttl fair entry keep' (see parse_spec).
-- A lease is live while its expiry is greater than the server's TIME in ms.
--
-- redis-py retries a command whose reply was lost, so every script may run twice with the same
-- arguments: each gives the same answer the second time (tokens and request ids are chosen by
-- the client before the call).

-- How many request ids a lease record, and release ids 'g', remember: enough for a call run
-- again right after its reply was lost.
local REQUESTS_KEPT = 16

local K = {
  leases = KEYS[1], meta = KEYS[2], queue = KEYS[3], qdl = KEYS[4], wake = KEYS[5], done = KEYS[6],
}

-- The lock's spec: mode 'r' | 'w', limit (0 = unbounded), ttl ms, fair '0' | '1', queue entry
-- lifetime ms, keep ms (how long the fence mark outlives the lock's last use: fences stay
-- strictly increasing through a server clock step back shorter than that).
local function parse_spec(spec)
  local mode, limit, ttl, fair, entry, keep =
    string.match(spec, '^(%a) (%d+) (%d+) (%d) (%d+) (%d+)$')
  return mode, tonumber(limit), tonumber(ttl), fair == '1', tonumber(entry), tonumber(keep)
end

-- Hot-path scripts answer with one space-separated string: one reply element to parse.
local function reply(items)
  for i, v in ipairs(items) do
    if type(v) == 'number' then
      items[i] = int(v)
    end
  end
  return table.concat(items, ' ')
end

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

-- Token prefix of parked tasks' entries (the client's tokens are hex): a lease handed to one
-- is published, not woken.
local LINE_PREFIX = 'L'

-- Records job `job` as finished for `keep_ms` (the done set is trimmed as it is written).
local function record_done(job, keep_ms, now)
  redis.call('ZREMRANGEBYSCORE', K.done, '-inf', now)
  redis.call('ZADD', K.done, int(now + keep_ms), job)
  if redis.call('PTTL', K.done) < keep_ms then
    redis.call('PEXPIRE', K.done, keep_ms)
  end
end
