--- The `oci` mechanism: tenant sandboxes run as containers of an OCI engine (podman or
-- docker), for hosts whose own kernel cannot construct what native needs.
--
-- Every engine call is an argv with a timeout, never a shell; an engine's failure is
-- returned verbatim with the command that failed. The container's root is the tenant
-- root plan (corral.tenant_root) rendered into engine flags: the runtime bound read-only
-- at the same paths, the storage read-write at /storage, the workspace at /workspace
-- when set, a 64 MiB tmpfs /tmp, the plan's environment (through an env file, never the
-- engine's command line) and rlimits; the root read-only, `--cap-drop ALL`,
-- no-new-privileges, the tenant seccomp filter as a profile
-- (corral.mechanism.oci.seccomp), the plan's unprivileged host id as the user, and
-- memory, cpu and pids caps at create time. The image is corral's own, imported once and
-- cached by content (corral.mechanism.oci.image), or one the operator names.
--
-- Network: `--network none`; with an egress allowlist or a service_port the container
-- joins corral's own sandbox netns (`--network ns:PATH`, podman), made and programmed
-- before the container exists, as native's: the same acceptor, DNS responder and ruleset
-- apply, and a service_port is corral's inbound relay from 127.0.0.1:N on the host to the
-- port inside. The engine's own networks are never joined (a bridge would route the
-- sandbox to every other container on it, and out).
--
-- Constructed: resource_limits, filesystem_confinement, network_restriction. Stated
-- omissions (`M.OMITTED`, which the conformance suite reports):
--
-- * disk_quota: the engine's size option is refused by the overlay driver over ext4
--   (status 125, "… only supported for backingFS XFS"; tests/oci_spec.lua measures it on
--   each run); where it is accepted it bounds only the container's own layer, which is
--   read-only here, and /storage is a plain host directory.
-- * privilege_separation: the tenant runs as an unprivileged host id with no capability,
--   but in the host's user namespace and beside an engine that runs as root; corral
--   does not build the separation native does.
--
-- Configuration: `M.config` (engine, image, timeout) and `M.config.engines[NAME]` (global
-- flags, ulimits, extra run flags per engine), which the operator's Lua may change. The
-- defaults are what this host's podman needs: `--runtime runc`, the cgroupfs manager,
-- and explicit nofile and nproc ulimits (its default nofile exceeds the hard limit).
-- @module corral.mechanism.oci
local core = require "corral.core"
local file = require "corral.file"
local errors = require "corral.errors"
local shell = require "corral.shell"
local sandbox = require "corral.sandbox"
local leftovers = require "corral.leftovers"
local resources = require "corral.resources"
local tenant_root = require "corral.tenant_root"
local image = require "corral.mechanism.oci.image"
local seccomp = require "corral.mechanism.oci.seccomp"

local M = { name = "oci" }

--- The capabilities oci does not construct, each with why.
M.OMITTED = {
  disk_quota = "not constructed: the engine's size option (--storage-opt size=) is refused by the overlay " ..
    "driver unless it is backed by XFS (measured: tests/oci_spec.lua, \"the engine's size option\"), and " ..
    "where accepted bounds only the container's read-only layer; /storage is a plain host directory",
  privilege_separation = "not constructed: the tenant is an unprivileged host id without capabilities, but in " ..
    "the host's user namespace, beside an engine running as root",
}

--- What the operator may change (before the first provision).
M.config = {
  engine = nil,  -- "podman", "docker" or a path; nil: the first of them on PATH
  image = nil,   -- an image to run instead of corral's own (it then supplies the runtime)
  timeout = 60,  -- seconds for each engine call that is not the tenant's own command
  engines = {
    podman = { global = { "--runtime", "runc", "--cgroup-manager", "cgroupfs" },
               ulimits = { nofile = "1024:1024", nproc = "1024:1024" }, run = {} },
    docker = { global = {}, ulimits = { nofile = "1024:1024", nproc = "1024:1024" }, run = {} },
  },
}

local ENGINE_ENV = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }

local state = {} -- sandbox id → {storage_lock =, plane =, process =, name =, run =, ...}
local engine_cache, image_ready, scratch, seq, swept = nil, {}, nil, 0, false

