-- pending_sent.lua: a debounced key's call was published: it is no longer kept.
-- KEYS: 1 pending (hash, see pending_call.lua)
-- ARGV: 1 the id published
-- Returns the due time (server ms) of the next pending call, or '0'. Run twice, the same.
if redis.call('HGET', KEYS[1], 's_id') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 's_id', 's_payload', 's_until', 's_by')
end
return redis.call('HGET', KEYS[1], 'due') or '0'
