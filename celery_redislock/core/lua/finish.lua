-- finish.lua: record a job finished, so a redelivery (its ack lost) is not run (acquire.lua).
-- KEYS: 1 leases, 2 meta, 3 queue, 4 qdl, 5 wake, 6 done, 7 tenants (only done is written)
-- ARGV: 1 job id, 2 how long to keep the record (ms)
-- Returns 1. Run twice, it records the same job again.
-- #include _lock.lua

local now = server_now()
record_done(ARGV[1], tonumber(ARGV[2]), now)
return 1
