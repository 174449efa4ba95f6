-- lean_acquire.lua: take a plain mutex (mode w, limit 1, not fair) that is free, re-enter it, or
-- be refused, in its meta hash alone (see _lean.lua); anything else answers '9', and the caller
-- sends the same call to acquire.lua, which decides it on the general path.
-- KEYS: 1 meta (see _lock.lua); with ARGV 7, 2 queued and 3 replaced (the owner's unique claim
--   on the key named like the lock, see _give_up.lua)
-- ARGV: as acquire.lua's 1-6 (token, spec, flags, owner, info, job); the caller sends only a
--   call without a job, a park or a claim (checked there, not again here); a spec other than a
--   plain mutex's answers '9'; 7 (optional) the owner's unique claim ends as its new lease is
--   taken: 'g' given up, 's<ms>' kept for a period of that many ms
-- Returns acquire.lua's reply ('status token fence expiry count next mode': 1 held, 0 not held,
--   3 the owner holds it (once)), or '9'. A new lease (or this call's, run again) taken with ARGV
--   7 is followed by ' ~ ' and give_up's answer.

-- #include _ids.lua
-- #include _lean.lua

-- The claim's end, in the same call as the lease: nobody sees the key free in between. (Its
-- helpers are made only for a call that asks for it: this is the hot path.)
local claim_ends = function() return '' end
if ARGV[7] then
-- #include _give_up.lua
  claim_ends = function()
    local how = ARGV[7]
    local c = {queued = KEYS[2], replaced = KEYS[3]}
    return ' ~ ' .. give_up(c, ARGV[4], string.sub(how, 1, 1), string.sub(how, 2))
  end
end

local tok, flags, owner = ARGV[1], ARGV[3], ARGV[4]
local ttl, entry_ms, keep_ms = string.match(ARGV[2], '^w 1 (%d+) 0 (%d+) (%d+)$')
if not ttl then
  return '9'
end
ttl, keep_ms = tonumber(ttl), tonumber(keep_ms)
local t = redis.call('TIME') -- (server_now inlined: this is the hot path)
local now_us = t[1] * 1000000 + t[2]
local now = math.floor(now_us / 1000)
local s = redis.call('HMGET', KEYS[1], 'L', 'fence', 'm', 'qseq', 'qp', 'P', 'Q', 'E')
if s[3] or s[4] or s[5] or (s[6] and tonumber(s[6]) > now) then
  return '9' -- leases in the leases key, a line, or a pause: the general path decides
end

local raw = s[1]
if raw and raw ~= '' then
  local ltok, lexp, lfence, lcount, lowner, requests = parse_lean(raw)
  lexp = tonumber(lexp)
  if lexp > now then
    if ltok == tok then -- this very call ran before (its reply was lost): the same lease
      return '1 ' .. tok .. ' ' .. lfence .. ' ' .. int(lexp) .. ' ' .. lcount .. ' 0 w'
        .. claim_ends()
    end
    if owner ~= '' and lowner == owner then
      if listed(requests, tok) then -- this re-entry ran before: it counts once
        return '1 ' .. ltok .. ' ' .. lfence .. ' ' .. int(lexp) .. ' ' .. lcount .. ' 0 w'
      end
      if string.sub(flags, 3, 3) == '1' then -- once: say the owner holds it, and for how long
        return '3 ' .. ltok .. ' ' .. lfence .. ' 0 ' .. lcount .. ' ' .. int(lexp - now) .. ' w'
      end
      local count = tonumber(lcount) + 1
      local expiry = math.max(lexp, now + ttl)
      local rec = lean_record(ltok, expiry, lfence, count, lowner,
        recent(tok, requests ~= '' and requests or nil, REQUESTS_KEPT))
      if s[8] and tonumber(s[8]) >= expiry + GRACE_MS then
        redis.call('HSET', KEYS[1], 'L', rec)
      else -- (the meta key must outlive the lease: as for a new lease, below)
        local life = math.max(expiry - now + GRACE_MS + ttl, keep_ms)
        redis.call('HSET', KEYS[1], 'L', rec, 'E', int(now + life))
        redis.call('PEXPIRE', KEYS[1], life)
      end
      return '1 ' .. ltok .. ' ' .. lfence .. ' ' .. int(expiry) .. ' ' .. count .. ' 0 w'
    end
    if string.sub(flags, 1, 1) == '1' then -- a waiter's place: the latest deadline, never lowered
      -- Written again only once a third of a place's life has passed since: a waiter looks
      -- again within that third, so every place still lives two thirds when it does.
      entry_ms = tonumber(entry_ms)
      local deadline = now + entry_ms
      if not s[7] or tonumber(s[7]) < deadline - math.floor(entry_ms / 3) then
        redis.call('HSET', KEYS[1], 'Q', string.format('%d', deadline))
      end
    end
    return string.format('0 - 0 0 0 %d w', lexp - now)
  end
end

-- Free (or its lease lapsed): the next fence follows the fence mark, and the server's clock in
-- us when that is ahead, so that fences grow through a restart that lost the mark.
local fence = math.max(tonumber(s[2] or '0') + 1, now_us)
local expiry = now + ttl
local rec = string.format('%s|%d|%d|1|%s|', tok, expiry, fence, owner) -- (see lean_record)
-- The meta key is made to outlive the lease (with the fence mark's keep), unless it does
-- already ('E'): a PEXPIRE only then.
if s[8] and tonumber(s[8]) >= expiry + GRACE_MS then
  redis.call('HSET', KEYS[1], 'fence', string.format('%d', fence), 'L', rec, 'I', ARGV[5])
else
  local life = math.max(ttl + GRACE_MS + ttl, keep_ms)
  redis.call('HSET', KEYS[1], 'fence', string.format('%d', fence), 'L', rec, 'I', ARGV[5], 'E',
    string.format('%d', now + life))
  redis.call('PEXPIRE', KEYS[1], life)
end
return string.format('1 %s %d %d 1 0 w', tok, fence, expiry) .. claim_ends()
