-- pending_take.lua: take a debounced key's due call to publish (s_* for `window` ms, then retaken).
-- KEYS: 1 pending (hash, see pending_call.lua)
-- ARGV: 1 publish window ms, 2 this take's token (run twice, it is handed the same call again)
-- Returns {'p', id, payload} to publish (then pending_sent.lua), {'w', ms}: look again, {'n'}.
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
