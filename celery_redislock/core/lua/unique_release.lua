-- unique_release.lua: give up this id's claim on a unique key, or keep it for a run's period.
-- KEYS: 1 queued (the id whose message holds the key), 2 replaced (set: replaced ids)
-- ARGV: 1 task id, 2 mode 'g' give up (a started period stays), 's' start a period of ARGV[3] ms,
--   'f' an operator's forced release
-- Returns '1' released, kept or free, '0 holder' if replaced or another holds it ('-': gone).
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
