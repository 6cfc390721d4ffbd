--- The tenant's root plan: what a sandboxed command sees and runs with, built once as a
-- plain table each mechanism renders (native: a `core.spawn.start` plan; bwrap: argv;
-- oci: engine flags), and the /bin/sh each renderer but native execs the command through.
--
-- Fields: `mounts` (in order: merged-/usr symlinks, then binds: the runtime read-only,
-- optional where this host lacks a path; the sandbox's own name files over the runtime's
-- (`own`: corral.name_files); storage at /storage, workspace at /workspace,
-- both read-write, and named by `tree` when the renderer must show the tree
-- corral.resources.tree makes instead of the path: an idmapped directory, a disk),
-- `proc`, `dev`, `tmp_mib`, `cwd`, `hostname`, `uid`/`gid` (the unprivileged host
-- id), `env` (sorted "NAME=value"), `rlimits` (nil: inherited),
-- `netns` (the egress plane's, or nil for a new empty one), `cgroup_procs`.
-- Every renderer adds itself: the root read-only, every capability dropped,
-- no_new_privs, the tenant seccomp filter, a new session and fresh namespaces.
-- @module corral.tenant_root
local core = require "corral.core"
local sandbox = require "corral.sandbox"
local hardening = require "corral.hardening"
local resources = require "corral.resources"
local fdlimit = require "corral.egress.fdlimit"
local name_files = require "corral.name_files"

local M = {}

--- The size of the tenant's /tmp, in MiB; its pages are also charged to the memory cgroup.
M.TMP_MIB = 64

--- The root plan for sandbox sb.
-- @tparam table sb a validated sandbox
-- @tparam[opt] table st the host's state for it (`plane`, `cgroup`); nil when unprovisioned
-- @treturn table plan
function M.plan(sb, st)
  local mounts = {}
  for _, p in ipairs(core.rootplan.runtime_paths()) do
    local target = core.fs.readlink(p)
    if target then
      mounts[#mounts + 1] = { type = "symlink", target = target, dest = p }
    else
      mounts[#mounts + 1] = { type = "bind", src = p, dest = p, optional = true }
    end
  end
  -- the sandbox's own hosts file, resolver and nsswitch.conf over the runtime's
  -- (corral.name_files); `own`: bound whatever image shows the runtime
  local names = st and st.names
  if names then
    for _, dest in ipairs(core.rootplan.name_files()) do
      -- a host without /etc/hostname shows the tenant no name of its own to hide
      if dest ~= "/etc/hostname" or core.fs.lstat(dest) then
        mounts[#mounts + 1] = { type = "bind", src = assert(names.files[dest], dest), dest = dest, own = true }
      end
    end
  end
  if names and names.ca_bundle then
    mounts[#mounts + 1] = { type = "bind", src = names.ca_bundle, dest = sandbox.CA_BUNDLE, own = true }
  end
  -- as root, native and bwrap show these as trees this process makes (corral.resources.tree)
  local trees = st and st.trees
  mounts[#mounts + 1] = { type = "bind", src = sandbox.storage_path(sb), dest = "/storage", rw = true,
                          tree = trees and "storage" or nil }
  if sb.workspace_path then
    mounts[#mounts + 1] = { type = "bind", src = sb.workspace_path, dest = "/workspace", rw = true,
                            tree = trees and st.workspace and "workspace" or nil }
  end
  local lim = sb.limits or {}
  local id = sandbox.host_id(sb)
  return {
    mounts = mounts, proc = true, dev = true, tmp_mib = M.TMP_MIB,
    cwd = "/storage", hostname = name_files.HOSTNAME, uid = id, gid = id,
    env = hardening.envp(sb.env),
    -- without --nofile, the limit the host started with, not the one its egress plane
    -- raised for itself (corral.egress.fdlimit)
    rlimits = { core = 0, nofile = lim.nofile or fdlimit.inherited(), fsize = lim.fsize,
                nproc = sandbox.default_nproc(sb) },
    netns = st and st.plane and st.plane.netns,
    cgroup_procs = resources.cgroup_procs(st),
  }
end

--- argv exec'd by the tenant's own /bin/sh: a command that cannot be run exits 127 (not
-- found) or 126 (not executable) as under native, where a renderer's own exec (bubblewrap's
-- execvp, an engine's runtime) would exit 1 or the engine's status for both. sh replaces
-- itself, so the command keeps its pid (a container's first process stays the command).
-- @tparam {string,...} argv
-- @treturn {string,...} `/bin/sh -c 'exec "$0" "$@"'` then argv
function M.shell_argv(argv)
  local out = { "/bin/sh", "-c", 'exec "$0" "$@"' }
  table.move(argv, 1, #argv, #out + 1, out)
  return out
end

return M
