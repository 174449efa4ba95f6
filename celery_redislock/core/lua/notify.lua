-- notify.lua: wake waiters of a fair lock that were handed a lease, each on its own list.
-- KEYS: the wake list of each granted waiter
-- ARGV: 1 list lifetime ms (a waiter that died never pops its list), then one payload per key
for i, key in ipairs(KEYS) do
  redis.call('RPUSH', key, ARGV[i + 1])
  redis.call('PEXPIRE', key, ARGV[1])
end
return #KEYS
