--- The `bwrap` mechanism: tenant sandboxes built by the system's bubblewrap.
--
-- For hosts where bubblewrap is the better choice (e.g. a distribution that allows
-- unprivileged user namespaces only to it). bubblewrap runs as the sandbox's own
-- unprivileged host id (setpriv), so the tenant's root maps to that id and never to
-- host root, with every namespace unshared (the net namespace empty), all capabilities
-- dropped, a new session, the tenant seccomp filter (corral's, handed to --seccomp),
-- and the same root as native: runtime read-only, /storage, /workspace, /proc, /dev,
-- a tmpfs /tmp.
--
-- It constructs what bubblewrap gives: filesystem_confinement, privilege_separation,
-- network_restriction. It builds no resource limits: the gate asks the host probe for
-- resource_limits, and the host applies them by starting bubblewrap inside a cgroup
-- beneath corral's own (and rlimits through prlimit).
-- @module corral.mechanism.bwrap
local core = require "corral.core"
local errors = require "corral.errors"
local sandbox = require "corral.sandbox"
local shell = require "corral.shell"

local M = { name = "bwrap" }

local state = {}

local limits = require "corral.limits"
local has_resource_limits = limits.wants_cgroup

function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction", "bwrap" }
  if has_resource_limits(sb) then req[#req + 1] = "resource_limits" end
  return req
end

function M.constructed_capabilities()
  return { "filesystem_confinement", "privilege_separation", "network_restriction" }
end

--- The bwrap argument list for argv in sandbox sb (seccomp program on fd 9).
function M.args(sb, argv)
  local a = { "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
              "--uid", "0", "--gid", "0", "--hostname", "corral", "--cap-drop", "ALL" }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  for _, p in ipairs(core.confine_runtime_paths()) do
    local target = core.readlink(p)
    if target then add("--symlink", target, p) else add("--ro-bind-try", p, p) end
  end
  add("--bind", sandbox.storage_path(sb), "/storage")
  if sb.workspace_path then add("--bind", sb.workspace_path, "/workspace") end
  add("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/storage",
      "--clearenv", "--seccomp", "9")
  local names = {}
  for k in pairs(sb.env) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add("--setenv", k, sb.env[k]) end
  add("--")
  for _, v in ipairs(argv) do a[#a + 1] = v end
  return a
end

function M.provision(sb)
  -- bubblewrap can only unshare an empty netns or share the caller's; it cannot join the
  -- host-programmed one an allowlist needs. Refused by name rather than run with no
  -- network (which would silently drop the allowlist) or the host's (fail open).
  if sb.network or sb.service_port then
    return nil, errors.cannot_enforce("network_restriction",
      "the bwrap mechanism cannot apply an egress allowlist or a service port; use the native mechanism")
  end
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local ok, err = sandbox.prepare_storage(sb)
  if not ok then return nil, err end
  local st = { status = "provisioned" }
  local cerr
  st.cgroup, cerr = limits.cgroup(sb)
  if cerr then return nil, cerr end
  state[sb.id] = st
  return true
end

-- The shell line: join the cgroup, apply rlimits, drop to the sandbox's host id, exec bwrap.
local function command_line(sb, argv)
  local st = state[sb.id]
  local id = tostring(sandbox.host_id(sb))
  local prog = assert(core.seccomp.tenant_program())
  local seccomp_file = os.tmpname()
  local f = assert(io.open(seccomp_file, "wb"))
  f:write(prog)
  f:close()
  local parts = {}
  if st.cgroup then
    for _, dir in ipairs(st.cgroup:paths()) do
      parts[#parts + 1] = "echo $$ > " .. shell.quote(dir .. "/cgroup.procs") .. " || exit 120;"
    end
  end
  local pl = { "prlimit", "--core=0" }
  local l = sb.limits or {}
  if l.nofile then pl[#pl + 1] = "--nofile=" .. l.nofile end
  if l.fsize then pl[#pl + 1] = "--fsize=" .. l.fsize end
  local cmd = { "setpriv", "--reuid=" .. id, "--regid=" .. id, "--clear-groups", "--" }
  for _, v in ipairs(M.args(sb, argv)) do cmd[#cmd + 1] = v end
  -- bubblewrap passes every inherited fd through: close all but 0-2 first (fd 9, the
  -- seccomp program, is opened after this loop). bash, because dash redirects fds 0-9 only.
  parts[#parts + 1] = 'for f in /proc/$$/fd/*; do n=${f##*/}; [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-"; done;'
  parts[#parts + 1] = "exec " .. shell.join(pl) .. " " .. shell.join(cmd) .. " 9<" .. shell.quote(seccomp_file)
  return table.concat(parts, " "), seccomp_file
end

function M.exec(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  local line, seccomp_file = command_line(sb, argv)
  if opts and opts.output then line = "exec >" .. shell.quote(opts.output) .. " 2>&1; " .. line end
  local wall = sb.limits and sb.limits.wall
  if wall then line = "exec timeout -s KILL " .. string.format("%.3f", wall) .. " bash -c " .. shell.quote(line) end
  local started = os.time()
  local _, how, code = os.execute("exec bash -c " .. shell.quote(line))
  os.remove(seccomp_file)
  if how == "signal" then code = 128 + code end
  local result = { code = code, how = how == "signal" and "killed" or "exited" }
  if wall and code == 137 and os.time() - started >= math.floor(wall) then result.limit = "wall" end
  return limits.observe(st, result)
end

function M.start(sb, argv)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  local line, seccomp_file = command_line(sb, argv)
  local p = io.popen("bash -c " .. shell.quote(line) .. " </dev/null >/dev/null 2>&1 & echo $!")
  st.pid = tonumber(p:read("a"):match("%d+"))
  p:close()
  st.seccomp_file = seccomp_file
  st.status = "running"
  return true
end

function M.stop(sb)
  local st = state[sb.id]
  if not st then return true end
  if st.pid then os.execute("kill -KILL " .. st.pid .. " 2>/dev/null") st.pid = nil end
  if st.cgroup then st.cgroup:kill() end
  if st.seccomp_file then os.remove(st.seccomp_file) st.seccomp_file = nil end
  st.status = "stopped"
  return true
end

function M.destroy(sb)
  local st = state[sb.id]
  if not st then return true end
  M.stop(sb)
  if st.cgroup then st.cgroup:destroy() end
  state[sb.id] = nil
  return true
end

function M.status(sb)
  local st = state[sb.id]
  if not st then return "absent" end
  if st.pid and not io.open("/proc/" .. st.pid .. "/stat") then st.status = "stopped" end
  return st.status
end

return M