--- The engine to drive: `{path =, kind = "podman"|"docker", conf =}`, or nil and why.
-- @tparam[opt] string name overrides `M.config.engine`
function M.engine(name)
  name = name or M.config.engine
  if engine_cache and engine_cache.name == name then return engine_cache end
  for _, cand in ipairs(name and { name } or { "podman", "docker" }) do
    local path = cand:sub(1, 1) == "/" and cand or core.path.resolve_executable(cand)
    if path and path:sub(1, 1) == "/" and core.fs.lstat(path) then
      local kind = path:match("docker[^/]*$") and "docker" or "podman"
      engine_cache = { name = name, path = path, kind = kind, conf = M.config.engines[kind] or {} }
      return engine_cache
    end
  end
  return nil, name and (name .. " not found") or "neither podman nor docker is on PATH"
end

-- corral's own files for the engine (the seccomp profile, env files): a root-only
-- directory, never a name in a shared directory another user could have made.
local function scratch_dir()
  if scratch then return scratch end
  if core.proc.geteuid() == 0 then
    local dir = "/run/corral-oci"
    core.fs.mkdir(dir, tonumber("700", 8))
    local st = core.fs.lstat(dir)
    if st and st.type == "dir" and st.uid == 0 then scratch = dir return dir end
  end
  scratch = assert(core.fs.mkdtemp(leftovers.base() .. "/corral-oci-"))
  return scratch
end

local function write_private(path, text)
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  core.fs.chmod(path, tonumber("600", 8))
  f:write(text)
  f:close()
  return path
end

-- What the engine wrote to path ("" when it wrote nothing).
local function read_all(path) return file.read(path) or "" end

