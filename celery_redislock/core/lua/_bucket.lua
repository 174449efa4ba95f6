-- _bucket.lua (a part, not a script; see scripts.py): one rate limit's bucket (see rate.lua):
-- the limits in effect (the caller's, or those set at runtime), its state, the slot a cost
-- gets in it, and saving it.
-- Defines: KEEP_MS, bucket_of, need_of, slot_for, start_need_of, start_for, note_start,
-- save_bucket.

-- #include _time.lua

-- How long a request is remembered after its slot (a call run again after a lost reply, a
-- task published again asking again as it starts, a few ms or s after its slot). Forgetting
-- one costs a spare slot, never one too many.
local KEEP_MS = 30000

-- The bucket whose keys are KEYS[k] (the bucket), KEYS[k + 1] (a request's record) and
-- KEYS[k + 2] (the limits set at runtime), under the caller's limit, per (ms), burst and slack
-- (ms), at server time `now` (us). Nil and an error message if a runtime limit is malformed
-- (written by hand: the admin API checks what it writes).
local function bucket_of(k, limit, per, burst, slack, now)
  local b = {key = KEYS[k], request = KEYS[k + 1], now = now}
  local set = redis.call('HMGET', KEYS[k + 2], 'rate', 'burst')
  if set[1] then
    local l, p = string.match(set[1], '^(%d+) (%d+)$')
    l, p = tonumber(l), tonumber(p)
    -- (as rate_options.py allows: 1 to 1e9 units, 1 ms to 7 days, at most 1e6 units a second)
    if not l or l < 1 or l > 1e9 or p < 1 or p > 604800000 or l > p * 1000 then
      return nil, 'ERR rate limit: the runtime rate in ' .. KEYS[k + 2] .. " is malformed: '"
        .. set[1] .. "'"
    end
    limit, per = l, p
  end
  if set[2] then
    local n = tonumber(set[2])
    if not n or n ~= math.floor(n) or n < 1 or n > 1e9 then
      return nil, 'ERR rate limit: the runtime burst in ' .. KEYS[k + 2] .. " is malformed: '"
        .. set[2] .. "'"
    end
    burst = n
  end
  b.limit, b.per, b.burst = limit, per, burst
  -- Time per unit, in us; whole us, rounded up (a longer interval never lets more in).
  b.interval = math.ceil((per + slack) * 1000 / limit)
  b.size = burst * b.interval
  -- The starts' bucket runs a little faster, with half the slack (see start_for).
  b.start_interval = math.ceil((per + slack / 2) * 1000 / limit)
  b.start_size = burst * b.start_interval
  local state = redis.call('HMGET', b.key, 'tat', 'last', 'paused', 'started', 'last_start')
  -- At or past tat the bucket is full (a cost above the burst waits for more than a full one).
  b.tat = math.max(tonumber(state[1]) or 0, now)
  b.last = tonumber(state[2]) or 0
  b.paused = tonumber(state[3]) or 0
  b.had_pause = state[3] ~= false
  -- The same bucket over the starts noted (see start_for): started is its tat, last_start the
  -- latest start noted.
  b.started = tonumber(state[4]) or 0
  b.last_start = tonumber(state[5]) or 0
  b.had_start = state[4] ~= false
  if b.paused <= now then
    b.paused = 0
  end
  return b
end

-- The cost of `units`, in us of bucket `b`.
local function need_of(b, units)
  return math.ceil(units * b.interval)
end

-- The slot a request of `need` us gets now in `b`: the bucket holds it (a cost above the burst:
-- the bucket is full, and later calls pay the rest back), not before the last slot (a limit
-- raised at runtime, a server clock that stepped back) nor in the pause.
local function slot_for(b, need)
  return math.max(b.now, b.tat + math.min(need, b.size) - b.size, b.last, b.paused)
end

-- The cost of `units` in the starts' bucket of `b`, in us.
local function start_need_of(b, units)
  return math.ceil(units * b.start_interval)
end

-- The earliest start, at or after now, that keeps the starts noted in `b` within the rate: the
-- bucket again, over the starts (`need` from start_need_of). A start late after its slot may
-- start at once if the starts before it left room (they came late too, or fewer); the starts
-- after it then wait their turn. The starts' interval takes half the slack: slots come slower
-- than starts may, so the starts catch up after a late one, and a start may still lag the time
-- noted a little. So the starts hold at most burst + w / start_interval units in any window of
-- w us (with burst 1: at most `limit` in any `per`). Never before the last start noted (starts
-- are noted in order) nor in a pause.
local function start_for(b, need)
  local from = b.started + math.min(need, b.start_size) - b.start_size
  return math.max(b.now, from, b.last_start, b.paused)
end

-- Notes a start of `need` us at `at` (from start_for).
local function note_start(b, need, at)
  b.started, b.last_start = math.max(b.started, at) + need, at
end

-- Keeps the bucket as long as it says anything: past tat, the last slot and the pause it is a
-- full bucket; past `started`, the starts noted say nothing more.
local function save_bucket(b)
  local life = math.max(b.tat, b.last, b.paused, b.started) - b.now
  if life > 0 then
    if b.paused > 0 then
      redis.call('HSET', b.key, 'tat', int(b.tat), 'last', int(b.last), 'paused', int(b.paused))
    else
      redis.call('HSET', b.key, 'tat', int(b.tat), 'last', int(b.last))
      if b.had_pause then
        redis.call('HDEL', b.key, 'paused')
      end
    end
    if b.started > b.now then
      redis.call('HSET', b.key, 'started', int(b.started), 'last_start', int(b.last_start))
    elseif b.had_start then
      redis.call('HDEL', b.key, 'started', 'last_start')
    end
    redis.call('PEXPIRE', b.key, int(math.ceil(life / 1000) + GRACE_MS))
  else
    redis.call('DEL', b.key)
  end
end
