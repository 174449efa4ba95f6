-- line_forget.lua: drop a name from its list (task-line locks, debounced keys) unless listed again.
-- KEYS: 1 the list (hash: name -> its record)
-- ARGV: 1 lock name, 2 the record as read
-- Returns 1 if dropped, 0 if listed again meanwhile (or gone).
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
