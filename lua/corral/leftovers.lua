--- What SIGKILLed corral processes left behind, found by the pid in its name: removed
-- once that pid is gone. Small and dependency-free, so that a launch the probe cache
-- answers (`corral confine`) sweeps without loading the sandbox modules.
-- @module corral.leftovers
local core = require "corral.core"

local M = {}

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

--- Removes a scratch tree of ours: never a link, nor a tree another user made.
-- @tparam string path
-- @treturn boolean whether it was removed
function M.remove_own_tree(path)
  local st = core.fs.lstat(path)
  return (st and st.type == "dir" and st.uid == core.proc.geteuid() and core.fs.remove_tree(path)) and true or false
end

return M
