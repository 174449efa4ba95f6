-- common.lua: the lock scripts' helpers, after lockbase.lua (its keys K and lease-record
-- helpers) and _time.lua; included by each lock script after its fast path (see scripts.py),
-- not a script of its own.

-- Whether anyone waited when the script started (set by start()). While nobody waits, the
-- meta key holds nothing that must outlive the leases, so it need not be checked first.
local waiters_seen = true

-- What this call learnt already, so that it does not ask again (each command costs; a local
-- variable costs nothing). Its own writes keep them true.
local queue_known = nil -- whether anyone waits in line (nil: not known, ask)
local no_leases = false -- the lock is known to have no lease at all

-- Whether anyone waits in line.
local function queue_exists()
  if queue_known == nil then
    queue_known = redis.call('EXISTS', K.queue) == 1
  end
  return queue_known
end

-- `rec`: the lease's record, when the caller read it already.
-- Puts a parked task whose hand-over was never published (its publisher died, or its lease was
-- freed first) back in line, at its old place: the payload is the only copy of the task.
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
  if rec and rec.o ~= '' and redis.call('HGET', K.meta, 'o:' .. rec.o) == tok then
    redis.call('HDEL', K.meta, 'o:' .. rec.o)
  end
  redis.call('ZREM', K.leases, tok)
  if string.sub(tok, 1, 1) == LINE_PREFIX then
    local parked = redis.call('HGET', K.meta, 'p:' .. tok)
    redis.call('HDEL', K.meta, 'l:' .. tok, 'i:' .. tok, 'c:' .. tok)
    if parked and redis.call('ZSCORE', K.queue, tok) == false then
      requeue(tok, parked)
      return true
    end
    return false
  end
  redis.call('HDEL', K.meta, 'l:' .. tok, 'i:' .. tok)
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
    if string.sub(tok, 1, 1) == LINE_PREFIX and redis.call('HGET', K.meta, 'p:' .. tok) then
      local x = redis.call('HGET', K.meta, 'x')
      redis.call('HSET', K.meta, 'x', x and (x .. ' ' .. tok) or tok)
    end
  end
end

-- Purges what lapsed (waiter entries only when anyone waits); returns whether anyone waits.
local function start(now)
  waiters_seen = queue_exists()
  if waiters_seen then
    purge(now)
  else
    waiters_seen = purge_leases(now) -- a parked task may be back in line
  end
  return waiters_seen
end

-- Whether a new lease of `mode` fits beside the live ones; limit 0 means unbounded.
local function fits(mode, limit)
  local n = no_leases and 0 or redis.call('ZCARD', K.leases)
  if n == 0 then
    return true, true
  end
  -- The count first: a full lock needs no look at the mode.
  return (limit == 0 or n < limit) and redis.call('HGET', K.meta, 'm') == mode
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

-- Creates a lease. `info` is the holder's JSON record, stored as given. Keeps the lock's keys
-- alive at least as long as the new lease, or as `life` ms when given (a lease handed to a
-- waiter, which claims `life` on waking: the claim then need not touch the keys).
local function new_lease(tok, mode, ttl, owner, info, now, now_us, first, keep_ms, life)
  local last = tonumber(redis.call('HGET', K.meta, 'fence') or '0')
  local fence = int(math.max(last + 1, now_us))
  local expiry = now + ttl
  if first == nil then
    first = no_leases or redis.call('ZCARD', K.leases) == 0
  end
  redis.call('ZADD', K.leases, int(expiry), tok)
  no_leases = false
  redis.call('HSET', K.meta, 'fence', fence, 'm', mode,
    'l:' .. tok, mode .. '|1|' .. fence .. '||' .. owner, 'i:' .. tok, info)
  if owner ~= '' then
    redis.call('HSET', K.meta, 'o:' .. owner, tok)
  end
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

