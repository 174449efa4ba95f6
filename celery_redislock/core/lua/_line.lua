-- _line.lua (a part, not a script; see scripts.py): the lock's line and leases, and purges.
-- Defines: queue_known, no_leases, forget_lock_state, queue_exists, lease_count, lease_expiry,
-- keys_present, queue_present, keep_lease_keys, new_lease, SLOT, MEMBER_LEN, slot_of,
-- tenant_next, in_line, enqueue, requeue, drop_lease, dequeue, parked_count, purge_leases, purge,
-- start.
-- #include _lease.lua

-- What this call learnt already, not to ask again (its own writes keep it true).
local queue_known = nil -- whether anyone waits in line (nil: not known, ask)
local no_leases = false -- the lock is known to have no lease at all

local function forget_lock_state()
  queue_known, no_leases = nil, false
end

local function queue_exists()
  if queue_known == nil then
    queue_known = redis.call('EXISTS', K.queue) == 1
  end
  return queue_known
end

local function lease_count()
  return no_leases and 0 or redis.call('ZCARD', K.leases)
end

local function lease_expiry(tok)
  return not no_leases and redis.call('ZSCORE', K.leases, tok)
end

-- A fast path's EXISTS naming leases once, the queue twice: flags 1 leases, 2 queue.
local function keys_present(present)
  queue_known = present % 4 >= 2
  no_leases = present % 2 == 0
end

local function queue_present(exists)
  queue_known = exists
end

-- `slack` more, so renewals seldom touch it; meta as long (renew.lua extends it only with it).
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

-- `life`: a waiter's claim on waking then need not touch the keys. `first` nil: ask.
local function new_lease(tok, mode, ttl, owner, info, now, now_us, first, keep_ms, life)
  if first == nil then
    first = lease_count() == 0
  end
  local fence, expiry = put_lease(tok, mode, ttl, owner, info, now, now_us)
  no_leases = false
  life = life or ttl
  keep_lease_keys(life + GRACE_MS, life, first, keep_ms)
  return fence, expiry
end

-- Tenants: K.tenants holds '<id: 16 hex><priority: 8 hex, 0 first><arrival: 15 digits><token>';
-- the queue one place '#<id>' per tenant, which goes to the end when served: tenants take turns.
local SLOT = '#'
local MEMBER_LEN = 39 -- tenant id, priority and arrival: the token follows

local function slot_of(member)
  return SLOT .. string.sub(member, 1, 16)
end

local function tenant_next(slot)
  local id = string.sub(slot, 2)
  local first = redis.call('ZRANGEBYLEX', K.tenants, '[' .. id, '(' .. id .. '~', 'LIMIT', 0, 1)[1]
  if first then
    return first, string.sub(first, MEMBER_LEN + 1)
  end
  return nil, nil
end

-- (A tenant's task has no place of its own in the queue: its record says it waits.)
local function in_line(tok)
  return redis.call('HGET', K.meta, 'q:' .. tok) ~= false
end

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

-- A parked task never published goes back to its place (`raw`: its only copy), its tenant's too.
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

-- (A parked task goes back before the fields go: its turn is one.)
local function drop_lease(tok, rec)
  rec = rec or read_lease(tok)
  redis.call('ZREM', K.leases, tok)
  local parked = is_parked_token(tok) and redis.call('HGET', K.meta, 'p:' .. tok)
  local requeued = parked and requeue(tok, parked) or false
  redis.call('HDEL', K.meta, unpack(lease_fields(tok, rec)))
  return requeued
end

-- `own`: a plain caller's mode (its record need not be read). Returns the tenant's place if any.
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

local function parked_count()
  return tonumber(redis.call('HGET', K.meta, 'qp') or '0') or 0
end

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

-- A parked task past its deadline keeps its record, to be published as expired, not vanish.
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

local function start(now)
  if queue_exists() then
    purge(now)
    return true
  end
  return purge_leases(now) -- a parked task may be back in line
end
