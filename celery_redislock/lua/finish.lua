-- finish.lua: record that a job finished under a lock, so that another delivery of the same job
-- (a broker redelivering a message whose ack was lost) is not run again (acquire.lua, ARGV 6).
-- KEYS: 1 done (sorted set: job id -> server ms until which the record is kept)
-- ARGV: 1 job id, 2 how long to keep the record (ms)
-- Returns 1. Run twice, it records the same job again (idempotent).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], string.format('%.0f', now + keep), ARGV[1])
if redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return 1
