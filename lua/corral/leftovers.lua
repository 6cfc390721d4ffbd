--- Scratch a corral process makes, and what SIGKILLed ones left of it: each scratch
-- directory is named `<prefix><pid>-XXXXXX`, so that once that pid is gone the next
-- process that makes the same kind sweeps it. The one place that knows the naming, the
-- base directory and how a leftover is removed, cgroups `corral-<pid>-<n>` included.
-- Small and dependency-free, so that a launch the probe cache answers (`corral
-- confine`) and `corral ls` sweep without loading the sandbox modules.
-- @module corral.leftovers
local core = require "corral.core"

local M = {}

--- Where scratch goes: $TMPDIR when it is an absolute path (inside a confinement /tmp
-- is read-only), else /tmp.
-- @treturn string a directory path without a trailing slash
function M.base()
  local t = os.getenv("TMPDIR")
  return (t and t:sub(1, 1) == "/") and (t:gsub("/+$", "")) or "/tmp"
end

--- The name pattern of the scratch `make(dir, prefix)` makes; its capture is the
-- maker's pid.
-- @tparam string prefix
-- @treturn string
function M.pattern(prefix)
  return "^" .. prefix:gsub("%p", "%%%0") .. "(%d+)%-%w+$"
end

--- Makes a private (0700) scratch directory `<dir>/<prefix><pid>-XXXXXX`.
-- @tparam string dir
-- @tparam string prefix
-- @treturn[1] string its path
-- @return[2] nil
-- @treturn[2] string why
function M.make(dir, prefix)
  return core.fs.mkdtemp(dir .. "/" .. prefix .. core.proc.getpid() .. "-")
end

--- Removes what SIGKILLed corral processes left in `dir`: entries matching `pattern`
-- (first capture: the creator's pid) whose creator is gone, when `remove` takes them.
-- @tparam string dir
-- @tparam string pattern
-- @tparam function remove `remove(path)` → truthy when removed
-- @treturn integer how many were removed
function M.sweep(dir, pattern, remove)
  local removed = 0
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local pid = name:match(pattern)
    if pid and not core.fs.lstat("/proc/" .. pid) and remove(dir .. "/" .. name) then removed = removed + 1 end
  end
  return removed
end

-- The sweeps put off by the open `put_off` scope (nil: none is open).
local later

--- Runs a sweep now, or, while a `put_off` scope is open, when that scope runs its sweeps.
-- @tparam function fn the sweep
function M.sweep_soon(fn)
  if later then later[#later + 1] = fn else fn() end
end

--- `sweep_own(dir, prefix)` now, or put off as `sweep_soon`'s; those put off for one
-- directory then share its listing (a run's /tmp: its storages and the probes' scratch).
-- @tparam string dir
-- @tparam string prefix
function M.sweep_own_soon(dir, prefix)
  if later then later[#later + 1] = { dir = dir, prefix = prefix } else M.sweep_own(dir, prefix) end
end

-- Runs sweeps put off: each directory's own sweeps in one listing, then the others.
local function run_all(sweeps)
  local by_dir, dirs = {}, {}
  for _, s in ipairs(sweeps) do
    if type(s) == "table" then
      if not by_dir[s.dir] then by_dir[s.dir], dirs[#dirs + 1] = {}, s.dir end
      table.insert(by_dir[s.dir], s.prefix)
    end
  end
  for _, dir in ipairs(dirs) do M.sweep_own_all(dir, by_dir[dir]) end
  for _, s in ipairs(sweeps) do
    if type(s) == "function" then s() end
  end
end

--- Puts off every `sweep_soon` from now until the returned value's `run` (or its close):
-- a sweep removes what dead processes left, which nothing made meanwhile depends on, so a
-- caller that waits anyway does it then (corral.run: while the sandbox's init builds its
-- root).
-- @treturn table `run()` runs the sweeps put off, once; a to-be-closed value that runs
--   them when it closes
function M.put_off()
  local mine = {}
  later = mine
  local scope = {}
  function scope.run()
    if later == mine then later = nil end
    local sweeps = table.move(mine, 1, #mine, 1, {})
    for i = #mine, 1, -1 do mine[i] = nil end
    run_all(sweeps)
  end
  return setmetatable(scope, { __close = scope.run })
end

-- Whether path is ours and of this type: never a link, nor what another user made.
local function own(path, type)
  local st = core.fs.lstat(path)
  return st and st.type == type and st.uid == core.proc.geteuid()
end

--- Removes a scratch tree of ours: never a link, nor a tree another user made.
-- @tparam string path
-- @treturn boolean whether it was removed
function M.remove_own_tree(path)
  return (own(path, "dir") and core.fs.remove_tree(path)) and true or false
end

--- Removes a scratch file of ours: never a link, nor a file another user made.
-- @tparam string path
-- @treturn boolean whether it was removed
function M.remove_own_file(path)
  return (own(path, "file") and os.remove(path)) and true or false
end

--- Removes the scratch trees that `make(dir, prefix)` made in processes that are gone.
-- @tparam string dir
-- @tparam string prefix
-- @treturn integer how many were removed
function M.sweep_own(dir, prefix)
  return M.sweep(dir, M.pattern(prefix), M.remove_own_tree)
end

--- `sweep_own` for several prefixes in one listing of `dir`, each creator's pid looked
-- up once (a run's scratch and its name files share it).
-- @tparam string dir
-- @tparam {string,...} prefixes
-- @treturn integer how many were removed
function M.sweep_own_all(dir, prefixes)
  local patterns, alive, removed = {}, {}, 0
  for i, prefix in ipairs(prefixes) do patterns[i] = M.pattern(prefix) end
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    for _, pattern in ipairs(patterns) do
      local pid = name:match(pattern)
      if pid then
        if alive[pid] == nil then alive[pid] = core.fs.lstat("/proc/" .. pid) ~= nil end
        if not alive[pid] and M.remove_own_tree(dir .. "/" .. name) then removed = removed + 1 end
        break
      end
    end
  end
  return removed
end

-- rmdir fails with EBUSY on a cgroup holding a process or a child, so a populated one
-- is never touched.
local function remove_empty_cgroup(path)
  local st = core.fs.lstat(path)
  return st and st.type == "dir" and os.remove(path)
end

--- Removes empty `corral-<pid>-<n>` cgroups beneath our own whose creator is gone.
-- @treturn integer how many were removed
function M.sweep_cgroups()
  local info = core.cgroup.info()
  local removed = 0
  for _, mine in pairs(info and info.paths or {}) do
    removed = removed + M.sweep(mine, "^corral%-(%d+)%-%d+$", remove_empty_cgroup)
  end
  return removed
end

return M
