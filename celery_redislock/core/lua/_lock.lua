-- _lock.lua (a part, not a script; see scripts.py): a lock's keys, its spec, the shape of the
-- hot path's replies, and the writes of a new lease (all acquire.lua's fast path needs).
-- Defines: K, fence_mark, lean_waiting, use_lock_keys, promote, parse_spec, reply, append,
-- LINE_PREFIX, is_parked_token, record_done, put_lease.
--
-- Every lock script takes the same eight keys, all sharing the lock's hash tag:
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
--                   'r' the id and answer of the last resume that handed the lock on
--                   (limits.lua),
--                   the task line (parked tasks: the park branch of acquire.lua and the
--                   line_*.lua scripts): 'qp' number of parked entries,
--                   'p:<token>' a parked task's record (JSON: s arrival number, d wait deadline,
--                   q its line record, x the payload to publish it again) kept until its
--                   hand-over is published, 'c:<token>' '' while a lease handed to a parked
--                   task is unclaimed, then the id of the call that claimed it,
--                   'x' tokens of parked entries whose wait deadline passed (to publish as
--                   expired), 't:<token>' the turn a parked task with a tenant was handed the
--                   lock at (its tenant's place goes back there if the hand-over lapses),
--                   'u' '<task id> <token>' the last unique copy parked under the lock's name
--                   (unique_claim.lua: a replace takes it out of the line; a stale one, whose
--                   entry left, is ignored), a parked record's 'r' 1: replaced, to end unrun
--                   the fast path's 'L', 'I', 'Q', 'E', 'P' (see _lean.lua): a plain mutex's
--                   one lease kept here alone, moved into these keys by promote()
--   KEYS[3] queue   sorted set: waiter token -> arrival number; and for each tenant with
--                   parked tasks, its place in the rotation '#<tenant id>' -> its turn (an
--                   arrival number: a tenant served goes to the end of the line)
--   KEYS[4] qdl     sorted set: waiter token -> deadline (server ms) of its queue entry
--   KEYS[5] wake    list: wake-up signals for waiters of a non-fair lock
--   KEYS[6] done    sorted set: job id -> server ms until which it is known finished
--   KEYS[7] tenants sorted set, every score 0 (ordered by member): the parked tasks with a
--                   tenant, member '<tenant id: 16 hex><priority: 8 hex, highest first>
--                   <arrival: 15 digits><token>' (see _line.lua)
--   KEYS[8] limits  hash: what is set at runtime for the name (limits.lua); 'cap' takes the
--                   place of a lock's limit of 2 or more, and 'lock_paused' (server ms) is the
--                   end of a pause: until then no new lease is handed out (see fits in
--                   _grant.lua)
-- and the lock's spec 'mode limit ttl fair entry keep' (see parse_spec).
-- A lease is live while its expiry is greater than the server's TIME in ms.
--
-- redis-py retries a command whose reply was lost, so every script may run twice with the same
-- arguments: each gives the same answer the second time (tokens and request ids are chosen by
-- the client before the call).

-- #include _ids.lua
-- #include _lean.lua

local K = {
  leases = KEYS[1], meta = KEYS[2], queue = KEYS[3], qdl = KEYS[4], wake = KEYS[5], done = KEYS[6],
  tenants = KEYS[7], limits = KEYS[8],
}

-- Turns K to the lock whose eight keys follow KEYS[base] (a script that works on several
-- locks, acquire_all.lua, passes their keys lock after lock).
-- The fence mark as this call last read or wrote it (nil: not known, ask): promote reads it
-- with the fast path's lease, so that a new lease's put_lease need not.
local fence_mark = nil
-- Whether a waiter refused on the fast path may still wait (meta 'Q', see _lean.lua), as
-- promote read it: it has no place in line, so a release that frees the lock wakes one.
local lean_waiting = false

local function use_lock_keys(base)
  K.leases, K.meta, K.queue, K.qdl = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  K.wake, K.done, K.tenants, K.limits = KEYS[base + 5], KEYS[base + 6], KEYS[base + 7],
    KEYS[base + 8]
  fence_mark, lean_waiting = nil, false
end

-- Moves the fast path's lease (meta 'L', see _lean.lua), if live, into the general path's keys
-- (the leases key, its record, info and owner entry), as put_lease would have written it: every
-- script that reads or hands out leases calls it first, so that it sees every lease. A lapsed
-- one is dropped. The meta field 'm' now says the general path decides, until the lock is
-- free again (tidy).
local function promote(now)
  local s = redis.call('HMGET', K.meta, 'L', 'fence', 'Q')
  local raw = s[1]
  fence_mark = tonumber(s[2] or '0')
  lean_waiting = s[3] ~= false and tonumber(s[3]) > now
  if not raw or raw == '' then
    return
  end
  local tok, expiry, fence, count, owner, requests = parse_lean(raw)
  if tonumber(expiry) <= now then
    redis.call('HSET', K.meta, 'L', '', 'I', '')
    return
  end
  redis.call('ZADD', K.leases, expiry, tok)
  -- The leases key is new (a fast-path lease means no other): it lives as long as the lease
  -- and a second more, as keep_lease_keys would have it; renewals extend it.
  redis.call('PEXPIREAT', K.leases, tonumber(expiry) + GRACE_MS)
  local fields = {'m', 'w', 'l:' .. tok, 'w|' .. count .. '|' .. fence .. '|' .. requests .. '|'
    .. owner, 'i:' .. tok, redis.call('HGET', K.meta, 'I') or '{}', 'L', '', 'I', ''}
  if owner ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'o:' .. owner, tok
  end
  redis.call('HSET', K.meta, unpack(fields))
end

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

-- Appends the items of `more` (e.g. the token, fence, expiry of each grant) to `out`; returns
-- `out`.
local function append(out, more)
  for _, v in ipairs(more) do
    out[#out + 1] = v
  end
  return out
end

-- Token prefix of parked tasks' entries (the client's tokens are hex): a lease handed to one
-- is published, not woken.
local LINE_PREFIX = 'L'

-- Whether `tok` is a parked task's token (its place in the task line, then its hand-over).
local function is_parked_token(tok)
  return string.sub(tok, 1, 1) == LINE_PREFIX
end

-- Records job `job` as finished for `keep_ms` (the done set is trimmed as it is written).
local function record_done(job, keep_ms, now)
  redis.call('ZREMRANGEBYSCORE', K.done, '-inf', now)
  redis.call('ZADD', K.done, int(now + keep_ms), job)
  if redis.call('PTTL', K.done) < keep_ms then
    redis.call('PEXPIRE', K.done, keep_ms)
  end
end

-- Writes a new lease of `mode` under `tok`, with the next fence: its expiry, its record, its
-- info (the holder's JSON record, stored as given) and, when it has an owner, the owner's entry,
-- in one HSET. Returns its fence and expiry. How long the keys live is the caller's concern.
-- The fence follows the fence mark, and the server's clock in us when that is ahead.
local function put_lease(tok, mode, ttl, owner, info, now, now_us)
  local last = fence_mark or tonumber(redis.call('HGET', K.meta, 'fence') or '0')
  local fence = int(math.max(last + 1, now_us))
  fence_mark = tonumber(fence)
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
