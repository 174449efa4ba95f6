-- unique_release.lua: give up this id's claim on a unique key, or keep it for a run's period.
-- KEYS: 1 queued (the id whose message holds the key), 2 replaced (set: replaced ids)
-- ARGV: 1 task id, 2 mode 'g' give up (a started period stays), 's' start a period of ARGV[3] ms,
--   'f' an operator's forced release
-- Returns '1' released, kept or free, '0 holder' if replaced or another holds it ('-': gone).
-- #include _give_up.lua

local c = {queued = KEYS[1], replaced = KEYS[2]}
return give_up(c, ARGV[1], ARGV[2] or 'g', ARGV[3])
