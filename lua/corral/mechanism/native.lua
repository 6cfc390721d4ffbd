--- The `native` mechanism: tenant sandboxes built from corral's own kernel primitives.
--
-- Each command runs as root of a fresh user namespace mapped to a per-sandbox
-- unprivileged host id, in new mount, pid, ipc, uts, cgroup and (empty) net
-- namespaces, under the root plan of corral.tenant_root. As root, the storage and the
-- workspace are detached trees made by this process before each spawn (corral.resources:
-- an operator-made directory through an idmapped mount, a disk of its own with
-- limits.disk), so the tenant needs no access to the directories above them.
-- @module corral.mechanism.native
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local probe = require "corral.probe"
local lifecycle = require "corral.mechanism.lifecycle"
local resources = require "corral.resources"
local tenant_root = require "corral.tenant_root"

local M = { name = "native" }

--- What a sandbox under native needs: the tenant guarantees and the kernel features.
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  return lifecycle.required_capabilities(sb, { "user_namespaces", "seccomp" })
end

--- What native builds itself; user_namespaces and seccomp are asked of the probe.
-- @treturn {string,...}
function M.constructed_capabilities()
  local c = { "filesystem_confinement", "privilege_separation", "network_restriction", "rlimits", "workspace" }
  if probe.check("cgroups").holds then c[#c + 1] = "resource_limits" end
  return c
end

-- A joined command enters a root already built (core.spawn makes no tree, no mount):
-- of the root plan it takes what the joining process applies itself (environment, cwd,
-- rlimits, cgroup), which stays the same while the process it joins runs; so it is
-- planned once per started process, not on every exec.
local function joined_root(sb, st)
  if st and st.joined and st.joined.process == st.process then return st.joined.root end
  local root = tenant_root.plan(sb, st)
  if st then st.joined = { process = st.process, root = root } end
  return root
end

--- The core.spawn.start plan for argv in sb, argv[1] resolved through the tenant's PATH.
-- @tparam table sb a validated sandbox
-- @tparam[opt] table st the host's state for it (nil: not provisioned)
-- @tparam {string,...} argv
-- @tparam[opt] table opts stdin/stdout/stderr; `join`: the command joins a running
--   sandbox, whose root is built already (no tree is made); `env` (name → value, checked
--   by the caller) and `cwd` instead of the sandbox's; `ctty`: stdin is a pty's slave
--   that becomes the command's controlling terminal; `meanwhile`: a function called
--   once the sandbox's init is made, while it builds the root (not when the command
--   joins a running sandbox directly)
-- @treturn table plan
-- @treturn[2] nil and cannot_enforce when a detached tree cannot be made
function M.plan(sb, st, argv, opts)
  opts = opts or {}
  local root = opts.join and joined_root(sb, st) or tenant_root.plan(sb, st)
  local binds, links = {}, {}
  for _, m in ipairs(opts.join and {} or root.mounts) do
    if m.type == "symlink" then
      links[#links + 1] = { target = m.target, path = m.dest }
    else
      local tree, err
      if m.tree and not opts.join then
        tree, err = resources.tree(st, m.tree)
        if not tree then
          M.close_trees({ binds = binds })
          return nil, err
        end
      end
      binds[#binds + 1] = { src = m.src, dest = m.dest, rw = m.rw, optional = m.optional, tree = tree }
    end
  end
  local path = argv[1]
  if not path:find("/", 1, true) then
    path = core.path.resolve_executable(path, sb.env.PATH)
  end
  return {
    path = path, argv = argv, env = opts.env and hardening.envp(opts.env) or root.env, cwd = opts.cwd or root.cwd,
    ctty = opts.ctty,
    hostname = root.hostname, new_net = root.netns == nil, netns = root.netns,
    uid = root.uid, gid = root.gid,
    binds = binds, symlinks = links, proc = root.proc, dev = root.dev, tmp_mib = root.tmp_mib,
    seccomp = true, rlimits = root.rlimits, cgroup_procs = root.cgroup_procs,
    stdin = opts.stdin, stdout = opts.stdout, stderr = opts.stderr,
    meanwhile = opts.meanwhile,
  }
end

-- The capability a failed spawn step enforces, so that a refusal names it (and the probe
-- that said it holds is dropped: corral.probe.failed).
local STEP_CAPABILITY = {
  ["prepare"] = "user_namespaces", ["id maps"] = "user_namespaces", ["set ids"] = "user_namespaces",
  ["cgroup namespace"] = "user_namespaces", ["wait for parent"] = "user_namespaces",
  ["seccomp"] = "seccomp",
  ["drop capabilities"] = "privilege_separation", ["no_new_privs"] = "privilege_separation",
  ["loopback up"] = "network_restriction",
  ["cgroup attach"] = "resource_limits", ["rlimits"] = "resource_limits",
}

--- Closes the detached trees a plan holds (after the spawn has moved them, or failed).
-- @tparam table plan
function M.close_trees(plan)
  for _, b in ipairs(plan.binds or {}) do
    if b.tree then b.tree:close() end
  end
end

-- Spawns argv in new namespaces, or, when the sandbox has a running process (`start`),
-- inside it: same pid namespace, same /tmp, same network, same cgroup.
local function spawn(sb, st, argv, opts)
  local join = st.process and st.process:running() and st.process or nil
  local plan, perr = M.plan(sb, st, argv, setmetatable({ join = join }, { __index = opts }))
  if not plan then return nil, perr end
  plan.join = join
  local proc, err, errno = core.spawn.start(plan)
  M.close_trees(plan)
  local step = err and err:match("^spawn: (.-): ")
  if not proc and step == "exec" then
    -- the command itself could not run: the tenant's failure, reported as a shell does
    local code = errno == core.errno.ENOENT and core.exit.NOTFOUND or core.exit.NOEXEC
    return nil, nil, { code = code, how = "exited", error = err }
  end
  if not proc then
    return nil, errors.cannot_enforce(STEP_CAPABILITY[step] or "filesystem_confinement", err, errno)
  end
  return proc
end

lifecycle.build(M, spawn, { trees = true }, nil, true)

--- exec's `opts.meanwhile` is called while the sandbox's init builds its root (plan's).
M.exec_meanwhile = true

return M
