-- unique_release.lua: give up a unique task's claim on its key (the task starts, was revoked,
-- skipped, or its publish failed), only if this task id holds it; or, as a once_per_period
-- run starts, keep the key for its period (see _claim.lua).
-- KEYS: 1 queued (string: the id of the task whose message holds the key),
--       2 replaced (set: ids of copies replaced by a newer call)
-- ARGV: 1 task id,
--       2 mode: 'g' give up (a started run's period claim stays: the run happened),
--               's' a once_per_period run starts: the key is its for ARGV[3] ms from now,
--               'f' an operator's forced release: given up, started or not
--       3 (mode 's') the period in ms
-- Returns '1' released, kept (mode 's') or nobody held it, or '0 holder' if this id was
-- replaced or another id holds the key (holder '-' if the replacing copy has already gone).
-- Run twice, it answers the same: a replaced id stays in the set (which expires by itself),
-- and a started period is not restarted.

-- #include _claim.lua

local id, mode = ARGV[1], ARGV[2] or 'g'
local cur = redis.call('GET', KEYS[1])
local holder = holder_of(cur)
if redis.call('SISMEMBER', KEYS[2], id) == 1 then
  return '0 ' .. (holder or '-')
end
if mode == 's' then
  if not cur or cur == id then
    redis.call('SET', KEYS[1], STARTED .. id, 'PX', ARGV[3])
    return '1'
  end
  return holder == id and '1' or ('0 ' .. holder)
end
if cur == id or (holder == id and mode == 'f') then
  redis.call('DEL', KEYS[1])
  return '1'
end
if not cur or holder == id then
  return '1'
end
return '0 ' .. holder
