--- Whole files read at once: the kernel's /proc and /sys files, corral's own state files.
-- @module corral.file
local M = {}

--- The whole content of the file at path, as bytes.
-- @tparam string path
-- @treturn[1] string
-- @return[2] nil
-- @treturn[2] string why it could not be opened or read
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s, rerr = f:read("a")
  f:close()
  if not s then return nil, path .. ": " .. tostring(rerr) end
  return s
end

return M