-- A private directory (0700, in corral's root-only one) for one engine call: its working
-- directory, and its files (output, env file). conmon writes files such as `oom` into
-- its working directory, which must never be the caller's.
local function private_dir()
  return leftovers.make(scratch_dir(), "call-")
end

-- The engine's argv for a subcommand: its path, the configured global flags, args.
local function argv_of(eng, args)
  local full = { eng.path }
  for _, v in ipairs(eng.conf.global or {}) do full[#full + 1] = v end
  for _, v in ipairs(args) do full[#full + 1] = v end
  return full
end

--- Runs an engine subcommand to completion (at most `M.config.timeout` seconds).
-- @tparam {string,...} args the subcommand and its arguments
-- @treturn[1] string its stdout
-- @return[2] nil
-- @treturn[2] table cannot_enforce("oci", the command and the engine's own words)
-- @treturn[2] integer the exit status
function M.call(args)
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  local full = argv_of(eng, args)
  local dir, derr = private_dir()
  if not dir then return nil, errors.cannot_enforce("oci", "a private directory for the engine: " .. tostring(derr)) end
  local out_path = dir .. "/out"
  local out, err_f = io.open(out_path, "w"), io.open(out_path .. ".err", "w")
  local devnull = io.open("/dev/null")
  local proc, serr = core.spawn.start({ plain = true, new_session = true, path = eng.path, argv = full,
    env = ENGINE_ENV, cwd = dir, stdin = devnull, stdout = out, stderr = err_f })
  devnull:close()
  out:close()
  err_f:close()
  local code = 125
  if proc then
    code = proc:wait(M.config.timeout)
    if not code then
      proc:kill()
      proc:wait()
      code = nil
    end
    proc:close()
  end
  local stdout, stderr = read_all(out_path), read_all(out_path .. ".err")
  core.fs.remove_tree(dir)
  if code == 0 then return stdout end
  local what = not proc and ("cannot start: " .. tostring(serr))
    or not code and string.format("no answer within %d s", M.config.timeout)
    or string.format("status %d: %s", code, (stderr:gsub("%s+$", "")))
  return nil, errors.cannot_enforce("oci", "`" .. shell.join(full) .. "` failed (" .. what .. ")"), code
end

-- The seccomp profile's file, named by its content.
local function profile_path()
  local text = seccomp.json()
  local path = scratch_dir() .. "/seccomp-" .. core.digest.sha256(text):sub(1, 16) .. ".json"
  if not core.fs.lstat(path) then assert(write_private(path, text)) end
  return path
end

--- The image a sandbox runs: the operator's, or corral's own, imported when this host
-- does not have it yet.
-- @tparam table root a tenant root plan
-- @treturn[1] string the image
-- @return[2] nil
-- @treturn[2] table the engine's error
function M.image(root)
  if M.config.image then
    if not image_ready[M.config.image] then
      local _, err = M.call({ "image", "inspect", "--format", "{{.Id}}", M.config.image })
      if err then return nil, err end
      image_ready[M.config.image] = true
    end
    return M.config.image
  end
  local present = {}
  for _, m in ipairs(root.mounts) do
    if m.type == "symlink" or not m.optional or core.fs.lstat(m.src) then present[#present + 1] = m end
  end
  local archive = image.tar({ mounts = present })
  local tag = image.tag(archive)
  if image_ready[tag] then return tag end
  -- A mark in corral's root-only directory saves the engine call on every later run
  -- (measured: it was a third of `corral run`'s time); a run that then finds the image
  -- gone (status 125) drops the mark, and the next provision imports it again.
  local mark = scratch_dir() .. "/image-" .. tag:match(":(.*)$")
  if core.fs.lstat(mark) then
    image_ready[tag] = mark
    return tag
  end
  if not M.call({ "image", "inspect", "--format", "{{.Id}}", tag }) then
    local path = scratch_dir() .. "/root-" .. core.proc.getpid() .. ".tar"
    assert(write_private(path, archive))
    local _, err = M.call({ "import", path, tag })
    os.remove(path)
    if err then return nil, err end
  end
  write_private(mark, tag .. "\n")
  image_ready[tag] = mark
  return tag
end

--- What a sandbox under oci requires: the guarantees it constructs, plus nftables for an
-- egress plane (an allowlist or a service_port: corral programs it, as for native).
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "network_restriction" }
  if sb.limits and (sb.limits.memory or sb.limits.pids or sb.limits.cpu) then req[#req + 1] = "resource_limits" end
  if sb.network or sb.service_port then req[#req + 1] = "nftables" end
  return req
end

--- What oci constructs, for every sandbox (a service_port too: it is corral's relay
-- into corral's netns, never an engine network).
-- @treturn {string,...}
function M.constructed_capabilities()
  return { "resource_limits", "filesystem_confinement", "network_restriction", "workspace" }
end

--- What a sandbox gives up under oci, as `{capability = why}`: `OMITTED`, whatever the
-- sandbox asks for.
-- @treturn table
function M.reductions()
  local r = {}
  for k, v in pairs(M.OMITTED) do r[k] = v end
  return r
end

-- One bind's --mount value. The engine reads it as a CSV record (podman and docker both),
-- so a path holding a comma would otherwise add options of its own (`DIR,src=/var/log`
-- mounted /var/log): each field that needs it is quoted, its quotes doubled.
local function mount_value(src, dest, ro)
  local function field(k, v)
    local f = k .. "=" .. v
    if f:find('[,"\r\n]') then f = '"' .. f:gsub('"', '""') .. '"' end
    return f
  end
  return table.concat({ "type=bind", field("src", src), field("dst", dest), ro and "ro=true" or nil }, ",")
end

-- The engine flags that build sb's root (everything between `run` and the image).
local function root_flags(sb, st, root, eng)
  local a = {}
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  add("--label", "corral.sandbox=" .. sb.id, "--label", "corral.owner=" .. core.proc.getpid(),
      "--user", root.uid .. ":" .. root.gid, "--hostname", root.hostname, "--workdir", root.cwd,
      "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
      "--security-opt", "seccomp=" .. profile_path(),
      "--tmpfs", string.format("/tmp:rw,nosuid,nodev,size=%dm,mode=1777", root.tmp_mib),
      -- the engine would also copy all the tenant prints into a log file on the host, with
      -- no bound (conmon's k8s-file: 192 MB for a 200 MB print); the attached streams stay
      "--log-driver", "none")
  if eng.kind == "podman" then add("--read-only-tmpfs=false", "--pull", "never") end
  if not M.config.image then
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and (not m.optional or core.fs.lstat(m.src)) then
        add("--mount", mount_value(m.src, m.dest, not m.rw))
      end
    end
  else
    -- the operator's image shows its own runtime, with the sandbox's own name files over it
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and (m.rw or m.own) then add("--mount", mount_value(m.src, m.dest, not m.rw)) end
    end
  end
  local lim = sb.limits or {}
  if lim.memory then add("--memory", tostring(lim.memory), "--memory-swap", tostring(lim.memory)) end
  if lim.cpu then add("--cpus", tostring(lim.cpu)) end
  if lim.pids then add("--pids-limit", tostring(lim.pids)) end
  local ulimits = {}
  for k, v in pairs(eng.conf.ulimits or {}) do ulimits[k] = v end
  -- a table is a limit the host only hands down as it found it (corral.egress.fdlimit):
  -- the engine's own explicit ulimit stands for a container
  for k, v in pairs(root.rlimits) do
    if type(v) == "number" then ulimits[k] = v .. ":" .. v end
  end
  local names = {}
  for k in pairs(ulimits) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add("--ulimit", k .. "=" .. ulimits[k]) end
  if st.plane then
    add("--network", "ns:/proc/" .. core.proc.getpid() .. "/fd/" .. st.plane.netns:fileno())
  else
    add("--network", "none")
  end
  for _, v in ipairs(eng.conf.run or {}) do a[#a + 1] = v end
  return a
end

-- The environment as an env file in a run's private directory (values on the engine's
-- command line would show in every host user's `ps`).
local function env_file(root, dir)
  for _, kv in ipairs(root.env) do
    if kv:find("[\n\r]") then
      return nil, errors.invalid_argument("env", kv:match("^[^=]*") .. ": a value with a newline cannot be passed " ..
        "to the engine")
    end
  end
  return write_private(dir .. "/env", table.concat(root.env, "\n") .. "\n")
end

local function container_name(sb)
  seq = seq + 1
  local key = core.digest.sha256(sandbox.storage_path(sb)):sub(1, 12)
  return string.format("corral-%s-%d-%d", key, core.proc.getpid(), seq)
end

-- The argv (engine path first) running argv in sb: `run` of a new container, or `exec`
-- in the started one. Returns argv, the container's name, whether it joined.
local function command(sb, st, argv, opts, dir)
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  local root = tenant_root.plan(sb, st)
  local env, eerr = env_file(root, dir)
  if not env then return nil, eerr end
  local interactive = opts.stdout == nil and { "--interactive" } or {}
  if st.process and st.process:running() and st.name then
    local args = { "exec", "--user", root.uid .. ":" .. root.gid, "--workdir", root.cwd, "--env-file", env }
    table.move(interactive, 1, #interactive, #args + 1, args)
    args[#args + 1] = st.name
    table.move(argv, 1, #argv, #args + 1, args)
    return argv_of(eng, args), st.name, true
  end
  local img, ierr = M.image(root)
  if not img then return nil, ierr end
  local name = container_name(sb)
  -- The engine's client forwards no signal (--sig-proxy=false): corral delivers them
  -- itself (see `deliver`), since a client signalled before its proxy is up exits 0
  -- and leaves the container running.
  local args = { "run", "--rm", "--sig-proxy=false", "--name", name, "--env-file", env }
  table.move(interactive, 1, #interactive, #args + 1, args)
  local flags = root_flags(sb, st, root, eng)
  table.move(flags, 1, #flags, #args + 1, args)
  args[#args + 1] = img
  -- In corral's own image the command is exec'd by the tenant's /bin/sh, so one that
  -- cannot run exits 127 or 126 as under native (runc's own failure is status 1, or the
  -- engine's 125); sh replaces itself, the command stays the container's first process.
  -- An operator's image need not hold a shell: the command is its first process as given.
  if not M.config.image then table.move({ "/bin/sh", "-c", 'exec "$0" "$@"' }, 1, 3, #args + 1, args) end
  table.move(argv, 1, #argv, #args + 1, args)
  return argv_of(eng, args), name, false
end

-- The kernel's count of OOM kills since boot (/proc/vmstat oom_kill).
local function oom_kills()
  return tonumber((file.read("/proc/vmstat") or ""):match("\noom_kill (%d+)")) or 0
end

-- How much of the engine client's stderr a run keeps, for the error of a failed run.
local STDERR_KEPT = 8192

-- A function writing to the caller's stderr (a Lua file or a corral.fd; nil: ours), or
-- nil when it is a bare fd number corral does not write to.
local function stderr_writer(target)
  target = target or io.stderr
  if io.type(target) == "file" then
    return function(d)
      target:write(d)
      target:flush()
    end
  end
  local mt = getmetatable(target)
  if type(mt) == "table" and mt.__name == "corral.fd" then
    return function(d)
      while #d > 0 do
        local n = core.io.write(target, d)
        if not n then return end
        d = d:sub(n + 1)
      end
    end
  end
  return nil
end

-- The engine client's stderr through a pipe corral reads: forwarded to the caller's as it
-- comes, its last STDERR_KEPT bytes kept, so that a run the engine could not make (status
-- 125) returns the engine's own words. `on` reads what is there (false at its end).
local function stderr_feed(target)
  local write = stderr_writer(target)
  if not write then return nil end
  local rd, wr = core.io.pipe()
  if not rd then return nil end
  local feed = { fd = rd, wr = wr, kept = "" }
  function feed.on()
    for _ = 1, 16 do
      local d, _, errno = core.io.read(rd, 65536)
      if not d then return errno == core.errno.EAGAIN end
      if d == "" then return false end
      write(d)
      feed.kept = (feed.kept .. d):sub(-STDERR_KEPT)
    end
    return true
  end
  return feed
end

-- Starts the engine's client for argv in sb, in a private working directory. With
-- `capture`, its stderr comes through a feed (see `stderr_feed`; the caller serves it).
-- This process's mark (`owner-PID`), where each container name is added before its
-- client starts: a client outlives a SIGKILLed corral (a session of its own) and may
-- create its container after a sweep looked, so the sweep finds the name here.
local function mark_path(pid) return scratch_dir() .. "/owner-" .. (pid or core.proc.getpid()) end

local function note_container(name)
  local f = io.open(mark_path(), "a")
  if not f then return nil end
  f:write(name, "\n")
  f:close()
  return true
end

local function spawn(sb, st, argv, opts, capture)
  local dir, derr = private_dir()
  if not dir then return nil, errors.cannot_enforce("oci", "a private directory for the engine: " .. tostring(derr)) end
  local full, name, joined = command(sb, st, argv, opts, dir)
  local out
  if full and opts.output then
    out = io.open(opts.output, "w")
    if not out then name = errors.invalid_argument("output", "cannot open " .. opts.output) end
  end
  if not full or (opts.output and not out) then
    core.fs.remove_tree(dir)
    return nil, name
  end
  if not joined and swept and not note_container(name) then
    if out then out:close() end
    core.fs.remove_tree(dir)
    return nil, errors.cannot_enforce("oci", "cannot note the container's name in " .. mark_path())
  end
  local feed = capture and stderr_feed(out or opts.stderr)
  local oom0 = oom_kills()
  -- A session of its own: a terminal's Ctrl-C reaches corral alone, which delivers it.
  local proc, err = core.spawn.start({ plain = true, new_session = true, path = full[1], argv = full,
    env = ENGINE_ENV, cwd = dir, stdin = opts.stdin, stdout = out or opts.stdout,
    stderr = feed and feed.wr or out or opts.stderr })
  if feed then feed.wr:close() end
  if not proc then
    if feed then feed.fd:close() end
    if out then out:close() end
    core.fs.remove_tree(dir)
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(full) .. "` failed (cannot start: " ..
      tostring(err) .. ")")
  end
  return { proc = proc, name = name, dir = dir, joined = joined, argv = full, oom_kills = oom0, out = out,
    output = opts.output, feed = feed }
end

--- The engine's argv running argv in a new container of provisioned sandbox sb, as
-- `exec` spawns it when nothing was started (scripts/bench/launch times it bare beside
-- `corral run --mechanism oci`). Its env file is written into `dir`, the caller's.
-- @tparam table sb
-- @tparam {string,...} argv
-- @tparam string dir
-- @treturn[1] {string,...} the argv, the engine's path first
-- @return[2] nil
-- @treturn[2] table the error
function M.run_argv(sb, argv, dir)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  if st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is running: its commands join it")
  end
  local full, err = command(sb, st, argv, {}, dir)
  if not full then return nil, err end
  return full
end

--- Removes a container at once (SIGKILL to what runs in it: podman's `rm --force`
-- otherwise sends SIGTERM first, which a tenant's init ignores, and waits).
-- @tparam string name
-- @return as `call`
function M.remove(name)
  local eng = M.engine()
  if eng and eng.kind == "podman" then return M.call({ "rm", "--force", "--time", "0", name }) end
  return M.call({ "rm", "--force", name })
end

--- Seconds a run is given to end after a forwarded signal (Ctrl-C, SIGTERM) before it
-- is ended as at its wall. The engine hands the signal to the container's first
-- process, which is the command itself: as a pid namespace's init it ignores every
-- signal it has no handler for, so a plain `sleep` would otherwise outlive them all.
M.SIGNAL_GRACE = 3

--- Seconds an exec in a started container is given, after its wall, for its processes
-- to be found and killed before the whole container is removed instead.
M.EXEC_GRACE = 5

local function parent_of(pid)
  local stat = file.read("/proc/" .. pid .. "/stat")
  return stat and tonumber(stat:match("%) %a (%d+)"))
end

local function pid_ns(pid) return core.fs.readlink("/proc/" .. pid .. "/ns/pid") end

-- The host pids of what exec sessions run in the container whose first process is `init`:
-- each session's first process (in the container's pid namespace, its parent outside it,
-- where the engine's monitor is) and everything beneath it. The container's own first
-- process and its tree are left, as is what an exec left behind (reparented to it).
local function exec_processes(init, ns)
  local parent, children = {}, {}
  for _, name in ipairs(core.fs.listdir("/proc") or {}) do
    local pid = name:match("^%d+$") and tonumber(name)
    if pid and pid_ns(pid) == ns then
      local pp = parent_of(pid)
      if pp then
        parent[pid] = pp
        children[pp] = children[pp] or {}
        table.insert(children[pp], pid)
      end
    end
  end
  local out, queue = {}, {}
  for pid, pp in pairs(parent) do
    if pid ~= init and not parent[pp] then queue[#queue + 1] = pid end
  end
  while #queue > 0 do
    local pid = table.remove(queue)
    out[#out + 1] = pid
    for _, c in ipairs(children[pid] or {}) do queue[#queue + 1] = c end
  end
  return out
end

-- Stops the exec sessions' processes until no new one appears (a stopped process can
-- neither fork nor exit and have its pid reused), each checked in the container's pid
-- namespace once stopped, then kills them.
local function kill_exec_processes(init, ns)
  local stopped = {}
  for _ = 1, 50 do
    local grew = false
    for _, pid in ipairs(exec_processes(init, ns)) do
      if not stopped[pid] and core.proc.kill(pid, 19) then -- SIGSTOP
        if pid_ns(pid) == ns then
          stopped[pid], grew = true, true
        else
          core.proc.kill(pid, 18) -- SIGCONT: the pid was reused outside the container
        end
      end
    end
    if not grew then break end
  end
  for pid in pairs(stopped) do
    if pid_ns(pid) == ns then core.proc.kill(pid, 9) end
  end
end

-- Ends an exec in the started container at its wall: its sessions' processes are killed
-- until the engine's client returns (the session may still be starting). When they
-- cannot be found from here, or the client is still there after EXEC_GRACE, the
-- container is removed, its started command with it.
local function end_exec(run, deadline)
  local out = M.call({ "inspect", "--format", "{{.State.Pid}}", run.name })
  local init = tonumber(out and out:match("%d+"))
  local ns = init and init > 1 and pid_ns(init)
  local grace = math.min(deadline, core.clock.monotime() + M.EXEC_GRACE)
  while ns and run.proc:running() and core.clock.monotime() < grace do
    kill_exec_processes(init, ns)
    run.proc:wait(0.1)
  end
  if run.proc:running() then M.remove(run.name) end
end

-- Hands signal sig to a run's container, through the engine (`kill --signal`). False
-- while the engine refuses: until its client has started the container, the engine
-- holds it as created, not running, and the signal waits.
local function deliver(run, sig)
  local _, err = M.call({ "kill", "--signal", tostring(sig), run.name })
  return err == nil
end

-- Ends a run: at its wall (`kill`), its exec's processes, or its container, are killed;
-- then the client is waited for, its stderr forwarded to the end, and its private
-- directory removed. A container's removal is repeated until the engine's client has
-- exited: asked while the engine is still creating the container, `rm` finds nothing,
-- and the container then started (a wall of 0.5 s let a command run on past it).
local function finish(run, kill)
  local deadline = core.clock.monotime() + M.config.timeout
  if kill and run.joined then end_exec(run, deadline) end
  while kill and not run.joined and run.proc:running() and core.clock.monotime() < deadline do
    M.remove(run.name)
    run.proc:wait(0.5)
  end
  if kill and not run.joined then M.remove(run.name) end
  if run.proc:running() then run.proc:wait(math.max(0, deadline - core.clock.monotime())) end
  if run.proc:running() then
    run.proc:kill()
    run.proc:wait()
  end
  run.proc:close()
  if run.feed then
    run.feed.on()
    run.feed.fd:close()
  end
  if run.out then run.out:close() end
  core.fs.remove_tree(run.dir)
end

-- What the engine said on a failed run's stderr: the feed's last bytes, or the end of
-- the output file it wrote to.
local function engine_words(run)
  local text = run.feed and run.feed.kept
  if not text and run.output then
    if run.out then run.out:flush() end
    text = read_all(run.output):sub(-STDERR_KEPT)
  end
  text = (text or ""):gsub("^%s+", ""):gsub("%s+$", "")
  if text == "" then return "the engine wrote nothing on stderr corral could read" end
  return text
end

-- How a run ended: `limit = "memory"` when it was SIGKILLed under a memory cap while the
-- kernel's OOM killer fired. The engine's own report cannot be used: on podman 4.3 and
-- cgroup v1, `podman run --name x --memory 32m --memory-swap 32m --ulimit nofile=1024:1024
-- --ulimit nproc=1024:1024 --rootfs /:O sh -c 'tail /dev/zero'` exits 137 and `podman
-- inspect --format '{{.State.OOMKilled}}' x` says false; and the container's memory
-- cgroup, the only one counting the kill on v1, is gone with it.
local function classify(sb, run, code)
  local result = { code = code, how = "exited" }
  -- 125 is also a command's own status: with the client's stderr read, the engine's
  -- failure is the one it said an error about (podman's "Error: …", docker's too)
  if code == 125 and not (run.feed and not run.feed.kept:find("Error", 1, true)) then
    for tag, mark in pairs(image_ready) do
      if type(mark) == "string" then os.remove(mark) image_ready[tag] = nil end
    end
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(run.argv) .. "` failed (status 125: " ..
      engine_words(run) .. ")")
  end
  if code == 128 + 9 and sb.limits and sb.limits.memory and oom_kills() > run.oom_kills then
    result.limit = "memory"
  end
  return result
end

-- The live processes whose argv holds one of `names` as a word: the engine clients a
-- dead corral started, still creating their containers.
local function clients_of(names)
  local found = {}
  if not next(names) then return found end
  for _, entry in ipairs(core.fs.listdir("/proc") or {}) do
    if entry:match("^%d+$") then
      for word in (file.read("/proc/" .. entry .. "/cmdline") or ""):gmatch("[^%z]+") do
        if names[word] then found[#found + 1] = tonumber(entry) break end
      end
    end
  end
  return found
end

-- Ends a dead corral's engine clients first, so that no container appears after the
-- sweep looked: each is killed and waited for (up to 5 s).
local function end_clients(names)
  local pids = clients_of(names)
  for _, pid in ipairs(pids) do core.proc.kill(pid, 9) end
  local until_ = core.clock.monotime() + 5
  while #pids > 0 and core.clock.monotime() < until_ do
    local alive = {}
    for _, pid in ipairs(pids) do
      if core.fs.lstat("/proc/" .. pid) then alive[#alive + 1] = pid end
    end
    pids = alive
    if #pids > 0 then core.io.poll({}, 0.05) end
  end
end

--- Removes the containers of corral processes that are gone (SIGKILL leaves them no
-- chance to): when some process's mark (`owner-PID`) outlived it, the engine clients
-- it started are killed first (one still creating its container would otherwise add it
-- after the sweep looked), then every container labelled `corral.owner=PID` whose PID
-- has no process, and each container the mark names, are removed. A mark goes only
-- once its containers have, so one the engine could not remove is tried again by the
-- next sweep.
-- @treturn integer how many were removed
function M.sweep()
  local dir = scratch_dir()
  resources.sweep(dir, leftovers.pattern("call-"), core.fs.remove_tree)
  resources.sweep(dir, "^root%-(%d+)%.tar$", os.remove)
  local dead, named = {}, {}
  resources.sweep(dir, "^owner%-(%d+)$", function(path)
    dead[#dead + 1] = path
    for name in (file.read(path) or ""):gmatch("[^\n]+") do named[name] = path:match("(%d+)$") end
    return true
  end)
  if #dead == 0 then return 0 end
  end_clients(named)
  local out, err = M.call({ "ps", "--all", "--filter", "label=corral.owner", "--format",
    "{{.Names}} {{index .Labels \"corral.owner\"}}" })
  if err then return 0 end
  local removed, kept = 0, {}
  for name, pid in out:gmatch("(%S+) (%d+)\n") do
    if not core.fs.lstat("/proc/" .. pid) then
      named[name] = nil
      if M.remove(name) then removed = removed + 1 else kept[pid] = true end
    end
  end
  -- a name the engine does not list under the label: a client killed while creating it
  -- may have left it half-made; removing one that does not exist fails harmlessly
  for name in pairs(named) do
    if M.remove(name) then removed = removed + 1 end
  end
  for _, path in ipairs(dead) do
    if not kept[path:match("(%d+)$")] then os.remove(path) end
  end
  return removed
end

--- Creates the storage (owned by the sandbox's host id) and, for an allowlist or a
-- service_port, corral's egress plane (before any container exists).
function M.provision(sb)
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  if not swept then
    -- Each live corral process using oci has its mark; a dead one's means its
    -- containers may be left (the engine is asked only then).
    swept = true
    M.sweep()
    write_private(mark_path(), "")
  end
  if (sb.network or sb.service_port) and eng.kind ~= "podman" then
    return nil, errors.cannot_enforce("network_restriction", (sb.network and "an egress allowlist" or
      "a service_port") .. " under oci needs podman (--network ns:PATH joins corral's own netns); " .. eng.path ..
      " cannot join it, and corral does not put a sandbox on an engine network")
  end
  -- the engine's caps instead of corral's cgroup
  local view = {}
  for k, v in pairs(sb) do view[k] = v end
  view.limits = nil
  -- the engine binds the storage by its path: no idmapped mount (runc and podman here take
  -- no idmap option), so an operator-made storage is refused, saying so
  local st, err = resources.acquire(setmetatable(view, getmetatable(sb)), { mechanism = "oci" })
  if not st then return nil, err end
  state[sb.id] = st
  local ok, ierr = M.image(tenant_root.plan(sb, st))
  if not ok then
    M.destroy(sb)
    return nil, ierr
  end
  return true
end

--- Starts argv as the sandbox's long-running container.
function M.start(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  if st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is already running")
  end
  local run, err = spawn(sb, st, argv, opts or {})
  if not run then return nil, err end
  st.run, st.process, st.name, st.status = run, run.proc, run.name, "running"
  return true
end

--- Runs argv in the sandbox to completion (bounded by limits.wall), in the started
-- container when there is one.
-- @treturn table `{code =, how = "exited", limit = nil|"wall"|"memory"}`
function M.exec(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  opts = opts or {}
  local run, err = spawn(sb, st, argv, opts, true)
  if not run then return nil, err end
  local code, how, _, signalled = require("corral.egress.loop").wait(run.proc, { serve = st.plane ~= nil,
    wall = sb.limits and sb.limits.wall, signals = opts.signals, grace = M.SIGNAL_GRACE, feeds = { run.feed },
    deliver = not run.joined and function(sig) return deliver(run, sig) end or nil })
  if not code then
    finish(run, true)
    if signalled then return { code = 128 + signalled, how = "killed" } end
    return { code = 128 + 9, how = "killed", limit = "wall" }
  end
  local result, cerr = classify(sb, run, code)
  -- The client itself killed by a signal (SIGPIPE when the reader of its output went
  -- away: `corral run … | head -1`) left its container running: it goes too.
  finish(run, how == "killed")
  return result, cerr
end

--- Waits for the container started by `start`.
function M.wait(sb, timeout)
  local st = state[sb.id]
  if not (st and st.run) then return nil, errors.invalid_argument("sandbox", "not started") end
  local code, how = st.process:wait(timeout)
  if not code then return nil, how end
  local result, err = classify(sb, st.run, code)
  finish(st.run, false)
  st.run, st.process, st.name, st.status = nil, nil, nil, "stopped"
  return result, err
end

--- Stops the started container (removed at once: the engine kills what runs in it).
function M.stop(sb)
  local st = state[sb.id]
  if not st then return true end
  if st.run then
    finish(st.run, true)
    st.run, st.process, st.name = nil, nil, nil
  end
  st.status = "stopped"
  return true
end

--- Stops and removes everything the sandbox holds but its storage.
function M.destroy(sb)
  local st = state[sb.id]
  if not st then return true end
  M.stop(sb)
  local ok, err = resources.release(st)
  state[sb.id] = nil
  if next(state) == nil and swept then
    os.remove(mark_path())
    swept = false
  end
  if not ok then return nil, err end
  return true
end

--- "absent" | "provisioned" | "running" | "stopped"
function M.status(sb)
  local st = state[sb.id]
  if not st then return "absent" end
  if st.process and not st.process:running() then st.status = "stopped" end
  return st.status
end

--- Where the sandbox's service_port is reachable from the host: `true,
-- "127.0.0.1:PORT"` (corral's inbound relay; the kernel chose PORT), or `true, nil`.
function M.address(sb)
  return resources.address(state[sb.id])
end

--- Serves the egress loop for `seconds` while a started sandbox runs.
function M.serve(seconds)
  return require("corral.egress.loop").serve(seconds)
end

--- The names of the containers a provisioned sandbox holds (for leak checks).
function M.containers(sb)
  local st = state[sb.id]
  local out = {}
  if st and st.name then out[#out + 1] = st.name end
  return out
end

return M
