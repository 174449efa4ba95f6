-- _give_up.lua (a part, not a script; see scripts.py): the end of a copy's claim on its unique
-- key (unique_release.lua; lean_acquire.lua, as the copy takes its lease).
-- Defines: give_up.
-- #include _claim.lua

-- c: the claim's keys, {queued = KEYS[i] (see _claim.lua), replaced = KEYS[j] (set: replaced
-- ids)}. Mode 'g' give up (a started period stays), 's' start a period of `keep_ms`, 'f' an
-- operator's forced release.
-- Returns '1' released, kept or free, '0 holder' if replaced or another holds it ('-': gone).
local function give_up(c, id, mode, keep_ms)
  local cur = redis.call('GET', c.queued)
  local holder = holder_of(cur)
  if redis.call('SISMEMBER', c.replaced, id) == 1 then
    return '0 ' .. (holder or '-')
  end
  if mode == 's' then
    if not cur or cur == id then
      redis.call('SET', c.queued, STARTED .. id, 'PX', keep_ms)
      return '1'
    end
    return holder == id and '1' or ('0 ' .. holder)
  end
  if cur == id or (holder == id and mode == 'f') then
    redis.call('DEL', c.queued)
    return '1'
  end
  if not cur or holder == id then
    return '1'
  end
  return '0 ' .. holder
end
