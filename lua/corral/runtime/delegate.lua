--- The OCI runtime corral-runtime hands a container's life cycle to: crun or runc (the
-- host's, never one of corral's own), `CORRAL_RUNTIME_DELEGATE` naming either or a
-- path. Its state lives beneath corral-runtime's own root (`<root>/.delegate`), so that
-- `<root>/<id>/` is corral's directory of the container and the delegate's never meets it.
-- @module corral.runtime.delegate
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

--- The delegate's state directory beneath corral-runtime's root.
M.SUBDIR = ".delegate"

-- crun refuses every container on a hybrid cgroup host whose cgroup v2 mount holds a
-- controller ("cgroups in hybrid mode not supported, drop all controllers from
-- cgroupv2", crun 1.8); runc runs there.
local function crun_refuses_host()
  local text = core.fs.read("/sys/fs/cgroup/unified/cgroup.controllers")
  return text ~= nil and text:find("%S") ~= nil
end

--- The delegate's executable: the one named (corral-runtime's `--delegate`, which podman
-- passes as `--runtime-flag delegate=NAME`: conmon clears the environment), else
-- `CORRAL_RUNTIME_DELEGATE`, else crun (unless the host is one it refuses), else runc.
-- @tparam[opt] string named
-- @treturn[1] string path
-- @return[2] nil
-- @treturn[2] table cannot_enforce("oci_runtime", …)
function M.path(named)
  named = named or os.getenv("CORRAL_RUNTIME_DELEGATE")
  local order = crun_refuses_host() and { "runc" } or { "crun", "runc" }
  for _, cand in ipairs(named and named ~= "" and { named } or order) do
    local path = cand:find("/", 1, true) and cand or core.path.resolve_executable(cand)
    if path and path:sub(1, 1) == "/" and core.fs.lstat(path) then return path end
  end
  return nil, errors.cannot_enforce("oci_runtime", named
    and (named .. " not found (--delegate or CORRAL_RUNTIME_DELEGATE)")
    or "neither crun nor runc is installed (corral-runtime delegates the container's life cycle to one)")
end

--- The delegate's argv: its global flags (the engine's, `--root` moved beneath ours),
-- then the subcommand's words as the engine gave them.
-- @tparam string path
-- @tparam table g global flags parsed by corral.runtime.cli (`root`, `passed`)
-- @tparam {string,...} words
function M.argv(path, g, words)
  local argv = { path, "--root", g.root .. "/" .. M.SUBDIR }
  for _, v in ipairs(g.passed) do argv[#argv + 1] = v end
  for _, v in ipairs(words) do argv[#argv + 1] = v end
  return argv
end

--- This process's environment as `NAME=value` strings.
function M.environ()
  local list = {}
  for k, v in pairs(core.proc.environ()) do list[#list + 1] = k .. "=" .. v end
  return list
end

--- Replaces this process with the delegate: its fds (`--preserve-fds`, the console
-- socket's) and its exit status are the engine's to see.
-- @treturn nil, string only when the exec failed
function M.exec(path, g, words)
  return core.proc.execve(path, M.argv(path, g, words), M.environ())
end

--- Runs the delegate to its end, its stdio the caller's.
-- @treturn integer its exit status (127 when it could not start)
-- @treturn string why it could not start
function M.call(path, g, words)
  local proc, err = core.spawn.start({ plain = true, path = path, argv = M.argv(path, g, words),
    env = M.environ(), stdin = io.stdin, stdout = io.stdout, stderr = io.stderr })
  if not proc then return 127, err end
  local code = proc:wait()
  proc:close()
  return code or 1
end

--- Whether the delegate still knows the container (its state directory is there).
function M.knows(g, id)
  return core.fs.lstat(g.root .. "/" .. M.SUBDIR .. "/" .. id) ~= nil
end

return M
