-- _bucket.lua (a part, not a script; see scripts.py): one rate limit's bucket (rate.lua).
-- Defines: KEEP_MS, bucket_of, need_of, slot_for, start_need_of, start_for, note_start,
-- save_bucket.
-- #include _time.lua

-- Forgetting a request (a retry, a start asking again) costs a spare slot, never one too many.
local KEEP_MS = 30000

-- Nil and an error if a runtime limit is malformed (hand-written: the admin API checks its own).
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
  b.interval = math.ceil((per + slack) * 1000 / limit) -- rounded up: it never lets more in
  b.size = burst * b.interval
  b.start_interval = math.ceil((per + slack / 2) * 1000 / limit)
  b.start_size = burst * b.start_interval
  local state = redis.call('HMGET', b.key, 'tat', 'last', 'paused', 'started', 'last_start')
  b.tat = math.max(tonumber(state[1]) or 0, now) -- at or past tat the bucket is full
  b.last = tonumber(state[2]) or 0
  b.paused = tonumber(state[3]) or 0
  b.had_pause = state[3] ~= false
  b.started = tonumber(state[4]) or 0
  b.last_start = tonumber(state[5]) or 0
  b.had_start = state[4] ~= false
  if b.paused <= now then
    b.paused = 0
  end
  return b
end

local function need_of(b, units)
  return math.ceil(units * b.interval)
end

-- Never before the last slot (a limit raised, a clock stepped back) nor in the pause.
local function slot_for(b, need)
  return math.max(b.now, b.tat + math.min(need, b.size) - b.size, b.last, b.paused)
end

local function start_need_of(b, units)
  return math.ceil(units * b.start_interval)
end

-- Half the slack lets starts catch up: at most burst + w / start_interval units in any w us.
local function start_for(b, need)
  local from = b.started + math.min(need, b.start_size) - b.start_size
  return math.max(b.now, from, b.last_start, b.paused)
end

local function note_start(b, need, at)
  b.started, b.last_start = math.max(b.started, at) + need, at
end

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
