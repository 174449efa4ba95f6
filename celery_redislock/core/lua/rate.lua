-- rate.lua: fleet-wide rate limits with costs and a burst, each a generic cell rate (GCRA)
-- bucket that hands out start slots in request order. O(1) per limit and call: one small hash
-- per name, one short-lived record per request. A reservation may take several limits at once
-- (a tenant's and a global one): one slot in all of them, or in none.
-- KEYS: three per limit, the first limit's first (every key of one call in one hash slot):
--       bucket   hash: tat (the theoretical arrival time, server us: the bucket is full at
--                and after it), last (the last slot handed out, us), paused (server us
--                before which no slot is handed out)
--                started, last_start (us): the same bucket over the starts noted (with max
--                late, see start_for in _bucket.lua)
--       request  string 'slot_us cost' of one request id, so that a request asked twice (a
--                lost reply, a task published again with its delay) gets the same slot;
--                'slot_us cost start_us' once its start is noted (with max late), with ' w'
--                while that start is kept for it to come back to; any key of the name's hash
--                tag when the call names no request ('u', 'p', 'q')
--       limits   hash: the limits set at runtime (rate = 'limit per_ms', burst), which take
--                the place of the caller's
-- ARGV: 1 op: 'r' reserve a slot, 's' settle a request's actual cost, 'u' usage (reads only),
--             'p' pause for ARGV[5] ms, 'q' resume; all but 'r' on the first limit only
--       2 limit (units per window), 3 per (the window, ms), 4 burst (units at once)
--       5 'r': cost (units); 's': actual cost; 'p': pause ms
--       6 'r': max delay ms or '' ; 's': the estimate, used when the record is gone
--       7 'r': max late ms or '': starts are noted too, in order, and kept within the rate
--         (see start_for): a request whose slot is due, however late, keeps it and starts when
--         the starts noted leave room; within near + max late it starts then, else it comes
--         back for the start kept for it; '' notes nothing
--       8 slack ms, or '' for none: the window (the code's or the runtime one) is widened by it,
--         so that starts which lag their slots a little still keep the rate
--       9 'r': near, ms ('' for 0): a slot within it is taken in every limit at once
--       10.. 'r': five per further limit: limit, per, burst, cost, slack
-- Returns one string:
--   'granted slot_ms delay_ms limit per_ms burst paused_ms tat_ms now_ms by started'
-- ('r': granted 1 with a slot further than `near`, and started 0: ask again then, with the same
-- request id). started: 1, the start is noted at slot (with max late): start then, not later
-- than near + max late from now; 0 with a due slot: come back then for the start kept.
--   granted: 1, the slot is this request's ('r'); 0, refused by max delay and nothing reserved
--   (for 'u', 'p', 'q', 's': 1). slot: the slot in server ms ('r'; for the others the slot a
--   request of cost 1 would get now); delay = slot - now, at least 0. by: the limit (1, 2, ...)
--   whose bucket set the slot, and limit, per_ms, burst, paused_ms, tat_ms its figures (the
--   runtime ones if set): paused_ms the end of a pause (0: none); its bucket holds
--   burst - (tat - now) / (per / limit) units.
--
-- The invariant, for each limit: a request of cost c starts at the earliest slot, not before the
-- last slot handed out, when the bucket (burst units, refilled at limit per per) holds c; so
-- any window of w ms holds at most burst + w * limit / per units of slots (with burst 1: at
-- most `limit` in any `per`). Slots are handed out in request order, never decreasing.

-- #include _bucket.lua

-- A due start waits in place for its turn up to near + this (or max late, if longer), in us.
local START_WAIT_US = 1000000

local op = ARGV[1]
local _, now = server_now()
local first, malformed = bucket_of(1, tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[8]) or 0, now)
if not first then
  return redis.error_reply(malformed)
end
local buckets = {first}

-- Whole ms (13 digits: tostring keeps them all, and costs less than string.format).
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

-- A request's record: its slot (us), its cost as written, its start (us) if noted, and
-- whether that start is kept for it to come back to ('w').
local function parse_record(got)
  local at, units, start, wait = string.match(got, '^(%d+) (%S+) ?(%d*) ?(w?)$')
  return tonumber(at), units, tonumber(start), wait == 'w' or nil
end

if op == 'u' then
  return answer(1, slot_for(first, need_of(first, 1)))
end

if op == 'p' then
  first.paused = math.max(first.paused, now + tonumber(ARGV[5]) * 1000)
  save_bucket(first)
  return answer(1, slot_for(first, need_of(first, 1)))
end

if op == 'q' then
  first.paused = 0
  save_bucket(first)
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
  -- The starts noted owe or get back the same, so that starts on time still pass.
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

-- 'r': reserve, in every limit at once. A start needs a slot in each; the slot is the latest
-- of theirs. When it is near (within `near`), every limit takes it. When it is further, only
-- the limits whose own slot is far take theirs (the others keep their room meanwhile: a slot
-- taken now in a limit with room would leave that room unused until then), and the caller
-- asks again at the slot, when the rest is near. Alone, a limit always takes its slot.
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

-- Each limit's slot: the one its record keeps, or the one it would give now. A record is not
-- kept if a pause came after it was handed out, or (noting starts) it started more than max
-- late ago (the request runs again: a message delivered again): then a new slot, at the back.
-- The old one is not given back to the bucket: a spare slot, never one too many. A record whose
-- slot passed long ago is kept: when it may start is the starts' say (below).
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
  -- Asked again: the slot it holds (or its start), whatever max delay it asks with now.
  if late then
    return answer(1, noted[1], by, 1)
  end
  return answer(1, slot, by)
end
if not all_kept and max_delay and slot - now > max_delay * 1000 then
  -- Refused: nothing is held for it, in any limit (a slot kept from an earlier answer goes:
  -- a spare slot, never one too many).
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

-- Counting starts, and its slot is due (or passed, however long ago): it starts when the starts
-- noted leave room for it in every limit, and that start is noted now, in order. Within near +
-- max late (at least 1 s), it waits for it in place: a due start that comes back later may be
-- late again. Further, it comes back for it (the record says so: 'w'); a start kept for it
-- that it comes back more than max late after is not used: a new one, as above.
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
