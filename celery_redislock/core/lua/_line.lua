-- _line.lua (a part, not a script; see scripts.py): what a lock script knows of the lock's
-- line and leases, leases and entries in line made and dropped, and the purge of what lapsed
-- that a script does before it decides anything.
-- Defines: queue_known, no_leases, queue_exists, lease_count, lease_expiry, keys_present,
-- keep_lease_keys, new_lease, enqueue, requeue, drop_lease, dequeue, parked_count,
-- purge_leases, purge, start.

-- #include _lease.lua

-- What this call learnt already, so that it does not ask again (each command costs; a local
-- variable costs nothing). Its own writes keep them true. Set only by the helpers below.
local queue_known = nil -- whether anyone waits in line (nil: not known, ask)
local no_leases = false -- the lock is known to have no lease at all

-- Whether anyone waits in line.
local function queue_exists()
  if queue_known == nil then
    queue_known = redis.call('EXISTS', K.queue) == 1
  end
  return queue_known
end

-- How many leases (live or lapsed) the lock has.
local function lease_count()
  return no_leases and 0 or redis.call('ZCARD', K.leases)
end

-- The expiry of lease `tok` (a string, as Redis answers), false if it has none.
local function lease_expiry(tok)
  return not no_leases and redis.call('ZSCORE', K.leases, tok)
end

-- What `EXISTS leases queue` answered (`present`: 1 or 2) in a script's fast path, before these
-- helpers were defined: 2, both keys; 1, one of them, and which is asked here, once (when it is
-- the line, the lock has no lease at all). start() then asks nothing more.
local function keys_present(present)
  if present == 2 then
    queue_known = true
  else
    no_leases = queue_exists()
  end
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

-- Creates a lease (see put_lease). Keeps the lock's keys alive at least as long as the new
-- lease, or as `life` ms when given (a lease handed to a waiter, which claims `life` on waking:
-- the claim then need not touch the keys). `first`: the lock had no lease (nil: not known, ask).
local function new_lease(tok, mode, ttl, owner, info, now, now_us, first, keep_ms, life)
  if first == nil then
    first = lease_count() == 0
  end
  local fence, expiry = put_lease(tok, mode, ttl, owner, info, now, now_us)
  no_leases = false
  -- The meta key (the fence mark) lives at least `keep_ms`, so it outlives a holder that died.
  life = life or ttl
  keep_lease_keys(life + GRACE_MS, life, first, keep_ms)
  return fence, expiry
end

-- `publish_ms`: for a parked task, how long the lease handed to it lasts until its hand-over
-- is published (nil for a waiter). Returns the entry's arrival number and record.
local function enqueue(tok, mode, limit, ttl, owner, info, entry_ms, publish_ms)
  local seq = redis.call('HINCRBY', K.meta, 'qseq', 1)
  redis.call('ZADD', K.queue, seq, tok)
  queue_known = true
  if mode == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', 1)
  end
  local q = {m = mode, n = limit, t = ttl, o = owner, i = info, e = entry_ms}
  if publish_ms then
    q.p = publish_ms
    redis.call('HINCRBY', K.meta, 'qp', 1)
  end
  local raw = cjson.encode(q)
  redis.call('HSET', K.meta, 'q:' .. tok, raw)
  return seq, raw
end

-- Puts a parked task whose hand-over was never published (its publisher died, or its lease was
-- freed first) back in line, at its old place: `raw`, its parked record, holds the only copy of
-- the task.
local function requeue(tok, raw)
  local p = cjson.decode(raw)
  redis.call('ZADD', K.queue, p.s, tok)
  queue_known = true
  redis.call('ZADD', K.qdl, p.d, tok)
  redis.call('HSET', K.meta, 'q:' .. tok, p.q)
  redis.call('HINCRBY', K.meta, 'qp', 1)
  if cjson.decode(p.q).m == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', 1)
  end
end

-- `rec`: the lease's record, when the caller read it already. Returns whether a parked task
-- went back in line.
local function drop_lease(tok, rec)
  rec = rec or read_lease(tok)
  redis.call('ZREM', K.leases, tok)
  local parked = is_parked_token(tok) and redis.call('HGET', K.meta, 'p:' .. tok)
  redis.call('HDEL', K.meta, unpack(lease_fields(tok, rec)))
  if parked and redis.call('ZSCORE', K.queue, tok) == false then
    requeue(tok, parked)
    return true
  end
  return false
end

-- `raw`: the entry's record when the caller read it already (false: it has none). `own`: the
-- mode of a plain caller's own entry (not a parked task's: their records differ), whose record
-- is the one this call's own arguments wrote (enqueue: that mode, no parked task), so it need
-- not be read; it counts as a queued writer only while it is there.
local function dequeue(tok, raw, own)
  if own then
    if redis.call('HDEL', K.meta, 'q:' .. tok) == 1 and own == 'w' then
      redis.call('HINCRBY', K.meta, 'qw', -1)
    end
  else
    if raw == nil then
      raw = redis.call('HGET', K.meta, 'q:' .. tok)
    end
    if raw then
      local q = cjson.decode(raw)
      if q.m == 'w' then
        redis.call('HINCRBY', K.meta, 'qw', -1)
      end
      if q.p then
        redis.call('HINCRBY', K.meta, 'qp', -1)
      end
    end
    redis.call('HDEL', K.meta, 'q:' .. tok)
  end
  redis.call('ZREM', K.queue, tok)
  redis.call('ZREM', K.qdl, tok)
  queue_known = nil -- whether anyone is left is not known
end

-- Parked entries in line (they come before newcomers, fair lock or not).
local function parked_count()
  return tonumber(redis.call('HGET', K.meta, 'qp') or '0') or 0
end

-- Drops expired leases; returns whether a parked task went back in line.
local function purge_leases(now)
  if no_leases then
    return false
  end
  local dead = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)
  local requeued = false
  for _, tok in ipairs(dead) do
    requeued = drop_lease(tok) or requeued
  end
  return requeued
end

-- Drops expired leases and waiter entries whose owner stopped refreshing them. A parked task
-- past its wait deadline leaves the line but keeps its record: it is published as expired
-- (line_sweep.lua), so that it ends with an outcome rather than vanishing.
local function purge(now)
  purge_leases(now)
  local gone = redis.call('ZRANGEBYSCORE', K.qdl, '-inf', now)
  for _, tok in ipairs(gone) do
    dequeue(tok)
    -- (HGET rather than HEXISTS: only the commands the docs list for ACL users.)
    if is_parked_token(tok) and redis.call('HGET', K.meta, 'p:' .. tok) then
      local x = redis.call('HGET', K.meta, 'x')
      redis.call('HSET', K.meta, 'x', x and (x .. ' ' .. tok) or tok)
    end
  end
end

-- Purges what lapsed (waiter entries only when anyone waits: while nobody does, the meta key
-- holds no waiter to purge); returns whether anyone waits.
local function start(now)
  if queue_exists() then
    purge(now)
    return true
  end
  return purge_leases(now) -- a parked task may be back in line
end
