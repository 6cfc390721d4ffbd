--- The mark corral sets, as root, on every storage it hands to a tenant (core.fs.mark: a
-- trusted.* attribute no tenant can forge, read or strip), so that no storage is made
-- inside another: that tenant could reach its files and the disk image beside them.
-- A leaf: the description's checks, the storage's preparation and the idmapped mount's
-- scan all read it.
-- @module corral.storage_mark
local core = require "corral.core"

local M = {}

--- The extended attribute's name.
M.MARK = "trusted.corral.storage"

--- The storage `dir` lies in (itself or a directory above it carrying `MARK`), or nil.
-- @tparam string dir a resolved path
-- @treturn string|nil
function M.enclosing(dir)
  local p = dir
  while true do
    if core.fs.marked(p, M.MARK) then return p end
    if p == "/" then return nil end
    p = p:match("^(.*)/[^/]*$")
    if p == "" then p = "/" end
  end
end

return M
