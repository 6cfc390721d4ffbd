--- Whole files read at once: the kernel's /proc and /sys files, corral's own state files.
-- @module corral.file
local core = require "corral.core"

local M = {}

--- The whole content of the file at path, as bytes (core.fs.read: one open, read(2) to
-- the end).
-- @tparam string path
-- @treturn[1] string
-- @return[2] nil
-- @treturn[2] string why it could not be opened or read
function M.read(path)
  local s, err = core.fs.read(path)
  if not s then return nil, err end
  return s
end

return M
