-- pending_take.lua: a sweeper takes a debounced key's call that is due, to publish it: the
-- pending call becomes the call being published (s_*) for `window` ms; a later call makes a
-- new pending call meanwhile. A call being published whose window passed (its publisher died)
-- is taken again. One call of a key is published at a time, in order.
-- KEYS: 1 pending (hash, see pending_call.lua)
-- ARGV: 1 publish window ms, 2 this take's token (a take run twice, after a lost reply, is
--       handed the same call again, not told to wait for its own window)
-- Returns {'p', id, payload}: publish it (then pending_sent.lua); {'w', ms}: look again at
--   that server time; {'n'}: nothing pending.

-- #include _time.lua

local now = server_now()
local window, taker = tonumber(ARGV[1]), ARGV[2]
local sending = redis.call('HGET', KEYS[1], 's_id')
if sending then
  local until_ms = tonumber(redis.call('HGET', KEYS[1], 's_until'))
  if until_ms > now and redis.call('HGET', KEYS[1], 's_by') ~= taker then
    return {'w', int(until_ms)}
  end
  redis.call('HSET', KEYS[1], 's_until', int(now + window), 's_by', taker)
  return {'p', sending, redis.call('HGET', KEYS[1], 's_payload')}
end
local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  return {'n'}
end
local due = tonumber(redis.call('HGET', KEYS[1], 'due'))
if due > now then
  return {'w', int(due)}
end
local payload = redis.call('HGET', KEYS[1], 'payload')
redis.call('HSET', KEYS[1], 's_id', id, 's_payload', payload, 's_until', int(now + window),
  's_by', taker)
redis.call('HDEL', KEYS[1], 'id', 'first', 'due', 'payload')
return {'p', id, payload}
