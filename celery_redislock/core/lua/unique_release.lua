-- unique_release.lua: give up a unique task's claim on its key (the task starts, was revoked,
-- skipped, or its publish failed), only if this task id holds it.
-- KEYS: 1 queued (string: the id of the task whose message holds the key),
--       2 replaced (set: ids of queued copies replaced by a newer call)
-- ARGV: 1 task id
-- Returns '1' released (or nobody held it), or '0 holder' if this id was replaced or another id
-- holds the key (holder '-' if the replacing copy has already gone). Run twice, it answers the
-- same: a replaced id stays in the set (which expires by itself).
local cur = redis.call('GET', KEYS[1])
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return '0 ' .. (cur or '-')
end
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return '1'
end
if not cur then
  return '1'
end
return '0 ' .. cur
