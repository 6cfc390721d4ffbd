--- The `bwrap` mechanism: tenant sandboxes built by the system's bubblewrap.
--
-- For hosts where bubblewrap is the better choice (e.g. a distribution that allows
-- unprivileged user namespaces only to it). bubblewrap runs as the sandbox's own
-- unprivileged host id (set by corral's spawn), so the tenant's root maps to that id and
-- never to host root, with every namespace unshared, all capabilities dropped, a new
-- session, the tenant seccomp filter (corral's, handed to --seccomp), and the same root
-- as native: runtime read-only, /storage, /workspace, /proc, /dev, a capped tmpfs /tmp,
-- and its own root read-only.
--
-- It constructs what bubblewrap gives: filesystem_confinement, privilege_separation,
-- network_restriction. It builds no resource limits: the gate asks the host probe for
-- resource_limits, and the host applies them by starting bubblewrap inside a cgroup
-- beneath corral's own (and rlimits set by corral's spawn). With an egress allowlist or a
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

function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction", "bwrap" }
  if limits.wants_cgroup(sb) then req[#req + 1] = "resource_limits" end
  if resources.needs_plane(sb) then req[#req + 1] = "nftables" end
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
  local st = M.state_of(sb)
  if st and st.plane then
    add("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
  else
    add("--unshare-all")
  end
  for _, p in ipairs(core.rootplan.runtime_paths()) do
    local target = core.readlink(p)
    if target then add("--symlink", target, p) else add("--ro-bind-try", p, p) end
  end
  -- egress: the sandbox's own resolver over the runtime's /etc/resolv.conf (corral.egress.plane)
  if st and st.plane and st.plane.resolv_conf then add("--ro-bind", st.plane.resolv_conf, "/etc/resolv.conf") end
  add("--bind", sandbox.storage_path(sb), "/storage")
  if sb.workspace_path then add("--bind", sb.workspace_path, "/workspace") end
  -- As native's: /tmp a capped tmpfs, and the root bubblewrap builds (a tmpfs of its
  -- own) read-only once everything is mounted on it (a conformance run wrote to /).
  local tmp_bytes = require("corral.mechanism.native").TMP_MIB * 1024 * 1024
  add("--proc", "/proc", "--dev", "/dev", "--size", tostring(tmp_bytes), "--tmpfs", "/tmp",
      "--remount-ro", "/", "--chdir", "/storage")
  if seccomp_fd then add("--seccomp", tostring(seccomp_fd)) end
  -- The environment is bubblewrap's own (the spawn gives it exactly the tenant's), not
  -- --setenv arguments: bwrap's command line is /proc/1/cmdline inside, and the values
  -- showed there (found by a red-team run).
  add("--")
  for _, v in ipairs(argv) do a[#a + 1] = v end
  return a
end

-- Spawns bwrap in the sandbox's cgroup (and netns, with a plane), with the rlimits and,
-- as root, the sandbox's unprivileged host id taken by corral's own spawn step — which
-- re-arms the parent-death signal the id change clears (prlimit and setpriv did this
-- before, and left a window where a killed `corral run` orphaned the tenant).
-- bubblewrap reports its own failures (e.g. a missing command) as status 1.
local function spawn(sb, st, argv, opts)
  local bwrap = tool("bwrap")
  if not bwrap then
    return nil, errors.cannot_enforce("bwrap", "needs bwrap on PATH")
  end
  local prog_path = os.tmpname()
  local f = assert(io.open(prog_path, "wb"))
  f:write(assert(core.seccomp.tenant_program()))
  f:close()
  local prog, perr = core.open(prog_path)
  os.remove(prog_path)
  if not prog then return nil, errors.cannot_enforce("privilege_separation", tostring(perr)) end
  local id = sandbox.host_id(sb)
  local l = sb.limits or {}
  local full = { bwrap }
  for _, v in ipairs(M.args(sb, argv, prog:fileno())) do full[#full + 1] = v end
  local root = core.geteuid() == 0
  local proc, err = core.spawn({ plain = true, plain_ids = root, plain_pidns = root, uid = id, gid = id,
    path = bwrap, argv = full, env = hardening.envp(sb.env),
    rlimits = { core = 0, nofile = l.nofile, fsize = l.fsize, nproc = sandbox.default_nproc(sb) },
    netns = st.plane and st.plane.netns, cgroup_procs = resources.cgroup_procs(st), keep_fds = { prog },
    stdout = opts.stdout, stderr = opts.stderr })
  prog:close()
  if not proc then return nil, errors.cannot_enforce("bwrap", tostring(err)) end
  return proc
end

require("corral.mechanism.lifecycle").build(M, spawn)

return M
