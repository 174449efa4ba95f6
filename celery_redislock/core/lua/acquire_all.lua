-- acquire_all.lua: take a lease in each of several locks, or in none (a task's lock= list).
-- KEYS: the eight keys of each lock (see _lock.lua), lock after lock, in the order of ARGV's.
-- ARGV: 1 once ('0' | '1'; '1': an owner holding a live lease in any of the locks is refused),
--       2 owner ('' = none), 3 info (JSON object, stored as given with each lease),
--       4 job ('' = none): refused with status 2 if the first lock records it as finished,
--       5.. two per lock: the lease's token (chosen by the client, one per lock: run again
--         with them, this call answers the leases it made, never second ones) and the lock's
--         spec 'mode limit ttl fair entry keep' (see parse_spec in _lock.lua).
-- Returns 'status index ms fence expiry fence expiry ...' (one string, space-separated):
--   status 1 held: a fence and an expiry (server ms) follow for each lock, in order;
--   0 not held: lock `index` (1-based) has no room now, ms until its earliest lease lapses
--   (0: none, or it waits for its line); 2 the job is finished already; 3 the owner holds a
--   live lease in lock `index` (once = 1), with `ms` left; 4 this call ran before and its lease
--   in lock `index` is gone since: the caller gives back the others.
-- Nothing is written unless every lock has room (but for what lapsed, which any call purges):
-- a call refused holds nothing, and none waits in any line (a caller that waits asks again).

-- #include _grant.lua
-- #include _wait.lua

local once, owner, info, job = ARGV[1] == '1', ARGV[2], ARGV[3], ARGV[4]
local count = (#ARGV - 4) / 2
local now, now_us = server_now()

-- Turns the helpers to lock `i`: its keys, and nothing remembered of another lock.
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

-- This very call ran before (its reply was lost and the client sent it again): it answers the
-- leases it made. They were made together; should one be gone since (lapsed, or released by
-- hand), the call answers 4 and the client gives the others back (release.lua hands each lock
-- on as a release does).
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

-- Every lock, looked at before anything is written: what lapsed goes, then whether a new
-- lease fits now as a newcomer's would in acquire.lua (free capacity; readers yield to a
-- queued writer; everyone to a parked task, and to the line of a fair lock).
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
