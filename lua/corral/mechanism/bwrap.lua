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
local lifecycle = require "corral.mechanism.lifecycle"
local tenant_root = require "corral.tenant_root"

local M = { name = "bwrap" }

--- What a sandbox under bwrap needs: the tenant profile's guarantees, and bubblewrap.
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  return lifecycle.required_capabilities(sb, { "bwrap" })
end

--- What bwrap builds itself (resource limits are the host's, around it).
-- @treturn {string,...}
function M.constructed_capabilities()
  return { "filesystem_confinement", "privilege_separation", "network_restriction", "rlimits" }
end

local function tool(name)
  local path = core.path.resolve_executable(name)
  if not path or path:sub(1, 1) ~= "/" then return nil, name .. " not found on PATH" end
  return path
end

-- A root-plan bind as bubblewrap spells it: --bind, --ro-bind, and -try when optional.
local function bind_option(m)
  return (m.rw and "--bind" or "--ro-bind") .. (m.optional and "-try" or "")
end

--- The bwrap argument list for argv under a tenant root plan (see corral.tenant_root),
-- the seccomp program on fd `seccomp_fd`.
-- @tparam table root the root plan
-- @tparam {string,...} argv
-- @tparam[opt] integer seccomp_fd
-- @treturn {string,...}
function M.args(root, argv, seccomp_fd)
  local a = { "--die-with-parent", "--new-session", "--uid", "0", "--gid", "0",
              "--hostname", root.hostname, "--cap-drop", "ALL" }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  if root.netns then
    add("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")
  else
    add("--unshare-all")
  end
  for _, m in ipairs(root.mounts) do
    if m.type == "symlink" then
      add("--symlink", m.target, m.dest)
    else
      add(bind_option(m), m.src, m.dest)
    end
  end
  -- As native's: /tmp a capped tmpfs, and the root bubblewrap builds (a tmpfs of its
  -- own) read-only once everything is mounted on it (a conformance run wrote to /).
  if root.proc then add("--proc", "/proc") end
  if root.dev then add("--dev", "/dev") end
  if root.tmp_mib then add("--size", tostring(root.tmp_mib * 1024 * 1024), "--tmpfs", "/tmp") end
  add("--remount-ro", "/", "--chdir", root.cwd)
  if seccomp_fd then add("--seccomp", tostring(seccomp_fd)) end
  -- The environment is bubblewrap's own (the spawn gives it exactly the tenant's), not
  -- --setenv arguments: bwrap's command line is /proc/1/cmdline inside, and the values
  -- showed there.
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
  local prog, perr, perrno = core.fd.open(prog_path)
  os.remove(prog_path)
  if not prog then return nil, errors.cannot_enforce("privilege_separation", perr, perrno) end
  local root = tenant_root.plan(sb, st)
  local full = { bwrap }
  for _, v in ipairs(M.args(root, argv, prog:fileno())) do full[#full + 1] = v end
  local as_root = core.proc.geteuid() == 0
  local proc, err, errno = core.spawn.start({ plain = true, plain_ids = as_root, plain_pidns = as_root,
    uid = root.uid, gid = root.gid, path = bwrap, argv = full, env = root.env, rlimits = root.rlimits,
    netns = root.netns, cgroup_procs = root.cgroup_procs, keep_fds = { prog },
    stdout = opts.stdout, stderr = opts.stderr })
  prog:close()
  if not proc then return nil, errors.cannot_enforce("bwrap", err, errno) end
  return proc
end

lifecycle.build(M, spawn)

return M
