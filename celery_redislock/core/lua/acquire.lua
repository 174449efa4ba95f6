-- acquire.lua: take a lease, re-enter one, or wait in line for one.
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants, 8 limits (see _lock.lua)
-- ARGV: 1 token (run again, the same lease), 2 spec, 3 flags 'wait woke once park' (0 | 1: stay
--   queued; woken; refuse an owner's re-entry; park), 4 owner, 5 info (JSON), 6 job (status 2 if
--   finished), 7 claim id (the first takes a parked task's lease, others get 3) ('' none for 4,
--   6, 7); park: 8 payload, 9 wait ms, 10 max parked, 11 publish ms, 12 tenant (24 hex or '')
-- Returns 'status token fence expiry count next mode granted...': next the ms to the first lease
--   expiry or pause end; status 1 held, 0 not (queued if wait), -1 upgrade refused, 2 job done,
--   3 owner holds a live lease (once), 4 parked, 5 line full; granted: waiters handed it (fair).
-- #include _lock.lua

local tok, owner, info, job = ARGV[1], ARGV[4], ARGV[5], ARGV[6]
local mode, limit, ttl, fair, entry_ms, keep_ms = parse_spec(ARGV[2])
local wait, woke = string.sub(ARGV[3], 1, 1) == '1', string.sub(ARGV[3], 2, 2) == '1'
local once, park = string.sub(ARGV[3], 3, 3) == '1', string.sub(ARGV[3], 4, 4) == '1'
local claim_id = ARGV[7] or ''
local now, now_us = server_now()
promote(now)

local function job_done()
  if job == '' then
    return false
  end
  local until_ms = redis.call('ZSCORE', K.done, job)
  return until_ms and tonumber(until_ms) > now
end

-- Fast path: no lease, waiter, cap or pause; before the other parts are included (defining them
-- costs about a few commands). EXISTS counts a key per naming: leases 1, queue 2, limits 4.
local present = redis.call('EXISTS', K.leases, K.queue, K.queue, K.limits, K.limits, K.limits,
  K.limits)
if present == 0 then
  if job_done() then
    return reply({2, '-', 0, 0, 0, 0, mode})
  end
  local fence, expiry = put_lease(tok, mode, ttl, owner, info, now, now_us)
  if claim_id ~= '' then -- a parked task's token: this call's delivery holds it (see held())
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id)
  end
  -- Meta (the fence mark) keeps `keep_ms`, as after tidy(); nothing else to keep: no PTTL.
  local need = ttl + GRACE_MS
  redis.call('PEXPIRE', K.meta, int(math.max(need + ttl, keep_ms)))
  redis.call('PEXPIRE', K.leases, need + ttl)
  return reply({1, tok, fence, expiry, 1, 0, mode})
end

-- #include _grant.lua
-- #include _wait.lua

keys_present(present)
limits_present(present >= 4)
local waiters = start(now)

local function held(token, fence, expiry, count, granted, lease_mode)
  -- The delivery that took a parked task's lease holds it (HGET, HSET: HSETNX is not ACL-listed).
  if token == tok and claim_id ~= '' and redis.call('HGET', K.meta, 'c:' .. tok) == false then
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id)
  end
  return reply(append({1, token, fence, expiry, count, 0, lease_mode or mode}, granted))
end

local function not_held_as(status, count, granted)
  if queue_exists() then
    keep_waiters(entry_ms)
  else
    tidy(keep_ms)
  end
  return reply(append({status, '-', 0, 0, count, next_expiry(now), mode}, granted))
end

local function not_held(granted)
  return not_held_as(0, 0, granted)
end

-- Ours already: this call ran before (a lost reply), or fair mode handed it to us (full ttl).
local mine_at = lease_expiry(tok)
if mine_at then
  local expiry = tonumber(mine_at)
  local claim = is_parked_token(tok) and redis.call('HGET', K.meta, 'c:' .. tok)
  if claim and claim ~= claim_id then
    local rec = read_lease(tok)
    if claim ~= '' then
      return reply({3, tok, rec.f, 0, rec.c, expiry - now, rec.m})
    end
    -- The claimant's info replaces the parker's: release_where by pid must find the runner.
    redis.call('HSET', K.meta, 'c:' .. tok, claim_id, 'i:' .. tok, info)
    redis.call('HDEL', K.meta, 'p:' .. tok)
    -- A ttl from now: a claimant that dies at once holds it a ttl, not the window's rest.
    expiry = now + ttl
    redis.call('ZADD', K.leases, int(expiry), tok)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
    return held(tok, rec.f, expiry, rec.c, {}, rec.m)
  end
  if fair and expiry < now + ttl then
    expiry = now + ttl
    redis.call('ZADD', K.leases, int(expiry), tok)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
  end
  local rec = read_lease(tok)
  return held(tok, rec.f, expiry, rec.c, {}, rec.m)
end

if job_done() then
  return reply({2, '-', 0, 0, 0, 0, mode})
end

-- The owner's lease answers: a place in line from an earlier try goes, not to hold it up.
local own = not park and not is_parked_token(tok) and mode or nil

local function placed_in_line()
  if is_parked_token(tok) then
    return in_line(tok)
  end
  return redis.call('ZSCORE', K.queue, tok) ~= false
end

