--- Where the confinement wrapper program is: `corral-exec-confined` beside the `corral`
-- executable (core/wrapper: the host's exec-confined code without the Lua host), or the
-- host itself, whose `corral exec-confined` is the same code, where that is not
-- installed. Specs name it (corral.confinement), and the layer probes run it
-- (corral.probe), so what was probed is what launches.
-- @module corral.confine_wrapper
local core = require "corral.core"

local M = {}

--- The wrapper program's file name.
M.NAME = "corral-exec-confined"

--- The wrapper program for the host executable `host`.
-- @tparam string host the corral executable's absolute path
-- @treturn string the program to run with `exec-confined …` arguments
function M.beside(host)
  -- resolve_executable hands back a path with a slash unchanged when nothing is there
  local program = core.path.resolve_executable(host:gsub("[^/]*$", "") .. M.NAME)
  local st = program and core.fs.lstat(program)
  if st and st.type == "file" and st.mode & tonumber("111", 8) ~= 0 then return program end
  return host
end

--- The wrapper program of this process's host.
-- @treturn string|nil the program, or nil and why no host executable was found
function M.path()
  local host, why = core.proc.host_executable()
  if not host then return nil, why end
  return M.beside(host)
end

return M
