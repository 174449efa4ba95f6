-- _lock.lua (a part, not a script; see scripts.py): a lock's keys and spec, the hot path's
-- replies and a new lease's writes (all acquire.lua's fast path needs).
-- Defines: K, fence_mark, lean_waiting, use_lock_keys, promote, parse_spec, reply, append,
-- LINE_PREFIX, is_parked_token, record_done, put_lease.
-- Keys (one hash tag): 1 leases (zset: token -> expiry ms), 2 meta, 3 queue (zset: waiter or a
-- tenant's '#<id>' -> arrival), 4 qdl (waiter -> deadline), 5 wake, 6 done (job -> finished
-- until), 7 tenants (see _line.lua), 8 limits. meta: 'fence', 'm' live mode, 'l:<tok>' 'mode|
-- count|fence|requests|owner' (requests: ids applied, so a rerun counts once), 'i:<tok>' info,
-- 'o:<owner>' token, 'q:<tok>' waiter, 'qseq', 'qw' queued writers, 'g' / 'w' / 'r' the last
-- releases, release_where, resume; 'qp' parked count, 'p:<tok>' parked record until published
-- (s arrival, d deadline, q line record, x payload, r replaced), 'c:<tok>' '' until claimed,
-- 'x' tokens to publish as expired, 't:<tok>' a tenant's turn when served, 'u' the last unique
-- copy parked; 'L', 'I', 'Q', 'E', 'P' (_lean.lua). Any script may run twice (redis-py retries).
-- A lease is live while its expiry is above the server's TIME in ms.
-- #include _ids.lua
-- #include _lean.lua

local K = {
  leases = KEYS[1], meta = KEYS[2], queue = KEYS[3], qdl = KEYS[4], wake = KEYS[5], done = KEYS[6],
  tenants = KEYS[7], limits = KEYS[8],
}

-- The fence mark as this call last read or wrote it (nil: ask), so put_lease need not read it.
local fence_mark = nil
-- A fast-path waiter (meta 'Q') has no place in line: a release that frees the lock wakes one.
local lean_waiting = false

local function use_lock_keys(base)
  K.leases, K.meta, K.queue, K.qdl = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4]
  K.wake, K.done, K.tenants, K.limits = KEYS[base + 5], KEYS[base + 6], KEYS[base + 7],
    KEYS[base + 8]
  fence_mark, lean_waiting = nil, false
end

-- A live fast-path lease moves here so every script sees it ('m' says so until tidy()).
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
  -- The leases key is new: it lives the lease and GRACE_MS, as keep_lease_keys would have it.
  redis.call('PEXPIREAT', K.leases, tonumber(expiry) + GRACE_MS)
  local fields = {'m', 'w', 'l:' .. tok, 'w|' .. count .. '|' .. fence .. '|' .. requests .. '|'
    .. owner, 'i:' .. tok, redis.call('HGET', K.meta, 'I') or '{}', 'L', '', 'I', ''}
  if owner ~= '' then
    fields[#fields + 1], fields[#fields + 2] = 'o:' .. owner, tok
  end
  redis.call('HSET', K.meta, unpack(fields))
end

-- keep: the fence mark's life after the last use (fences rise through shorter clock steps back).
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

local function append(out, more)
  for _, v in ipairs(more) do
    out[#out + 1] = v
  end
  return out
end

-- Parked tasks' token prefix (the client's tokens are hex): a lease handed to one is published.
local LINE_PREFIX = 'L'

local function is_parked_token(tok)
  return string.sub(tok, 1, 1) == LINE_PREFIX
end

local function record_done(job, keep_ms, now)
  redis.call('ZREMRANGEBYSCORE', K.done, '-inf', now)
  redis.call('ZADD', K.done, int(now + keep_ms), job)
  if redis.call('PTTL', K.done) < keep_ms then
    redis.call('PEXPIRE', K.done, keep_ms)
  end
end

-- One HSET; the keys' lives are the caller's concern. The fence follows the mark or the clock.
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