local function leave_line()
  if not (waiters and placed_in_line()) then
    return {}
  end
  dequeue(tok, nil, own)
  if fair then
    return grant(now, now_us, tok, keep_ms)
  end
  if queue_exists() then
    wake_one()
  end
  return {}
end

if owner ~= '' then
  local mine = redis.call('HGET', K.meta, 'o:' .. owner)
  local mine_expiry = mine and lease_expiry(mine)
  if mine_expiry then
    mine_expiry = tonumber(mine_expiry)
    local rec = read_lease(mine)
    local granted = leave_line()
    if applied(rec, tok) then -- this re-entry ran before: it counts once
      return held(mine, rec.f, mine_expiry, rec.c, granted, rec.m)
    end
    if once then -- the owner holds a lease already: say so, with the ms it has left
      local left = mine_expiry - now
      return reply(append({3, mine, rec.f, 0, rec.c, left, rec.m}, granted))
    end
    if rec.m == 'r' and mode == 'w' then
      return reply(append({-1, mine, rec.f, 0, rec.c, 0, rec.m}, granted))
    end
    rec.c = rec.c + 1
    note_request(rec, tok)
    write_lease(mine, rec)
    local expiry = math.max(mine_expiry, now + ttl)
    redis.call('ZADD', K.leases, int(expiry), mine)
    keep_lease_keys(expiry - now + GRACE_MS, ttl)
    return held(mine, rec.f, expiry, rec.c, granted, rec.m)
  end
end

if park then
  local parked = waiters and parked_count() or 0
  -- A task that may not run waits in line as data (non-fair, with room: taken as by anyone).
  local own_raw = nil -- this call's entry record, when it wrote it
  local tenant = ARGV[12] or ''
  if tenant == '' then
    tenant = nil
  elseif not string.match(tenant, '^' .. string.rep('%x', 24) .. '$') then
    return redis.error_reply('acquire: the tenant must be 24 hex digits, got ' .. tenant)
  end
  if not placed_in_line() then
    if not fair and parked == 0 then
      local writer_waits = mode == 'r' and tonumber(redis.call('HGET', K.meta, 'qw') or '0') or 0
      local room, empty = fits(mode, limit)
      if room and writer_waits == 0 then
        local fence, expiry = new_lease(tok, mode, ttl, owner, info, now, now_us, empty or false,
          keep_ms)
        return held(tok, fence, expiry, 1, {})
      end
    end
    local most = tonumber(ARGV[10])
    if most > 0 and parked >= most then
      return not_held_as(5, parked, {})
    end
    local wait_ms = tonumber(ARGV[9])
    local seq, raw = enqueue(tok, mode, limit, ttl, owner, info, entry_ms, tonumber(ARGV[11]),
      tenant)
    own_raw = raw
    redis.call('ZADD', K.qdl, int(now + wait_ms), tok)
    redis.call('HSET', K.meta, 'p:' .. tok,
      cjson.encode({s = seq, d = int(now + wait_ms), q = raw, x = ARGV[8]}))
    -- Kept past the deadline: a sweep must publish it as expired (the payload is its only copy).
    keep({K.meta, K.queue, K.qdl}, wait_ms + keep_ms, entry_ms)
    if tenant then
      keep({K.tenants}, wait_ms + keep_ms, entry_ms)
    end
  end
  local granted = grant(now, now_us, tok, keep_ms, own_raw)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry then
    return held(tok, read_lease(tok).f, tonumber(expiry), 1, granted)
  end
  return not_held_as(4, parked_count(), granted)
end

if fair then
  local own_raw = nil -- this call's entry record, when it wrote it
  if not redis.call('ZSCORE', K.queue, tok) then
    local _, raw = enqueue(tok, mode, limit, ttl, owner, info, entry_ms)
    own_raw = raw
  end
  redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
  local granted = grant(now, now_us, tok, keep_ms, own_raw)
  local expiry = redis.call('ZSCORE', K.leases, tok)
  if expiry then
    return held(tok, read_lease(tok).f, tonumber(expiry), 1, granted)
  end
  if not wait then
    dequeue(tok, nil, own)
    append(granted, grant(now, now_us, tok, keep_ms))
  end
  return not_held(granted)
end

-- Non-fair: take free room; readers yield to a queued writer, everyone to a parked task.
local queued = waiters and redis.call('ZSCORE', K.queue, tok)
local room, empty = fits(mode, limit)
if room and (tonumber(mode == 'r' and redis.call('HGET', K.meta, 'qw') or '0') or 0) == 0
  and (not waiters or parked_count() == 0) then
  if queued then
    dequeue(tok, nil, own)
  end
  local fence, expiry = new_lease(tok, mode, ttl, owner, info, now, now_us, empty or false,
    keep_ms)
  if waiters and limit ~= 1 and fits(mode, limit) and queue_exists() then
    wake_one()
  end
  return held(tok, fence, expiry, 1, {})
end
if wait then
  if not queued then
    enqueue(tok, mode, limit, ttl, owner, info, entry_ms)
  end
  redis.call('ZADD', K.qdl, int(now + entry_ms), tok)
elseif queued then
  dequeue(tok, nil, own)
end
-- Pass the signal on, unless paused (waiters would wake each other until it ends).
if woke and lease_count() == 0 and pause_left() == 0 and queue_exists() then
  wake_one()
end
return not_held({})
