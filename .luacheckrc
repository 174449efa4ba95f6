-- luacheck's settings for the Lua scripts in celery_redislock/core/lua (`make lint` runs
-- `luacheck celery_redislock/core/lua` from the repository's root).
--
-- Each file is checked as written, with the names it may use beside Lua 5.1's: Redis's and those
-- defined by the parts it includes (`-- #include _<name>.lua` lines, followed into the parts'
-- own includes, as scripts.py assembles them). A name no included part defines is an undefined
-- global; a script that assigns a part's name (a part's state is the part's to write) is
-- setting a read-only global. A part's top-level locals are what it defines for others, so they
-- are not reported unused in it. (tests/test_scripts.py also checks every assembled script.)

std = 'lua51' -- Redis runs Lua 5.1
read_globals = {'redis', 'KEYS', 'ARGV', 'cjson', 'cmsgpack', 'struct', 'bit'}
max_line_length = 100

local dir = 'celery_redislock/core/lua/'

local function source_of(file)
  local handle = io.open(dir .. file)
  if not handle then
    error('.luacheckrc: cannot read ' .. dir .. file .. ' (run luacheck from the repository root)')
  end
  local text = handle:read('*a')
  handle:close()
  return text
end

local function lines_of(text)
  return string.gmatch(text .. '\n', '([^\n]*)\n')
end

-- The names a part defines: its top-level locals (`local function name`, `local a, b =`).
local function defined_by(text)
  local names = {}
  for line in lines_of(text) do
    local fn = string.match(line, '^local function ([%w_]+)')
    local vars = string.match(line, '^local ([%w_, ]+)=') or string.match(line, '^local ([%w_]+)$')
    if fn then
      names[#names + 1] = fn
    elseif vars then
      for name in string.gmatch(vars, '[%w_]+') do
        names[#names + 1] = name
      end
    end
  end
  return names
end

-- The names defined by the parts `file` includes, directly or through other parts.
local function visible_in(file, seen, names)
  for line in lines_of(source_of(file)) do
    local part = string.match(line, '^%-%- #include (%S+)$')
    if part and not seen[part] then
      seen[part] = true
      for _, name in ipairs(defined_by(source_of(part))) do
        names[#names + 1] = name
      end
      visible_in(part, seen, names)
    end
  end
  return names
end

for file in io.popen('ls ' .. dir):lines() do
  if string.match(file, '%.lua$') then
    local options = {read_globals = visible_in(file, {}, {})}
    if string.sub(file, 1, 1) == '_' then
      options.ignore = {}
      for _, name in ipairs(defined_by(source_of(file))) do
        options.ignore[#options.ignore + 1] = '211/^' .. name .. '$'
        -- (state a part writes for the others to read, e.g. _lock.lua's lean_waiting)
        options.ignore[#options.ignore + 1] = '231/^' .. name .. '$'
      end
    end
    files[dir .. file] = options
  end
end
