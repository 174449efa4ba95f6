-- line_forget.lua: drop a lock from the list of locks with a task line, unless it was listed
-- again since it was read (a task parked meanwhile); also a key from the list of debounced keys
-- (core/debounce.py), unless a call listed it again.
-- KEYS: 1 the list (hash: lock name -> the lock's settings as listed, see core/line.py; or a
--         debounced key -> when to look, see core/debounce.py)
-- ARGV: 1 lock name, 2 the record as read
-- Returns 1 if dropped, 0 if listed again meanwhile (or gone).
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