-- Fair mode: hands free capacity to waiters strictly in arrival order. Returns a flat list of
-- token, fence, expiry for each grant, so the caller can wake exactly those waiters. A lease
-- handed to a waiter lasts no longer than its place in line would have: a waiter that died in
-- line holds the lock for seconds, not a whole ttl; a live one claims the full ttl on waking.
-- The waiter `skip` is the caller itself, alive by definition: it gets its full ttl.
-- `skip_raw`: the caller's own entry record, when it wrote it in this call.
local function grant(now, now_us, skip, keep_ms, skip_raw)
  local out = {}
  while true do
    local head = redis.call('ZRANGE', K.queue, 0, 0)[1]
    if not head then
      break
    end
    local raw = head == skip and skip_raw or redis.call('HGET', K.meta, 'q:' .. head)
    local q = raw and cjson.decode(raw)
    -- A waiter whose owner holds a lease already (another call of the same owner was served
    -- first) gets no second lease: it leaves the line and is woken with none (fence 0), to try
    -- again and re-enter the owner's lease (or be refused, reentrant=False) as any call of an
    -- owner holding one. Capacity is not its concern, so this comes first.
    local mine = q and not q.p and q.o ~= '' and redis.call('HGET', K.meta, 'o:' .. q.o)
    if mine and redis.call('ZSCORE', K.leases, mine) then
      q = nil
      if head ~= skip then
        out[#out + 1] = head
        out[#out + 1] = 0
        out[#out + 1] = 0
      end
    end
    local room, empty = true, nil
    if q then
      room, empty = fits(q.m, q.n)
    end
    if not room then
      break
    end
    dequeue(head, raw)
    if q then
      -- A parked task's lease lasts until its hand-over is published (line_sent.lua extends
      -- it until the task starts); unclaimed ('c:' empty) until then.
      local ttl = head == skip and q.t or (q.p or math.min(q.t, q.e))
      local fence, expiry = new_lease(head, q.m, ttl, q.o, q.i, now, now_us, empty or false,
        keep_ms, not q.p and q.t or nil)
      if q.p then
        if head == skip then
          redis.call('HDEL', K.meta, 'p:' .. head)
        else
          redis.call('HSET', K.meta, 'c:' .. head, '')
        end
      end
      if head ~= skip then
        out[#out + 1] = head
        out[#out + 1] = fence
        out[#out + 1] = expiry
      end
    end
  end
  return out
end

-- Non-fair mode: one signal wakes the longest-blocked waiter, which then competes for the lock.
local function wake_one()
  redis.call('RPUSH', K.wake, '1')
  redis.call('PEXPIRE', K.wake, 2000)
end

-- Makes each key live at least `need` ms, with `slack` ms more so that later calls seldom need
-- to touch it again. Never shortens a key's life: others may need it for longer.
local function keep(keys, need, slack)
  for _, key in ipairs(keys) do
    if redis.call('PTTL', key) < need then
      redis.call('PEXPIRE', key, int(need + slack))
    end
  end
end

-- After a waiter joined or refreshed its place: the keys waiters need (their records in meta,
-- the line, the deadlines) live at least as long as the entry.
local function keep_waiters(entry_ms)
  keep({K.meta, K.queue, K.qdl}, entry_ms + GRACE_MS, entry_ms)
end

-- After a release: once nothing is held or queued, only the fence mark (and the tokens last
-- released) is left, for `keep_ms` (Redis drops the emptied sorted sets by itself). With no
-- line, no count of queued writers or parked tasks can be right but 0: a stale one would keep
-- newcomers out of free capacity.
local function tidy(keep_ms)
  if redis.call('EXISTS', K.leases) == 0 then
    redis.call('HDEL', K.meta, 'm', 'qseq', 'qw', 'qp')
    redis.call('PEXPIRE', K.meta, keep_ms)
  end
end

-- Milliseconds until the earliest live lease expires: when a waiter should look again even if
-- nobody wakes it (a holder that crashed never releases).
local function next_expiry(now)
  if no_leases then
    return 0
  end
  local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end

-- After leases were dropped: hands the lock on to waiters (fair: granted in order, appended to
-- `out` as token, fence, expiry; else one wake-up if anything was freed), or, when nobody
-- waits, lets the keys go once nothing is held.
local function hand_on(out, now, now_us, fair, freed, keep_ms)
  if queue_exists() then
    -- Parked tasks are served in arrival order whatever the lock's fairness: no wake-up
    -- reaches them, and newcomers queue behind them.
    if fair or parked_count() > 0 then
      for _, v in ipairs(grant(now, now_us, '', keep_ms)) do
        out[#out + 1] = v
      end
    elseif freed then
      wake_one()
    end
  else
    tidy(keep_ms)
  end
  return out
end
