--- The `bwrap` mechanism: tenant sandboxes built by the system's bubblewrap.
--
-- For hosts where bubblewrap is the better choice (e.g. a distribution that allows
-- unprivileged user namespaces only to it). bubblewrap runs as the sandbox's own
-- unprivileged host id (setpriv), so the tenant's root maps to that id and never to
-- host root, with every namespace unshared, all capabilities dropped, a new session,
-- the tenant seccomp filter (corral's, handed to --seccomp), and the same root as
-- native: runtime read-only, /storage, /workspace, /proc, /dev, a tmpfs /tmp.
--
-- It constructs what bubblewrap gives: filesystem_confinement, privilege_separation,
-- network_restriction. It builds no resource limits: the gate asks the host probe for
-- resource_limits, and the host applies them by starting bubblewrap inside a cgroup
-- beneath corral's own (and rlimits through prlimit). With an egress allowlist or a
-- service port, bubblewrap is started inside the host-made, host-programmed netns (joined
-- while still privileged, so the user namespace bubblewrap then makes owns nothing in
-- it) and shares it instead of unsharing an empty one; corral's loop serves it.
-- @module corral.mechanism.bwrap
local core = require "corral.core"
local errors = require "corral.errors"
local sandbox = require "corral.sandbox"
local limits = require "corral.limits"
local hardening = require "corral.hardening"
local resources = require "corral.resources"

local M = { name = "bwrap" }

local state = {}

local needs_plane = require("corral.resources").needs_plane

function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction", "bwrap" }
  if limits.wants_cgroup(sb) then req[#req + 1] = "resource_limits" end
  if needs_plane(sb) then req[#req + 1] = "nftables" end
  return req
end

function M.constructed_capabilities()
  return { "filesystem_confinement", "privilege_separation", "network_restriction" }
end

local function tool(name)
  local path = core.resolve_executable(name)
  if not path or path:sub(1, 1) ~= "/" then return nil, name .. " not found on PATH" end
  return path
end

--- The bwrap argument list for argv in sandbox sb (seccomp program on fd `seccomp_fd`).
function M.args(sb, argv, seccomp_fd)
  local a = { "--die-with-parent", "--new-session", "--uid", "0", "--gid", "0",
              "--hostname", "corral", "--cap-drop", "ALL" }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  local st = state[sb.id]
  if st and st.plane then
    add("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
  else
    add("--unshare-all")
  end
  for _, p in ipairs(core.confine_runtime_paths()) do
    local target = core.readlink(p)
    if target then add("--symlink", target, p) else add("--ro-bind-try", p, p) end
  end
  add("--bind", sandbox.storage_path(sb), "/storage")
  if sb.workspace_path then add("--bind", sb.workspace_path, "/workspace") end
  add("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/storage", "--clearenv")
  if seccomp_fd then add("--seccomp", tostring(seccomp_fd)) end
  local names = {}
  for k in pairs(sb.env) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add("--setenv", k, sb.env[k]) end
  add("--")
  for _, v in ipairs(argv) do a[#a + 1] = v end
  return a
end

function M.provision(sb)
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local st, err = resources.acquire(sb)
  if not st then return nil, err end
  state[sb.id] = st
  return true
end

-- Spawns prlimit → setpriv → bwrap in the sandbox's cgroup (and netns, with a plane).
local function spawn(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  opts = opts or {}
  local prlimit, setpriv, bwrap = tool("prlimit"), tool("setpriv"), tool("bwrap")
  if not (prlimit and setpriv and bwrap) then
    return nil, errors.cannot_enforce("bwrap", "needs prlimit, setpriv and bwrap on PATH")
  end
  local prog_path = os.tmpname()
  local f = assert(io.open(prog_path, "wb"))
  f:write(assert(core.seccomp.tenant_program()))
  f:close()
  local prog, perr = core.open(prog_path)
  os.remove(prog_path)
  if not prog then return nil, errors.cannot_enforce("privilege_separation", tostring(perr)) end
  local id = tostring(sandbox.host_id(sb))
  local l = sb.limits or {}
  local full = { prlimit, "--core=0" }
  if l.nofile then full[#full + 1] = "--nofile=" .. l.nofile end
  if l.fsize then full[#full + 1] = "--fsize=" .. l.fsize end
  for _, v in ipairs({ "--", setpriv, "--reuid=" .. id, "--regid=" .. id, "--clear-groups", "--", bwrap }) do
    full[#full + 1] = v
  end
  for _, v in ipairs(M.args(sb, argv, prog:fileno())) do full[#full + 1] = v end
  local out
  if opts.output then
    out = io.open(opts.output, "w")
    if not out then prog:close() return nil, errors.invalid_argument("output", "cannot open " .. opts.output) end
  end
  local proc, err = core.spawn({ plain = true, path = prlimit, argv = full, env = hardening.envp(sb.env),
    netns = st.plane and st.plane.netns, cgroup_procs = resources.cgroup_procs(st), keep_fds = { prog },
    stdout = out, stderr = out })
  prog:close()
  if out then out:close() end
  if not proc then return nil, errors.cannot_enforce("bwrap", tostring(err)) end
  return proc
end

function M.exec(sb, argv, opts)
  local proc, err = spawn(sb, argv, opts)
  if not proc then return nil, err end
  local st = state[sb.id]
  local wall = sb.limits and sb.limits.wall
  local code, how = require("corral.egress.loop").wait(proc, { serve = st.plane ~= nil, wall = wall,
    signals = opts and opts.signals })
  local timed_out = false
  if not code then
    timed_out = true
    proc:kill()
    code, how = proc:wait()
  end
  proc:close()
  -- bubblewrap reports its own failures (e.g. a missing command) as status 1
  return limits.observe(st, { code = code, how = how, limit = timed_out and "wall" or nil })
end

function M.start(sb, argv, opts)
  local st = state[sb.id]
  if st and st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is already running")
  end
  local proc, err = spawn(sb, argv, opts)
  if not proc then return nil, err end
  st.process, st.status = proc, "running"
  return true
end

function M.stop(sb)
  local st = state[sb.id]
  if not st then return true end
  if st.process then
    st.process:close()
    st.process = nil
  end
  if st.cgroup then st.cgroup:kill() end
  st.status = "stopped"
  return true
end

function M.destroy(sb)
  local st = state[sb.id]
  if not st then return true end
  M.stop(sb)
  local ok, err = resources.release(st)
  state[sb.id] = nil
  if not ok then return nil, err end
  return true
end

function M.status(sb)
  local st = state[sb.id]
  if not st then return "absent" end
  if st.process and not st.process:running() then st.status = "stopped" end
  return st.status
end

--- The cgroup directories of a provisioned sandbox (for leak checks).
function M.cgroup_paths(sb)
  local st = state[sb.id]
  return st and st.cgroup and st.cgroup:paths() or {}
end

--- Where the sandbox's service_port is reachable from the host.
function M.address(sb)
  return resources.address(state[sb.id])
end

return M
