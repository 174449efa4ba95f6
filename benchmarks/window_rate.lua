-- window_rate.lua: the sliding-window rate limit that celery_redislock's `RateLimit` ran before
-- the GCRA bucket (celery_redislock/core/lua/rate.lua as of commit 9707e96), kept as a peer for
-- benchmarks/rate.py, which runs it with redis-py's `register_script`. The parts it included
-- from _time.lua (`server_now`, `int`, `GRACE_MS`) are inlined below; nothing else changed.
-- Not used by the package.
--
-- A fleet-wide rate limit, a sliding window of reserved start slots.
-- KEYS: 1 log  sorted set: request id -> its slot (server ms); the rate limit's name is the
--              hash tag. It holds the recent and the future slots, so it is both the window
--              and the record that makes a request run twice get the same slot.
-- ARGV: 1 op: 'r' reserve a slot for a request, 'u' usage (reads only)
--       2 request id ('r'; chosen by the client, so a call run twice is one request)
--       3 limit (starts per window), 4 per (the window, ms)
--       5 max delay ms, or '' for none ('r': refuse a new slot further ahead than this)
--       6 max late ms, or '' for none ('r': a known request whose slot passed more than this
--         long ago gets a new slot, at the back; its stale slot is given up)
-- Returns one string:
--   'r': 'granted slot delay': granted 1 (the slot is this request's) or 0 (refused: it would
--        be more than max delay ahead; nothing reserved); slot in server ms; delay = slot - now
--        in ms, at least 0
--   'u': 'started ahead slot delay': slots in (now - per, now], slots after now, and the slot
--        the next new request would get, with its delay
--
-- The invariant: any `per` ms of server time hold at most `limit` slots. Slots are handed out
-- in request order, never decreasing: a new slot is the latest of now, the last slot, and the
-- limit-th most recent slot + per.

-- From _time.lua: how long the log outlives its last slot.
local GRACE_MS = 1000

-- The server's TIME, in ms and in us (server time, never the client's: clients' clocks differ).
local function server_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Numbers go to Redis as exact integers (Lua's default formatting keeps only 14 digits).
local function int(n)
  return string.format('%.0f', n)
end

-- How long a request id is remembered after its slot (a call run again after a lost reply, a
-- re-published task asking again), and how many ids are kept at most (never fewer than
-- `limit`, which the window needs). Forgetting one costs a spare slot, never a slot too many.
local KEEP_MS = 120000
local KEPT = 10000

local op, id = ARGV[1], ARGV[2]
local limit, per = tonumber(ARGV[3]), tonumber(ARGV[4])
local log = KEYS[1]
local now = server_now()

-- The slot a new request gets now.
local function next_free()
  local slot = now
  local top = redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2]
  if top then
    -- A server clock that stepped back must not hand out a slot before one given already.
    slot = math.max(slot, tonumber(top))
  end
  local kth = top
  if limit > 1 then
    kth = redis.call('ZREVRANGE', log, limit - 1, limit - 1, 'WITHSCORES')[2]
  end
  if kth then
    slot = math.max(slot, tonumber(kth) + per)
  end
  return slot
end

local function answer(a, slot)
  return int(a) .. ' ' .. int(slot) .. ' ' .. int(math.max(slot - now, 0))
end

if op == 'u' then
  local started = redis.call('ZCOUNT', log, '(' .. int(now - per), int(now))
  local ahead = redis.call('ZCOUNT', log, '(' .. int(now), '+inf')
  local slot = next_free()
  return int(started) .. ' ' .. int(ahead) .. ' ' .. int(slot) .. ' ' .. int(slot - now)
end

local max_delay, max_late = tonumber(ARGV[5]), tonumber(ARGV[6])
local known = redis.call('ZSCORE', log, id)
if known then
  known = tonumber(known)
  if not max_late or now - known <= max_late then
    return answer(1, known)
  end
  -- Too late to start at its slot (a start that lags its slot would crowd the slots after it):
  -- the slot was never used, so giving it up leaves every window within the limit.
  redis.call('ZREM', log, id)
end

-- Slots that left the window and whose ids need not be remembered.
redis.call('ZREMRANGEBYSCORE', log, '-inf', '(' .. int(now - math.max(per, KEEP_MS)))
local slot = next_free()
if max_delay and slot - now > max_delay then
  return answer(0, slot)
end
redis.call('ZADD', log, int(slot), id)
-- The oldest ids beyond the number kept (nothing when there are fewer).
redis.call('ZREMRANGEBYRANK', log, 0, -(math.max(limit, KEPT) + 1))
-- The new slot is the last: the log is needed until it has left the window, and its id for
-- KEEP_MS after it. An idle limit costs nothing after that.
redis.call('PEXPIRE', log, int(slot - now + math.max(per, KEEP_MS) + GRACE_MS))
return answer(1, slot)
