-- acquire.lua: take a lease, re-enter one, or wait in line for one.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake (see common.lua)
-- ARGV: 1 token, 2 mode ('r' | 'w'), 3 limit (0 = unbounded), 4 ttl ms, 5 owner ('' = none),
--       6 info (JSON object), 7 fair (0 | 1), 8 wait (1: stay queued on failure),
--       9 queue entry lifetime ms, 10 woke (1: the caller was woken by a signal)
-- Returns {status, token, fence, expiry ms, reentry count, ms to next expiry, granted...}:
--   status 1 held, 0 not held (queued when wait = 1), -1 read-to-write upgrade refused;
--   granted is token, fence, expiry of other waiters this call handed the lock to (fair mode).
local tok, mode, limit, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local owner, info = ARGV[5], cjson.decode(ARGV[6])
local fair, wait, entry_ms, woke = ARGV[7] == '1', ARGV[8] == '1', tonumber(ARGV[9]), ARGV[10] == '1'
local now, now_us = server_now()
purge(now)

local function reply(status, held, fence, expiry, count, granted)
  settle(now)
  local out = {status, held, fence, expiry, count, next_expiry(now)}
  for _, v in ipairs(granted) do
    out[#out + 1] = v
  end
  return out
end

if owner ~= '' then
  local held = redis.call('HGET', K.meta, 'o:' .. owner)
  if held and redis.call('ZSCORE', K.leases, held) then
    local rec = cjson.decode(redis.call('HGET', K.meta, 'l:' .. held))
    if rec.m == 'r' and mode == 'w' then
      return reply(-1, held, rec.f, 0, rec.c, {})
    end
    rec.c = rec.c + 1
    redis.call('HSET', K.meta, 'l:' .. held, cjson.encode(rec))
    local expiry = math.max(tonumber(redis.call('ZSCORE', K.leases, held)), now + ttl)
    redis.call('ZADD', K.leases, int(expiry), held)
    return reply(1, held, rec.f, expiry, rec.c, {})
  end
end

if fair then
  -- Join the line (or refresh our place), let the line advance, and see whether we got it.
  if redis.call('ZSCORE', K.queue, tok) then
    redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
  else
    enqueue(tok, mode, limit, ttl, owner, info)
    redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
  end
  local granted = grant(now, now_us, tok)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry then
    local rec = cjson.decode(redis.call('HGET', K.meta, 'l:' .. tok))
    return reply(1, tok, rec.f, tonumber(expiry), 1, granted)
  end
  if not wait then
    dequeue(tok)
    for _, v in ipairs(grant(now, now_us, tok)) do
      granted[#granted + 1] = v
    end
  end
  return reply(0, '', 0, 0, 0, granted)
end

-- Non-fair: take free capacity, except that readers yield to a queued writer.
local queued = redis.call('ZSCORE', K.queue, tok)
local writers_waiting = tonumber(redis.call('HGET', K.meta, 'qw') or '0')
if fits(mode, limit) and not (mode == 'r' and writers_waiting > 0) then
  if queued then
    dequeue(tok)
  end
  local fence, expiry = new_lease(tok, mode, ttl, owner, info, now, now_us)
  -- Readers may share: pass the wake-up on so queued readers follow.
  if redis.call('ZCARD', K.queue) > 0 and fits(mode, limit) then
    wake_one()
  end
  return reply(1, tok, fence, expiry, 1, {})
end
if wait then
  if not queued then
    enqueue(tok, mode, limit, ttl, owner, info)
  end
  redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
elseif queued then
  dequeue(tok)
end
-- A waiter woken for a free lock it may not take (a writer is queued) passes the signal on.
if woke and redis.call('ZCARD', K.leases) == 0 and redis.call('ZCARD', K.queue) > 0 then
  wake_one()
end
return reply(0, '', 0, 0, 0, {})
