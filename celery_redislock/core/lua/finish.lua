-- finish.lua: record that a job finished under a lock, so that another delivery of the same job
-- (a broker redelivering a message whose ack was lost) is not run again (acquire.lua, ARGV 6).
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants
--   (see _lock.lua; only done is written)
-- ARGV: 1 job id, 2 how long to keep the record (ms)
-- Returns 1. Run twice, it records the same job again (idempotent).

-- #include _lock.lua

local now = server_now()
record_done(ARGV[1], tonumber(ARGV[2]), now)
return 1
