-- pending_call.lua: a debounced key's call (latest wins), due `quiet` on, by first + `max_wait`.
-- KEYS: 1 pending (hash: id, first, due, payload; s_*: the call being published, pending_take)
-- ARGV: 1 this call's id, 2 its payload, 3 quiet ms, 4 max_wait ms ('0': none)
-- Returns {id, due ms, '1' if the pending call is this one else '0'}; run twice, the same.
-- #include _time.lua

local now = server_now()
local quiet, max_wait = tonumber(ARGV[3]), tonumber(ARGV[4])
local id = redis.call('HGET', KEYS[1], 'id')
local due = now + quiet
if id then
  if max_wait > 0 then
    due = math.min(due, tonumber(redis.call('HGET', KEYS[1], 'first')) + max_wait)
  end
  redis.call('HSET', KEYS[1], 'due', int(due), 'payload', ARGV[2])
else
  id = ARGV[1]
  redis.call('HSET', KEYS[1], 'id', id, 'first', int(now), 'due', int(due), 'payload', ARGV[2])
end
return {id, int(due), id == ARGV[1] and '1' or '0'}
