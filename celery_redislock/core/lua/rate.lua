-- rate.lua: fleet-wide rate limits with costs and a burst: GCRA buckets handing out start slots
-- in request order, O(1) per limit and call; a call takes one slot in all its limits, or none.
-- KEYS: three per limit, one hash slot: bucket (hash), request ('slot_us cost[ start_us[ w]]'
--   per request id: asked twice, the same slot; 'u', 'p', 'q': any key), limits (runtime)
-- ARGV: 1 op 'r' reserve, 's' settle the actual cost, 'u' usage, 'p' pause, 'q' resume (all but
--   'r': first limit only), 2 limit, 3 per ms, 4 burst, 5 cost ('s' actual, 'p' pause ms), 6 'r'
--   max delay ms, 's' estimate, 7 'r' max late ms (notes starts), 8 slack ms (lagging starts keep
--   the rate), 9 'r' near ms ('' 6-9: none), 10.. 'r' next limits: limit, per, burst, cost, slack
-- Returns 'granted slot_ms delay_ms limit per_ms burst paused_ms tat_ms now_ms by started':
--   granted 0 refused by max delay; `by` the limit that set the slot, with its figures; started
--   1 start at slot, 0 come back then. Any w ms hold at most burst + w * limit / per units.
-- #include _bucket.lua

local START_WAIT_US = 1000000 -- a due start waits in place up to near + this (or max late)
local op = ARGV[1]
local _, now = server_now()
local first, malformed = bucket_of(1, tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[8]) or 0, now)
if not first then
  return redis.error_reply(malformed)
end
local buckets = {first}

-- (tostring keeps 13 digits, and costs less than string.format)
local function ms(us)
  return tostring(math.floor(us / 1000))
end

local function answer(granted, slot, by, started)
  local b = buckets[by or 1]
  return granted .. ' ' .. ms(slot) .. ' ' .. tostring(math.ceil(math.max(slot - now, 0) / 1000))
    .. ' ' .. tostring(b.limit) .. ' ' .. tostring(b.per) .. ' ' .. tostring(b.burst) .. ' '
    .. ms(b.paused) .. ' ' .. ms(b.tat) .. ' ' .. ms(now) .. ' ' .. (by or 1) .. ' '
    .. (started or 0)
end

local function parse_record(got)
  local at, units, start, wait = string.match(got, '^(%d+) (%S+) ?(%d*) ?(w?)$')
  return tonumber(at), units, tonumber(start), wait == 'w' or nil
end

if op == 'p' or op == 'q' then
  first.paused = op == 'p' and math.max(first.paused, now + tonumber(ARGV[5]) * 1000) or 0
  save_bucket(first)
end
if op == 'u' or op == 'p' or op == 'q' then
  return answer(1, slot_for(first, need_of(first, 1)))
end

local known = redis.call('GET', first.request)
local slot, cost, began
if known then
  slot, cost, began = parse_record(known)
  cost = tonumber(cost)
end

if op == 's' then
  local actual = tonumber(ARGV[5])
  local estimate = cost or tonumber(ARGV[6]) or actual
  -- The starts owe or get back the same, so starts on time still pass.
  if actual > estimate then -- more than reserved: the bucket owes the difference
    first.tat = math.max(first.tat, now) + need_of(first, actual - estimate)
    if first.started > now then
      first.started = first.started + start_need_of(first, actual - estimate)
    end
  elseif actual < estimate then -- less: given back, never past a full bucket
    first.tat = math.max(first.tat - math.floor((estimate - actual) * first.interval), now)
    if first.started > now then
      local back = math.floor((estimate - actual) * first.start_interval)
      first.started = math.max(first.started - back, now)
    end
  end
  save_bucket(first)
  local life = slot and math.max(slot - now, 0) / 1000 + KEEP_MS or KEEP_MS
  local start = began and ' ' .. int(began) .. (string.match(known, ' w$') and ' w' or '') or ''
  redis.call('SET', first.request, int(slot or now) .. ' ' .. ARGV[5] .. start, 'PX',
    int(math.ceil(life)))
  return answer(1, slot or now)
