--- The `bwrap` mechanism: tenant sandboxes built by the system's bubblewrap.
--
-- For hosts that allow unprivileged user namespaces only to bubblewrap. bubblewrap runs
-- as the sandbox's unprivileged host id, so the tenant's root never maps to host root,
-- and builds the same root plan as native (corral.tenant_root). It constructs no
-- resource limits: the host starts it inside a cgroup beneath its own. With an egress
-- plane, bubblewrap is started inside the host-programmed netns (joined while still
-- privileged, so the user namespace it then makes owns nothing in it: invariant 4 of
-- docs/architecture.md). As root, an operator-made storage or workspace (idmapped) and a
-- disk of its own are detached trees corral makes and places over their host paths in
-- the private mount namespace bubblewrap starts in (corral.resources.tree).
-- @module corral.mechanism.bwrap
local core = require "corral.core"
local errors = require "corral.errors"
local lifecycle = require "corral.mechanism.lifecycle"
local proctree = require "corral.proctree"
local resources = require "corral.resources"
local tenant_root = require "corral.tenant_root"

local M = { name = "bwrap" }

--- What a sandbox under bwrap needs: the tenant profile's guarantees, and bubblewrap.
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  return lifecycle.required_capabilities(sb, { "bwrap" })
end

--- What bwrap builds itself (resource limits are the host's, around it).
function M.constructed_capabilities()
  return { "filesystem_confinement", "privilege_separation", "network_restriction", "rlimits", "workspace" }
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

--- The bwrap argument list for argv under a tenant root plan, seccomp on `seccomp_fd`.
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
  -- as native's: /tmp a capped tmpfs, and bubblewrap's own root tmpfs read-only once
  -- everything is mounted on it, else the tenant can write to /
  if root.proc then add("--proc", "/proc") end
  if root.dev then add("--dev", "/dev") end
  if root.tmp_mib then add("--size", tostring(root.tmp_mib * 1024 * 1024), "--tmpfs", "/tmp") end
  add("--remount-ro", "/", "--chdir", root.cwd)
  if seccomp_fd then add("--seccomp", tostring(seccomp_fd)) end
  -- the environment is the spawn's (exactly the tenant's), not --setenv: bwrap's command
  -- line is /proc/1/cmdline inside, where the values would show
  -- The command goes through the tenant's /bin/sh (tenant_root.shell_argv): bubblewrap's
  -- own execvp would exit 1 both for a command not found and for one not executable.
  add("--")
  for _, v in ipairs(tenant_root.shell_argv(argv)) do a[#a + 1] = v end
  return a
end

-- The host path inside path p shows under the root plan (the deepest mount holding it,
-- through the merged-/usr links), nil, or false when a tree shows there instead.
local function host_path(root, p, depth)
  local best
  for _, m in ipairs(root.mounts) do
    if (p == m.dest or p:sub(1, #m.dest + 1) == m.dest .. "/") and (not best or #m.dest > #best.dest) then
      best = m
    end
  end
  if not best then return nil end
  if best.tree then return false end -- a tree shown instead of the host path: unknown here
  local rest = p:sub(#best.dest + 1)
  if best.type ~= "symlink" then return best.src .. rest end
  if depth > 8 then return nil end
  local target = best.target
  if target:sub(1, 1) ~= "/" then target = best.dest:match("^(.*)/") .. "/" .. target end
  return host_path(root, target .. rest, depth + 1)
end

-- Whether inside path p is surely "missing" from the tenant's root or "denied" (a
-- directory, or not executable); nil leaves it to bubblewrap (a symlink on the way, a
-- path under what bubblewrap makes itself).
local function judge(root, p)
  local parts = {}
  for c in p:gmatch("[^/]+") do
    if c == ".." then parts[#parts] = nil elseif c ~= "." then parts[#parts + 1] = c end
  end
  p = "/" .. table.concat(parts, "/")
  local host = host_path(root, p, 0)
  if host == false then return nil end
  if not host then
    local top = parts[1]
    if top == "proc" or top == "dev" or top == "tmp" then return nil end
    return "missing"
  end
  local st = core.fs.lstat(host)
  if st and st.type == "link" then return nil end
  if st then
    if st.type == "dir" or st.mode & tonumber("111", 8) == 0 then return "denied" end
    return nil
  end
  -- a link between the mount and the file could still point elsewhere inside
  local dir = host
  while true do
    dir = dir:match("^(.*)/[^/]*$")
    if not dir or dir == "" then return "missing" end
    local dst = core.fs.lstat(dir)
    if dst and dst.type == "link" then return nil end
    if dst then return "missing" end
  end
end

-- 127 not found / 126 not executable, found before bubblewrap starts (it would exit 1,
-- saying so on the tenant's stderr), as native and a shell report them; nil when runnable.
local function not_runnable(root, sb, cmd)
  local verdict
  if cmd:find("/", 1, true) then
    verdict = judge(root, cmd:sub(1, 1) == "/" and cmd or (root.cwd .. "/" .. cmd))
  else
    for dir in ((sb.env or {}).PATH or ""):gmatch("[^:]+") do
      if dir:sub(1, 1) == "/" then
        verdict = judge(root, dir .. "/" .. cmd) ~= "missing" and "found" or verdict or "missing"
        if verdict == "found" then break end
      end
    end
  end
  if verdict == "missing" then
    return { code = core.exit.NOTFOUND, how = "exited", error = "spawn: exec: No such file or directory" }
  elseif verdict == "denied" then
    return { code = core.exit.NOEXEC, how = "exited", error = "spawn: exec: Permission denied" }
  end
end

-- bubblewrap's own pid 1 inside the sandbox it built for the started process (the first
-- process beneath it in a user namespace other than ours), once that sandbox is built:
-- its command runs (a process beneath it that is not bubblewrap). Joined earlier, a
-- command could enter a mount namespace whose root is still being assembled.
local function inner_pid(proc)
  local own = core.fs.readlink("/proc/self/ns/user")
  for _, pid in ipairs(proctree.descendants(proc:pid())) do
    local ns = core.fs.readlink("/proc/" .. pid .. "/ns/user")
    if ns and ns ~= own then
      for _, below in ipairs(proctree.descendants(pid)) do
        if proctree.comm(below) ~= "bwrap" then return pid end
      end
      return nil
    end
  end
end

--- The process whose root is the sandbox's (a session's pty is opened through it).
-- @tparam table sb
-- @treturn integer|nil
function M.root_pid(sb)
  local init = M.process_of(sb)
  return init and init:running() and inner_pid(init) or nil
end

-- A command joined into the sandbox the started process runs: core.spawn's join onto
-- bubblewrap's pid 1 inside (its namespaces; the tenant filter, the empty capability set
-- and no_new_privs applied by the joining process itself, as native's exec does).
local function spawn_joined(sb, st, argv, opts)
  local inner = inner_pid(st.process)
  if not inner then return nil, errors.cannot_enforce("bwrap", "bubblewrap's sandbox is not running (yet)") end
  local plan, perr = require("corral.mechanism.native").plan(sb, st, argv, setmetatable({ join = true },
    { __index = opts }))
  if not plan then return nil, perr end
  plan.join = inner
  local proc, err, errno = core.spawn.start(plan)
  if not proc and err and err:match("^spawn: exec: ") then
    local code = errno == core.errno.ENOENT and core.exit.NOTFOUND or core.exit.NOEXEC
    return nil, nil, { code = code, how = "exited", error = err }
  end
  if not proc then return nil, errors.cannot_enforce("bwrap", err, errno) end
  return proc
end

-- Spawns bwrap in the sandbox's cgroup (and netns), with the rlimits and the sandbox's
-- host id set by corral's own spawn, which re-arms the parent-death signal the id change
-- clears: a killed `corral run` must not orphan the tenant. A missing command is found first.
local function spawn(sb, st, argv, opts)
  if opts.joining then return spawn_joined(sb, st, argv, opts) end
  local bwrap = tool("bwrap")
  if not bwrap then
    return nil, errors.cannot_enforce("bwrap", "needs bwrap on PATH")
  end
  local root = tenant_root.plan(sb, st)
  local failed = not_runnable(root, sb, argv[1])
  if failed then return nil, nil, failed end
  local prog_path = os.tmpname()
  local f = assert(io.open(prog_path, "wb"))
  f:write(assert(core.seccomp.tenant_program()))
  f:close()
  local prog, perr, perrno = core.fd.open(prog_path)
  os.remove(prog_path)
  if not prog then return nil, errors.cannot_enforce("privilege_separation", perr, perrno) end
  local full = { bwrap }
  for _, v in ipairs(M.args(root, argv, prog:fileno())) do full[#full + 1] = v end
  -- an idmapped storage or workspace, or a disk: placed over its own path in the helper's
  -- private mount namespace, where bubblewrap binds it from (nothing on the host's table)
  local attach = {}
  for _, m in ipairs(root.mounts) do
    if m.tree then
      local tree, terr = resources.tree(st, m.tree)
      if not tree then
        for _, a in ipairs(attach) do a.tree:close() end
        prog:close()
        return nil, terr
      end
      attach[#attach + 1] = { tree = tree, path = m.src }
    end
  end
  local as_root = core.proc.geteuid() == 0
  -- a session of its own: a terminal's Ctrl-C reaches corral, which hands it to the command
  local proc, err, errno = core.spawn.start({ plain = true, new_session = true, plain_ids = as_root,
    plain_pidns = as_root,
    uid = root.uid, gid = root.gid, path = bwrap, argv = full, env = root.env, rlimits = root.rlimits,
    netns = root.netns, cgroup_procs = root.cgroup_procs, keep_fds = { prog }, attach = attach,
    stdout = opts.stdout, stderr = opts.stderr })
  prog:close()
  for _, a in ipairs(attach) do a.tree:close() end
  if not proc then return nil, errors.cannot_enforce("bwrap", err, errno) end
  return proc
end

-- bubblewrap opens the storage by its path as the host id: the directories above must let it
-- A forwarded signal goes to the command bubblewrap started and what runs beneath it:
-- sent to bubblewrap, it dies of it at once and takes the sandbox with it, before a
-- handler in the command could run. The command is the first process beneath the spawned
-- one that is not bubblewrap's (or corral's own init for it); until it runs, false.
local function deliver(proc, sig)
  for _, pid in ipairs(proctree.descendants(proc:pid())) do
    local comm = proctree.comm(pid)
    if comm and comm ~= "bwrap" and comm ~= "corral-init" then
      core.proc.kill(pid, sig)
      for _, below in ipairs(proctree.descendants(pid)) do core.proc.kill(below, sig) end
      return true
    end
  end
  return false
end

lifecycle.build(M, spawn, { trees = true, by_path = true }, deliver, true)

return M
