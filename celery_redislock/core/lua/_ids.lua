-- _ids.lua (a part, not a script; see scripts.py): the request ids that make a call sent twice
-- count once (a lease's re-entries and partial releases, a lock's last releases).
-- Defines: REQUESTS_KEPT, recent, listed.

-- How many request ids a lease record, and release ids 'g', remember: enough for a call run
-- again right after its reply was lost.
local REQUESTS_KEPT = 16
-- Keeps the `n` most recent of the ids in `list` (as this writes it: one space between ids),
-- with `id` first. The list is cut where its (n-1)th id ends, in one piece: building it id by id
-- made a new string per id, a good share of a release's work inside Redis.
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

-- Whether `id` is one of the ids in `list` (as recent writes it).
local function listed(list, id)
  return string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end