end

-- 'r': near, all limits take the slot; further, only those whose own is far (room unused).
local costs, units = {tonumber(ARGV[5])}, {ARGV[5]}
local near = (tonumber(ARGV[9]) or 0) * 1000
for i = 2, #KEYS / 3 do
  local a = 10 + (i - 2) * 5
  buckets[i], malformed = bucket_of(3 * i - 2, tonumber(ARGV[a]), tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 4]) or 0, now)
  if not buckets[i] then
    return redis.error_reply(malformed)
  end
  costs[i], units[i] = tonumber(ARGV[a + 3]), ARGV[a + 3]
end
local max_delay, max_late = tonumber(ARGV[6]), tonumber(ARGV[7])

-- A slot goes after a pause, or a start over max late ago; not given back (a spare slot only).
local late = max_late and max_late * 1000
local own, needs, kept, noted, waits = {}, {}, {}, {}, {}
local all_kept, all_started = true, true
slot = 0
local by = 1
for i, b in ipairs(buckets) do
  local got = known
  if i > 1 then
    got = redis.call('GET', b.request)
  end
  local at, was, start, wait
  if got then
    at, was, start, wait = parse_record(got)
  end
  local rerun = late and start and not wait and now - start > late
  if at and not ((b.paused > 0 and at < b.paused) or rerun) then
    own[i], kept[i], noted[i], waits[i] = at, true, start, wait
    needs[i], units[i] = need_of(b, tonumber(was)), was
    all_started = all_started and start ~= nil and not wait
  else
    all_kept, all_started = false, false
    if at then
      redis.call('DEL', b.request)
    end
    needs[i] = need_of(b, costs[i])
    own[i] = slot_for(b, needs[i])
  end
  if own[i] > slot then
    slot, by = own[i], i
  end
end
if all_kept and (not late or all_started) then
  if late then
    return answer(1, noted[1], by, 1)
  end
  return answer(1, slot, by)
end
if not all_kept and max_delay and slot - now > max_delay * 1000 then
  for i, b in ipairs(buckets) do
    if kept[i] then
      redis.call('DEL', b.request)
    end
  end
  return answer(0, slot, by)
end
local whole = slot - now <= near
for i, b in ipairs(buckets) do
  if not kept[i] and (whole or own[i] - now > near) then
    local at = whole and slot or own[i]
    b.tat, b.last = math.max(b.tat, at) + needs[i], at
    save_bucket(b)
    local life = math.ceil((at - now) / 1000) + KEEP_MS
    redis.call('SET', b.request, int(at) .. ' ' .. units[i], 'PX', int(life))
    own[i] = at
  end
end
if not (late and whole) then
  return answer(1, slot, by)
end

-- Within near + max late (at least 1 s) a due start waits in place, further it comes back ('w').
local soon = near + math.max(late, START_WAIT_US)
local held = true
for i = 1, #buckets do
  held = held and waits[i] ~= nil and noted[i] == noted[1] and now - noted[i] <= late
end
local at, at_by = noted[1], by
if not held then
  at = math.max(slot, now)
  for i, b in ipairs(buckets) do
    local free = start_for(b, start_need_of(b, tonumber(units[i])))
    if free > at then
      at, at_by = free, i
    end
  end
elseif at - now > soon then -- back early: still waiting
  return answer(1, at, by)
end
local mark = at - now > soon and ' w' or ''
for i, b in ipairs(buckets) do
  if not held then
    note_start(b, start_need_of(b, tonumber(units[i])), at)
    save_bucket(b)
  end
  local life = math.ceil((math.max(own[i], at) - now) / 1000) + KEEP_MS
  redis.call('SET', b.request, int(own[i]) .. ' ' .. units[i] .. ' ' .. int(at) .. mark, 'PX',
    int(life))
end
return answer(1, at, at_by, mark == '' and 1 or 0)
