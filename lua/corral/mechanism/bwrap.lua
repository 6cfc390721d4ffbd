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

-- The host path that inside path p (absolute, no . or ..) shows under the root plan:
-- the deepest mount holding it, through the merged-/usr links; nil when no mount does.
local function host_path(root, p, depth)
  local best
  for _, m in ipairs(root.mounts) do
    if (p == m.dest or p:sub(1, #m.dest + 1) == m.dest .. "/") and (not best or #m.dest > #best.dest) then
      best = m
    end
  end
  if not best then return nil end
  local rest = p:sub(#best.dest + 1)
  if best.type ~= "symlink" then return best.src .. rest end
  if depth > 8 then return nil end
  local target = best.target
  if target:sub(1, 1) ~= "/" then target = best.dest:match("^(.*)/") .. "/" .. target end
  return host_path(root, target .. rest, depth + 1)
end

-- Whether inside path p is surely absent from the tenant's root ("missing"), a directory
-- or a file no one may execute ("denied"), or else nil (bubblewrap is left to try): a
-- symlink on the way, or a path under what bubblewrap makes itself, is not judged here.
local function judge(root, p)
  local parts = {}
  for c in p:gmatch("[^/]+") do
    if c == ".." then parts[#parts] = nil elseif c ~= "." then parts[#parts + 1] = c end
  end
  p = "/" .. table.concat(parts, "/")
  local host = host_path(root, p, 0)
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
  -- Absent here; but a link between the mount and the file could point elsewhere inside.
  local dir = host
  while true do
    dir = dir:match("^(.*)/[^/]*$")
    if not dir or dir == "" then return "missing" end
    local dst = core.fs.lstat(dir)
    if dst and dst.type == "link" then return nil end
    if dst then return "missing" end
  end
end

-- The result of a command bubblewrap could not run, found before it starts (bubblewrap
-- itself would exit 1, saying so on the tenant's stderr): 127 not found, 126 not
-- executable, as native and a shell report them. nil when it may run.
local function not_runnable(root, sb, cmd)
  local verdict
  if cmd:find("/", 1, true) then
    verdict = judge(root, cmd:sub(1, 1) == "/" and cmd or (root.cwd .. "/" .. cmd))
  else
    -- Without one absolute PATH entry to look in, bubblewrap's execvp decides.
    for dir in ((sb.env or {}).PATH or ""):gmatch("[^:]+") do
      if dir:sub(1, 1) == "/" then
        verdict = judge(root, dir .. "/" .. cmd) ~= "missing" and "found" or verdict or "missing"
        if verdict == "found" then break end
      end
    end
  end
  if verdict == "missing" then
    return { code = 127, how = "exited", error = "spawn: exec: No such file or directory" }
  elseif verdict == "denied" then
    return { code = 126, how = "exited", error = "spawn: exec: Permission denied" }
  end
end

-- Spawns bwrap in the sandbox's cgroup (and netns, with a plane), with the rlimits and,
-- as root, the sandbox's unprivileged host id taken by corral's own spawn step — which
-- re-arms the parent-death signal the id change clears (prlimit and setpriv did this
-- before, and left a window where a killed `corral run` orphaned the tenant).
-- bubblewrap reports its own failures as status 1; a missing command is found first.
local function spawn(sb, st, argv, opts)
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
