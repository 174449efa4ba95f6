-- pending_call.lua: a call of a debounced key (unique lifecycle 'debounce'): it becomes the
-- key's pending call, or updates the pending one with its arguments (latest wins) and moves
-- its due time to `quiet` after now, but never past `max_wait` after the pending call's first.
-- KEYS: 1 pending (hash: id, first, due, payload: the pending call; s_id, s_payload, s_until,
--         s_by: the call being published, see pending_take.lua)
-- ARGV: 1 this call's id, 2 its payload (the call as its framework publishes it),
--       3 quiet ms, 4 max_wait ms ('0': none)
-- Returns {id, due ms (server time), '1' if the pending call is this call (it made it) else '0'}.
-- Run twice (a lost reply), it answers the same, its due time a few ms later.

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
