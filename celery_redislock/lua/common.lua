-- common.lua: helpers prepended to every lock script at load time; not a script of its own.
--
-- Every lock script takes the same five keys, all sharing the lock's hash tag:
--   KEYS[1] leases  sorted set: lease token -> expiry (server ms)
--   KEYS[2] meta    hash: 'fence' high-water mark, 'm' mode of the live leases,
--                   'l:<token>' lease record, 'o:<owner>' owner -> token,
--                   'q:<token>' waiter record, 'qseq' arrival counter, 'qw' queued writers
--   KEYS[3] queue   sorted set: waiter token -> arrival number
--   KEYS[4] qdl     sorted set: waiter token -> deadline (server ms) of its queue entry
--   KEYS[5] wake    list: wake-up signals for waiters of a non-fair lock
-- A lease is live while its expiry is greater than the server's TIME in ms.

-- How long the fence high-water mark outlives the lock's last lease or waiter. Fences are
-- max(last + 1, server us), so after this long server time alone is ahead of any fence issued.
local GRACE_MS = 1000

local K = {leases = KEYS[1], meta = KEYS[2], queue = KEYS[3], qdl = KEYS[4], wake = KEYS[5]}

local function server_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Numbers go to Redis as exact integers (Lua's default formatting keeps only 14 digits).
local function int(n)
  return string.format('%.0f', n)
end

local function drop_lease(tok)
  local raw = redis.call('HGET', K.meta, 'l:' .. tok)
  if raw then
    local rec = cjson.decode(raw)
    if rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
      redis.call('HDEL', K.meta, 'o:' .. rec.o)
    end
    redis.call('HDEL', K.meta, 'l:' .. tok)
  end
  redis.call('ZREM', K.leases, tok)
end

local function dequeue(tok)
  local raw = redis.call('HGET', K.meta, 'q:' .. tok)
  if raw and cjson.decode(raw).m == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', -1)
  end
  redis.call('HDEL', K.meta, 'q:' .. tok)
  redis.call('ZREM', K.queue, tok)
  redis.call('ZREM', K.qdl, tok)
end

-- Drops expired leases and waiter entries whose owner stopped refreshing them.
local function purge(now)
  local dead = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)
  for _, tok in ipairs(dead) do
    drop_lease(tok)
  end
  local gone = redis.call('ZRANGEBYSCORE', K.qdl, '-inf', now)
  for _, tok in ipairs(gone) do
    dequeue(tok)
  end
end

-- Whether a new lease of `mode` fits beside the live ones; limit 0 means unbounded.
local function fits(mode, limit)
  local n = redis.call('ZCARD', K.leases)
  if n == 0 then
    return true
  end
  return redis.call('HGET', K.meta, 'm') == mode and (limit == 0 or n < limit)
end

local function new_lease(tok, mode, ttl, owner, info, now, now_us)
  local last = tonumber(redis.call('HGET', K.meta, 'fence') or '0')
  local fence = math.max(last + 1, now_us)
  local expiry = now + ttl
  redis.call('ZADD', K.leases, int(expiry), tok)
  redis.call('HSET', K.meta, 'fence', int(fence), 'm', mode,
    'l:' .. tok, cjson.encode({m = mode, f = int(fence), c = 1, o = owner, i = info}))
  if owner ~= '' then
    redis.call('HSET', K.meta, 'o:' .. owner, tok)
  end
  return int(fence), expiry
end

local function enqueue(tok, mode, limit, ttl, owner, info)
  local seq = redis.call('HINCRBY', K.meta, 'qseq', 1)
  redis.call('ZADD', K.queue, seq, tok)
  if mode == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', 1)
  end
  redis.call('HSET', K.meta, 'q:' .. tok,
    cjson.encode({m = mode, n = limit, t = ttl, o = owner, i = info}))
end

-- Fair mode: hands free capacity to waiters strictly in arrival order. Returns a flat list of
-- token, fence, expiry for each grant, so the caller can wake exactly those waiters.
local function grant(now, now_us, skip)
  local out = {}
  while true do
    local head = redis.call('ZRANGE', K.queue, 0, 0)[1]
    if not head then
      break
    end
    local q = cjson.decode(redis.call('HGET', K.meta, 'q:' .. head))
    if not fits(q.m, q.n) then
      break
    end
    dequeue(head)
    local fence, expiry = new_lease(head, q.m, q.t, q.o, q.i, now, now_us)
    if head ~= skip then
      out[#out + 1] = head
      out[#out + 1] = fence
      out[#out + 1] = expiry
    end
  end
  return out
end

-- Non-fair mode: one signal wakes the longest-blocked waiter, which then competes for the lock.
local function wake_one()
  redis.call('RPUSH', K.wake, '1')
  redis.call('PEXPIRE', K.wake, 2000)
end

-- Keeps every key of the lock alive exactly as long as its last lease or waiter, so no key
-- outlives its use; the fence alone is kept a little longer (see GRACE_MS).
local function settle(now)
  local horizon = 0
  local top = redis.call('ZRANGE', K.leases, -1, -1, 'WITHSCORES')
  if top[2] then
    horizon = tonumber(top[2])
  end
  local qtop = redis.call('ZRANGE', K.qdl, -1, -1, 'WITHSCORES')
  if qtop[2] and tonumber(qtop[2]) > horizon then
    horizon = tonumber(qtop[2])
  end
  if horizon == 0 then
    local fence = redis.call('HGET', K.meta, 'fence')
    redis.call('DEL', K.leases, K.queue, K.qdl, K.meta)
    if fence then
      redis.call('HSET', K.meta, 'fence', fence)
      redis.call('PEXPIRE', K.meta, GRACE_MS)
    end
    return
  end
  local ttl = int(horizon - now + GRACE_MS)
  for _, key in ipairs({K.leases, K.meta, K.queue, K.qdl}) do
    redis.call('PEXPIRE', key, ttl)
  end
end

-- Milliseconds until the earliest live lease expires: when a waiter should look again even if
-- nobody wakes it (a holder that crashed never releases).
local function next_expiry(now)
  local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end
