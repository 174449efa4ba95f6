-- _line.lua (a part, not a script; see scripts.py): what a lock script knows of the lock's
-- line and leases, leases and entries in line made and dropped, and the purge of what lapsed
-- that a script does before it decides anything.
-- Defines: queue_known, no_leases, forget_lock_state, queue_exists, lease_count, lease_expiry,
-- keys_present, queue_present, keep_lease_keys, new_lease, SLOT, MEMBER_LEN, slot_of,
-- tenant_next, in_line, enqueue, requeue, drop_lease, dequeue, parked_count, purge_leases, purge,
-- start.

-- #include _lease.lua

-- What this call learnt already, so that it does not ask again (each command costs; a local
-- variable costs nothing). Its own writes keep them true. Set only by the helpers below.
local queue_known = nil -- whether anyone waits in line (nil: not known, ask)
local no_leases = false -- the lock is known to have no lease at all

-- Forgets what this call learnt of the lock (a script that works on several locks,
-- acquire_all.lua, calls it as it turns from one lock to the next).
local function forget_lock_state()
  queue_known, no_leases = nil, false
end

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

-- What an EXISTS of the lock's keys answered in a script's fast path, before these helpers were
-- defined. EXISTS counts a key once per time it is named, so a script names the leases key
-- once, the queue twice (and others 4, 8, ... times): the count is then a sum of flags that says
-- which keys exist, 1 the leases, 2 the queue (the higher flags are the caller's concern).
-- start() then asks nothing more: with no leases key the lock has no lease at all.
local function keys_present(present)
  queue_known = present % 4 >= 2
  no_leases = present % 2 == 0
end

-- What the caller learnt already of K.queue (an EXISTS it ran anyway): whether it exists.
local function queue_present(exists)
  queue_known = exists
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

-- Tenants (parked tasks given one, see core/line.py): such a task waits in K.tenants, member
-- '<tenant id: 16 hex><priority: 8 hex, 0 highest><arrival: 15 digits><token>' (the client
-- writes the first 24 characters), so that a tenant's tasks sort by priority then arrival; the
-- queue holds one place per tenant, '#<tenant id>', scored with its turn (an arrival number).
-- When a tenant's place heads the line its first task is served and the place goes to the end
-- of the line while the tenant has tasks left: tenants take turns, one task each, however many
-- each has waiting. Waiters and tasks without a tenant keep a place each, by arrival.
local SLOT = '#'
local MEMBER_LEN = 39 -- tenant id, priority and arrival: the token follows

-- The queue member of the place of the tenant of K.tenants member `member`.
local function slot_of(member)
  return SLOT .. string.sub(member, 1, 16)
end

-- The first task of the tenant whose place in the queue is `slot`: its member in K.tenants
-- and its token; nil if it has none.
local function tenant_next(slot)
  local id = string.sub(slot, 2)
  local first = redis.call('ZRANGEBYLEX', K.tenants, '[' .. id, '(' .. id .. '~', 'LIMIT', 0, 1)[1]
  if first then
    return first, string.sub(first, MEMBER_LEN + 1)
  end
  return nil, nil
end

-- Whether the entry `tok` waits in line, with or without a tenant: its record is there while
-- it does (a tenant's task has no place of its own in the queue).
local function in_line(tok)
  return redis.call('HGET', K.meta, 'q:' .. tok) ~= false
end

-- `publish_ms`: for a parked task, how long the lease handed to it lasts until its hand-over
-- is published (nil for a waiter). `tenant`: a parked task's tenant id and priority (24 hex,
-- see above; nil: none). Returns the entry's arrival number and record.
local function enqueue(tok, mode, limit, ttl, owner, info, entry_ms, publish_ms, tenant)
  local seq = redis.call('HINCRBY', K.meta, 'qseq', 1)
  local q = {m = mode, n = limit, t = ttl, o = owner, i = info, e = entry_ms}
  if tenant then
    q.k = tenant .. string.format('%015.0f', seq) .. tok
    redis.call('ZADD', K.tenants, 0, q.k)
    redis.call('ZADD', K.queue, 'NX', seq, slot_of(q.k)) -- a tenant new to the line: its turn
  else
    redis.call('ZADD', K.queue, seq, tok)
  end
  queue_known = true
  if mode == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', 1)
  end
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
-- the task. A task with a tenant goes back among its tenant's, and the tenant's place back to
-- the turn the task was served at ('t:', unless the place is ahead of it already). Returns
-- whether it went back (false: it is in line already).
local function requeue(tok, raw)
  local p = cjson.decode(raw)
  local q = cjson.decode(p.q)
  if q.k then
    if redis.call('ZSCORE', K.tenants, q.k) then
      return false
    end
    redis.call('ZADD', K.tenants, 0, q.k)
    local slot = slot_of(q.k)
    local turn = tonumber(redis.call('HGET', K.meta, 't:' .. tok) or p.s)
    local now_at = redis.call('ZSCORE', K.queue, slot)
    if not now_at or tonumber(now_at) > turn then
      redis.call('ZADD', K.queue, turn, slot)
    end
  else
    if redis.call('ZSCORE', K.queue, tok) then
      return false
    end
    redis.call('ZADD', K.queue, p.s, tok)
  end
  queue_known = true
  redis.call('ZADD', K.qdl, p.d, tok)
  redis.call('HSET', K.meta, 'q:' .. tok, p.q)
  redis.call('HINCRBY', K.meta, 'qp', 1)
  if q.m == 'w' then
    redis.call('HINCRBY', K.meta, 'qw', 1)
  end
  return true
end

-- `rec`: the lease's record, when the caller read it already. Returns whether a parked task
-- went back in line. (Put back before the lease's fields go: its turn is one of them.)
local function drop_lease(tok, rec)
  rec = rec or read_lease(tok)
  redis.call('ZREM', K.leases, tok)
  local parked = is_parked_token(tok) and redis.call('HGET', K.meta, 'p:' .. tok)
  local requeued = parked and requeue(tok, parked) or false
  redis.call('HDEL', K.meta, unpack(lease_fields(tok, rec)))
  return requeued
end

-- `raw`: the entry's record when the caller read it already (false: it has none). `own`: the
-- mode of a plain caller's own entry (not a parked task's: their records differ), whose record
-- is the one this call's own arguments wrote (enqueue: that mode, no parked task), so it need
-- not be read; it counts as a queued writer only while it is there. `member`: a tenant's
-- task's member in K.tenants, when the caller knows it (else read from the record). Returns
-- the place of the task's tenant when the tenant has tasks left (nil otherwise).
local function dequeue(tok, raw, own, member)
  local rest = nil
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
      member = member or q.k
    end
    redis.call('HDEL', K.meta, 'q:' .. tok)
  end
  if member then
    redis.call('ZREM', K.tenants, member)
    rest = slot_of(member)
    if tenant_next(rest) == nil then
      redis.call('ZREM', K.queue, rest)
      rest = nil
    end
  else
    redis.call('ZREM', K.queue, tok)
  end
  redis.call('ZREM', K.qdl, tok)
  queue_known = nil -- whether anyone is left is not known
  return rest
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
