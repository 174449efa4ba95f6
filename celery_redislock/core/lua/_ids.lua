-- _ids.lua (a part, not a script; see scripts.py): request ids: a call sent twice counts once.
-- Defines: REQUESTS_KEPT, recent, listed.

local REQUESTS_KEPT = 16 -- enough for a call run again right after its reply was lost
-- Cut in one piece: building the list id by id was a good share of a release's work.
local function recent(id, list, n)
  if not list then
    return id
  end
  local at = 0
  for _ = 1, n - 1 do
    at = string.find(list, ' ', at + 1, true)
    if not at then
      return id .. ' ' .. list
    end
  end
  return id .. ' ' .. string.sub(list, 1, at - 1)
end

local function listed(list, id)
  return string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end
