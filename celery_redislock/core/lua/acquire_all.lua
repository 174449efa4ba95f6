-- acquire_all.lua: take a lease in each of several locks, or in none (a task's lock= list).
-- KEYS: the eight keys of each lock (see _lock.lua), lock after lock.
-- ARGV: 1 once ('1': refuse an owner's live lease), 2 owner, 3 info, 4 job ('' none; in the
--   first lock), 5.. per lock: token (run again, the same leases) and spec
-- Returns 'status index ms fence expiry ...': 1 held, fence and expiry per lock; 0 no room in lock
--   `index` (ms to its first expiry), 3 the owner holds it; 2 job finished; 4 rerun, lease gone.
-- #include _grant.lua
-- #include _wait.lua

local once, owner, info, job = ARGV[1] == '1', ARGV[2], ARGV[3], ARGV[4]
local count = (#ARGV - 4) / 2
local now, now_us = server_now()

local function use(i)
  use_lock_keys((i - 1) * 8)
  promote(now)
  forget_lock_state()
  forget_runtime_limits()
end

local function token(i)
  return ARGV[3 + 2 * i]
end

local function spec(i)
  return parse_spec(ARGV[4 + 2 * i])
end

use(1)
if lease_expiry(token(1)) then
  local out = {1, 0, 0}
  for i = 1, count do
    use(i)
    local expiry = lease_expiry(token(i))
    if not expiry or tonumber(expiry) <= now then
      return reply({4, i, 0})
    end
    append(out, {read_lease(token(i)).f, tonumber(expiry)})
  end
  return reply(out)
end

if job ~= '' then
  local until_ms = redis.call('ZSCORE', K.done, job)
  if until_ms and tonumber(until_ms) > now then
    return reply({2, 1, 0})
  end
end

-- A new lease fits as a newcomer's in acquire.lua, in every lock before any write.
for i = 1, count do
  use(i)
  local mode, limit, _, fair, _, keep_ms = spec(i)
  local waiters = start(now)
  if once and owner ~= '' then
    local mine = redis.call('HGET', K.meta, 'o:' .. owner)
    local mine_expiry = mine and lease_expiry(mine)
    if mine_expiry then
      return reply({3, i, tonumber(mine_expiry) - now})
    end
  end
  local room = fits(mode, limit)
  if room and mode == 'r' then
    room = tonumber(redis.call('HGET', K.meta, 'qw') or '0') == 0
  end
  if room and waiters then
    room = not fair and parked_count() == 0
  end
  if not room then
    if not waiters then
      tidy(keep_ms)
    end
    return reply({0, i, next_expiry(now)})
  end
end

local out = {1, 0, 0}
for i = 1, count do
  use(i)
  local mode, _, ttl, _, _, keep_ms = spec(i)
  local fence, expiry = new_lease(token(i), mode, ttl, owner, info, now, now_us, nil, keep_ms)
  append(out, {fence, expiry})
end
return reply(out)
