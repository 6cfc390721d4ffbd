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
-- Network: `--network none`; with an egress allowlist the container joins corral's own
-- sandbox netns (`--network ns:PATH`, podman), made and programmed before the container
-- exists, so the same acceptor, DNS responder and ruleset apply. A service_port without an
-- allowlist is published by the engine on 127.0.0.1 at a host port it allocates (an
-- infrastructure container holds the network; every command joins it) and `address`
-- reads back what was allocated.
--
-- Constructed: resource_limits, filesystem_confinement, network_restriction. Stated
-- omissions (`M.OMITTED`, which the conformance suite reports):
--
-- * network_restriction with a published port: the engine's bridge network routes out,
--   so that sandbox can reach the internet; only one inbound port, on loopback, is open.
-- * disk_quota: measured here, `podman run --storage-opt size=10M IMAGE …` on the overlay
--   driver over ext4 exits 125 ("storage option overlay.size and overlay.inodes only
--   supported for backingFS XFS. Found extfs"); where it is accepted it bounds only the
--   container's own layer, which is read-only here, and /storage is a plain host directory.
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
local errors = require "corral.errors"
local shell = require "corral.shell"
local sandbox = require "corral.sandbox"
local resources = require "corral.resources"
local tenant_root = require "corral.tenant_root"
local image = require "corral.mechanism.oci.image"
local seccomp = require "corral.mechanism.oci.seccomp"

local M = { name = "oci" }

--- The capabilities oci does not construct, each with why.
M.OMITTED = {
  disk_quota = "not constructed: the engine's size option is refused on this host's overlay driver " ..
    "(measured), and /storage is a plain host directory",
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

local state = {} -- sandbox id → {storage_lock =, plane =, infra =, addr =, process =, name =, ...}
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
  local t = os.getenv("TMPDIR")
  scratch = assert(core.fs.mkdtemp(((t and t:sub(1, 1) == "/") and t or "/tmp") .. "/corral-oci-"))
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

local function read_all(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
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
  seq = seq + 1
  local out_path = string.format("%s/out-%d-%d", scratch_dir(), core.proc.getpid(), seq)
  local out, err_f = io.open(out_path, "w"), io.open(out_path .. ".err", "w")
  local devnull = io.open("/dev/null")
  local proc, serr = core.spawn.start({ plain = true, path = eng.path, argv = full, env = ENGINE_ENV,
    stdin = devnull, stdout = out, stderr = err_f })
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
  os.remove(out_path)
  os.remove(out_path .. ".err")
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
-- egress plane (corral programs it, as for native).
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  local req = { "filesystem_confinement" }
  if not (sb.service_port and not sb.network) then req[#req + 1] = "network_restriction" end
  if sb.limits and (sb.limits.memory or sb.limits.pids or sb.limits.cpu) then req[#req + 1] = "resource_limits" end
  if sb.network then req[#req + 1] = "nftables" end
  return req
end

--- What oci constructs for sb (network_restriction not for a sandbox with a published
-- port and no allowlist: see `reductions`).
-- @tparam[opt] table sb
-- @treturn {string,...}
function M.constructed_capabilities(sb)
  local c = { "resource_limits", "filesystem_confinement" }
  if not (sb and sb.service_port and not sb.network) then c[#c + 1] = "network_restriction" end
  -- the engine publishes a service port on 127.0.0.1 itself (no egress plane needed)
  if sb and sb.service_port then c[#c + 1] = "published_port" end
  return c
end

--- What a sandbox gives up under oci beyond `OMITTED`, as `{capability = why}`.
-- @tparam table sb
-- @treturn table
function M.reductions(sb)
  local r = {}
  for k, v in pairs(M.OMITTED) do r[k] = v end
  if sb.service_port and not sb.network then
    r.network_restriction = "not for this sandbox: its service_port is published through the engine's bridge " ..
      "network, which also routes out (the internet is reachable, no allowlist applies); inbound is one port on " ..
      "127.0.0.1"
  end
  return r
end

-- The engine flags that build sb's root (everything between `run` and the image).
local function root_flags(sb, st, root, eng)
  local a = {}
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  add("--label", "corral.sandbox=" .. sb.id, "--label", "corral.owner=" .. core.proc.getpid(),
      "--user", root.uid .. ":" .. root.gid, "--hostname", root.hostname, "--workdir", root.cwd,
      "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
      "--security-opt", "seccomp=" .. profile_path(),
      "--tmpfs", string.format("/tmp:rw,nosuid,nodev,size=%dm,mode=1777", root.tmp_mib))
  if eng.kind == "podman" then add("--read-only-tmpfs=false", "--pull", "never") end
  if not M.config.image then
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and (not m.optional or core.fs.lstat(m.src)) then
        add("--mount", string.format("type=bind,src=%s,dst=%s%s", m.src, m.dest, m.rw and "" or ",ro=true"))
      end
    end
  else
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and m.rw then add("--mount", string.format("type=bind,src=%s,dst=%s", m.src, m.dest)) end
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
  elseif st.infra then
    add("--network", "container:" .. st.infra)
  else
    add("--network", "none")
  end
  for _, v in ipairs(eng.conf.run or {}) do a[#a + 1] = v end
  return a
end

-- The environment as an env file, private to root (values on the engine's command line
-- would show in every host user's `ps`).
local function env_file(root)
  for _, kv in ipairs(root.env) do
    if kv:find("[\n\r]") then
      return nil, errors.invalid_argument("env", kv:match("^[^=]*") .. ": a value with a newline cannot be passed " ..
        "to the engine")
    end
  end
  seq = seq + 1
  return write_private(string.format("%s/env-%d-%d", scratch_dir(), core.proc.getpid(), seq),
    table.concat(root.env, "\n") .. "\n")
end

local function container_name(sb)
  seq = seq + 1
  local key = core.digest.sha256(sandbox.storage_path(sb)):sub(1, 12)
  return string.format("corral-%s-%d-%d", key, core.proc.getpid(), seq)
end

-- The argv (engine path first) running argv in sb: `run` of a new container, or `exec`
-- in the started one. Returns argv, the container's name, the env file.
local function command(sb, st, argv, opts)
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  local root = tenant_root.plan(sb, st)
  local env, eerr = env_file(root)
  if not env then return nil, eerr end
  local interactive = opts.stdout == nil and { "--interactive" } or {}
  if st.process and st.process:running() and st.name then
    local args = { "exec", "--user", root.uid .. ":" .. root.gid, "--workdir", root.cwd, "--env-file", env }
    table.move(interactive, 1, #interactive, #args + 1, args)
    args[#args + 1] = st.name
    table.move(argv, 1, #argv, #args + 1, args)
    return argv_of(eng, args), st.name, env, true
  end
  local img, ierr = M.image(root)
  if not img then
    os.remove(env)
    return nil, ierr
  end
  local name = container_name(sb)
  local args = { "run", "--rm", "--name", name, "--env-file", env }
  table.move(interactive, 1, #interactive, #args + 1, args)
  local flags = root_flags(sb, st, root, eng)
  table.move(flags, 1, #flags, #args + 1, args)
  args[#args + 1] = img
  table.move(argv, 1, #argv, #args + 1, args)
  return argv_of(eng, args), name, env, false
end

-- The kernel's count of OOM kills since boot (/proc/vmstat oom_kill).
local function oom_kills()
  local f = io.open("/proc/vmstat")
  local n = f and tonumber(f:read("a"):match("\noom_kill (%d+)")) or 0
  if f then f:close() end
  return n
end

local function spawn(sb, st, argv, opts)
  local full, name, env, joined = command(sb, st, argv, opts)
  if not full then return nil, name end
  local out
  if opts.output then
    out = io.open(opts.output, "w")
    if not out then
      os.remove(env)
      return nil, errors.invalid_argument("output", "cannot open " .. opts.output)
    end
  end
  local oom0 = oom_kills()
  local proc, err = core.spawn.start({ plain = true, path = full[1], argv = full, env = ENGINE_ENV,
    stdin = opts.stdin, stdout = out or opts.stdout, stderr = out or opts.stderr })
  if out then out:close() end
  if not proc then
    os.remove(env)
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(full) .. "` failed (cannot start: " ..
      tostring(err) .. ")")
  end
  return { proc = proc, name = name, env = env, joined = joined, argv = full, oom_kills = oom0 }
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

-- Removes a run's container (unless it joined the started one) and its env file.
-- A kill is repeated until the engine's client has exited: asked while the engine is
-- still creating the container, `rm` finds nothing, and the container then started
-- (a wall of 0.5 s let a command run on past it).
local function finish(run, kill)
  local deadline = core.clock.monotime() + M.config.timeout
  while kill and not run.joined and run.proc:running() and core.clock.monotime() < deadline do
    M.remove(run.name)
    run.proc:wait(0.5)
  end
  if kill and not run.joined then M.remove(run.name) end
  if run.proc:running() then run.proc:wait(math.max(0, deadline - core.clock.monotime())) end
  run.proc:close()
  os.remove(run.env)
end

-- How a run ended: `limit = "memory"` when it was SIGKILLed under a memory cap while the
-- kernel's OOM killer fired. The engine's own report cannot be used: measured here
-- (podman 4.3, cgroup v1), a container killed at its --memory cap shows
-- State.OOMKilled false, and its memory cgroup, the only one counting the kill on v1,
-- is gone with the container.
local function classify(sb, run, code)
  local result = { code = code, how = "exited" }
  if code == 125 then
    for tag, mark in pairs(image_ready) do
      if type(mark) == "string" then os.remove(mark) image_ready[tag] = nil end
    end
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(run.argv) .. "` failed (status 125: the " ..
      "engine's own error, on the run's stderr)")
  end
  if code == 128 + 9 and sb.limits and sb.limits.memory and oom_kills() > run.oom_kills then
    result.limit = "memory"
  end
  return result
end

-- The infrastructure container holding a published port's network: it only sleeps.
local function start_infra(sb, st)
  local eng = M.engine()
  local root = tenant_root.plan(sb, st)
  local img, err = M.image(root)
  if not img then return nil, err end
  local name = container_name(sb) .. "-net"
  local args = { "run", "--detach", "--rm", "--name", name }
  local flags = root_flags(sb, st, root, eng)
  flags[#flags] = "bridge" -- replaces none
  table.move(flags, 1, #flags, #args + 1, args)
  for _, v in ipairs({ "--publish", "127.0.0.1::" .. sb.service_port, img, "/bin/sleep", "2147483647" }) do
    args[#args + 1] = v
  end
  local _, rerr = M.call(args)
  if rerr then return nil, rerr end
  st.infra = name
  local out, perr = M.call({ "port", name, sb.service_port .. "/tcp" })
  if not out then return nil, perr end
  st.addr = out:match("(127%.0%.0%.1:%d+)")
  if not st.addr then
    return nil, errors.cannot_enforce("network_restriction", "the engine published no 127.0.0.1 port: " .. out)
  end
  return true
end

--- Removes the containers of corral processes that are gone (SIGKILL leaves them no
-- chance to): when some process's mark (`owner-PID`) outlived it, every container
-- labelled `corral.owner=PID` whose PID has no process.
-- @treturn integer how many were removed
function M.sweep()
  for _, pattern in ipairs({ "^env%-(%d+)%-%d+$", "^out%-(%d+)%-%d+$", "^out%-(%d+)%-%d+%.err$",
                             "^root%-(%d+)%.tar$" }) do
    resources.sweep(scratch_dir(), pattern, os.remove)
  end
  local dead = resources.sweep(scratch_dir(), "^owner%-(%d+)$", os.remove)
  if dead == 0 then return 0 end
  local out = M.call({ "ps", "--all", "--filter", "label=corral.owner", "--format",
    "{{.Names}} {{index .Labels \"corral.owner\"}}" })
  local removed = 0
  for name, pid in (out or ""):gmatch("(%S+) (%d+)\n") do
    if not core.fs.lstat("/proc/" .. pid) and M.remove(name) then removed = removed + 1 end
  end
  return removed
end

--- Creates the storage (owned by the sandbox's host id), corral's egress plane for an
-- allowlist (before any container exists), and for a service port without one the
-- engine's published port.
function M.provision(sb)
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  if not swept then
    -- Each live corral process using oci has its mark; a dead one's means its
    -- containers may be left (the engine is asked only then).
    swept = true
    M.sweep()
    write_private(scratch_dir() .. "/owner-" .. core.proc.getpid(), "")
  end
  if sb.network and eng.kind ~= "podman" then
    return nil, errors.cannot_enforce("network_restriction", "an egress allowlist under oci needs podman " ..
      "(--network ns:PATH); " .. eng.path .. " cannot join corral's netns")
  end
  -- corral's plane only with an allowlist; the engine's caps instead of corral's cgroup.
  local view = {}
  for k, v in pairs(sb) do view[k] = v end
  view.limits, view.service_port = nil, sb.network and sb.service_port or nil
  local st, err = resources.acquire(setmetatable(view, getmetatable(sb)))
  if not st then return nil, err end
  state[sb.id] = st
  local ok, ierr = M.image(tenant_root.plan(sb, st))
  if ok and sb.service_port and not sb.network then ok, ierr = start_infra(sb, st) end
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
  local run, err = spawn(sb, st, argv, opts)
  if not run then return nil, err end
  local code = require("corral.egress.loop").wait(run.proc, { serve = st.plane ~= nil,
    wall = sb.limits and sb.limits.wall, signals = opts.signals })
  if not code then
    finish(run, true)
    return { code = 128 + 9, how = "killed", limit = "wall" }
  end
  local result, cerr = classify(sb, run, code)
  finish(run, false)
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
  local ok, err = true, nil
  if st.infra then
    ok, err = M.remove(st.infra)
    st.infra, st.addr = nil, nil
  end
  resources.release(st)
  state[sb.id] = nil
  if next(state) == nil and swept then
    os.remove(scratch_dir() .. "/owner-" .. core.proc.getpid())
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
-- "127.0.0.1:PORT"` (the engine, or corral's plane with an allowlist, chose PORT), or
-- `true, nil`.
function M.address(sb)
  local st = state[sb.id]
  if st and st.addr then return true, st.addr end
  return resources.address(st)
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
  if st and st.infra then out[#out + 1] = st.infra end
  return out
end

return M
