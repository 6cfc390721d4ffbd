--- The `native` mechanism: tenant sandboxes built from corral's own kernel primitives.
--
-- Each command runs as root of a fresh user namespace mapped to an unprivileged host id
-- (distinct per sandbox), in new mount, pid, ipc, uts, cgroup and net namespaces (the net
-- namespace is empty: no network unless an egress allowlist is given), under a root that
-- shows the runtime read-only, the sandbox's storage read-write at /storage, its
-- workspace at /workspace, a fresh /proc, a minimal /dev and a 64 MiB tmpfs /tmp; every
-- capability dropped, no_new_privs, the tenant seccomp filter, a new session, rlimits,
-- and a cgroup beneath the host's own for memory, pids and cpu.
--
-- disk_quota is not constructed: /storage is a plain host directory. Only /tmp is
-- bounded (a size-capped tmpfs, whose pages the memory cgroup also charges).
-- @module corral.mechanism.native
local core = require "corral.core"
local errors = require "corral.errors"
local sandbox = require "corral.sandbox"
local hardening = require "corral.hardening"
local capability = require "corral.capability"

local limits = require "corral.limits"
local resources = require "corral.resources"

local M = { name = "native" }

M.TMP_MIB = 64

--- What a sandbox under this mechanism needs: the tenant profile's guarantees, plus the
-- kernel features native builds them from.
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction",
                "user_namespaces", "seccomp" }
  if limits.wants_cgroup(sb) then req[#req + 1] = "resource_limits" end
  if resources.needs_plane(sb) then req[#req + 1] = "nftables" end
  return req
end

--- What native builds itself (user_namespaces and seccomp come from the host kernel and
-- are asked of the probe; resource_limits is constructed only where cgroups hold).
-- @treturn {string,...}
function M.constructed_capabilities()
  local c = { "filesystem_confinement", "privilege_separation", "network_restriction" }
  if capability.check("cgroups").holds then c[#c + 1] = "resource_limits" end
  return c
end

-- The runtime, read-only, at the same paths; merged-/usr links recreated as links.
local function runtime_binds(binds, links)
  for _, p in ipairs(core.rootplan.runtime_paths()) do
    local target = core.readlink(p)
    if target then
      links[#links + 1] = { target = target, path = p }
    else
      binds[#binds + 1] = { src = p, dest = p, optional = true }
    end
  end
end

--- The spawn plan for running argv in sandbox sb (see core.spawn).
-- @tparam table sb a validated sandbox
-- @tparam {string,...} argv
-- @tparam[opt] table opts `extra_binds` (list of {src, dest}), stdin/stdout/stderr
-- @treturn table plan
-- @return[2] nil
-- @treturn[2] table error
function M.plan(sb, argv, opts)
  opts = opts or {}
  local st = M.state_of(sb)
  local binds, links = {}, {}
  runtime_binds(binds, links)
  -- egress: the sandbox's own resolver over the runtime's /etc/resolv.conf (corral.egress.plane)
  local resolv = st and st.plane and st.plane.resolv_conf
  if resolv then binds[#binds + 1] = { src = resolv, dest = "/etc/resolv.conf" } end
  binds[#binds + 1] = { src = sandbox.storage_path(sb), dest = "/storage", rw = true }
  if sb.workspace_path then
    binds[#binds + 1] = { src = sb.workspace_path, dest = "/workspace", rw = true }
  end
  for _, b in ipairs(opts.extra_binds or {}) do binds[#binds + 1] = b end
  local path = argv[1]
  if not path:find("/", 1, true) then
    path = core.resolve_executable(path, sb.env.PATH)
  end
  local lim = sb.limits or {}
  local id = sandbox.host_id(sb)
  local plan = {
    path = path, argv = argv, env = hardening.envp(sb.env), cwd = "/storage",
    hostname = "corral", new_net = not (st and st.plane), netns = st and st.plane and st.plane.netns,
    uid = id, gid = id,
    binds = binds, symlinks = links, proc = true, dev = true, tmp_mib = M.TMP_MIB,
    seccomp = true,
    rlimits = { core = 0, nofile = lim.nofile, fsize = lim.fsize, nproc = sandbox.default_nproc(sb) },
    cgroup_procs = resources.cgroup_procs(st),
    stdin = opts.stdin, stdout = opts.stdout, stderr = opts.stderr,
  }
  return plan
end

-- Spawns argv in new namespaces, or, when the sandbox has a running process (`start`),
-- inside it: same pid namespace, same /tmp, same network, same cgroup.
local function spawn(sb, st, argv, opts)
  local plan = M.plan(sb, argv, opts)
  if st.process and st.process:running() then plan.join = st.process end
  local proc, err, errno, step = core.spawn(plan)
  if not proc and step == "exec" then
    -- The sandbox was built and the command itself could not run: the tenant's failure,
    -- reported as a shell does (127 not found, 126 not executable), not corral's.
    return nil, nil, { code = errno == core.errno.ENOENT and 127 or 126, how = "exited", error = err }
  end
  if not proc then return nil, errors.cannot_enforce("filesystem_confinement", err) end
  return proc
end

require("corral.mechanism.lifecycle").build(M, spawn)

return M
