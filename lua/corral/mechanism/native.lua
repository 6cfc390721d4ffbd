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

local M = { name = "native" }

local state = {} -- id → {cgroup =, process =, status =}

M.TMP_MIB = 64

local limits = require "corral.limits"
local resources = require "corral.resources"
local has_resource_limits = limits.wants_cgroup

--- What a sandbox under this mechanism needs: the tenant profile's guarantees, plus the
-- kernel features native builds them from.
-- @tparam table sb
-- @treturn {string,...}
local needs_plane = resources.needs_plane

function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction",
                "user_namespaces", "seccomp" }
  if has_resource_limits(sb) then req[#req + 1] = "resource_limits" end
  if needs_plane(sb) then req[#req + 1] = "nftables" end
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
  for _, p in ipairs(core.confine_runtime_paths()) do
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
  local st = state[sb.id]
  local binds, links = {}, {}
  runtime_binds(binds, links)
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
    rlimits = { core = 0, nofile = lim.nofile, fsize = lim.fsize },
    cgroup_procs = {},
    stdin = opts.stdin, stdout = opts.stdout, stderr = opts.stderr,
  }
  plan.cgroup_procs = resources.cgroup_procs(st)
  return plan
end

--- Creates the storage directory (owned by the sandbox's host id), the cgroup and, with
-- an allowlist or a service port, the egress plane.
function M.provision(sb)
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local st, err = resources.acquire(sb)
  if not st then return nil, err end
  state[sb.id] = st
  return true
end

local function spawn(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  opts = opts or {}
  local out
  if opts.output then
    -- opts.output: a host path that receives the tenant's stdout and stderr.
    out = io.open(opts.output, "w")
    if not out then return nil, errors.invalid_argument("output", "cannot open " .. opts.output) end
    opts = setmetatable({ stdout = out, stderr = out }, { __index = opts })
  end
  local plan = M.plan(sb, argv, opts)
  -- With a running sandbox (`start`), a command runs inside it: same pid namespace,
  -- same /tmp, same network, same cgroup.
  if st.process and st.process:running() then plan.join = st.process end
  local proc, err, errno, step = core.spawn(plan)
  if out then out:close() end
  if not proc and step == "exec" then
    -- The sandbox was built and the command itself could not run: the tenant's failure,
    -- reported as a shell does (127 not found, 126 not executable), not corral's.
    return nil, nil, { code = errno == core.errno.ENOENT and 127 or 126, how = "exited", error = err }
  end
  if not proc then return nil, errors.cannot_enforce("filesystem_confinement", err) end
  return proc
end

local function classify(sb, proc, code, how, timed_out)
  local st = state[sb.id]
  local result = limits.observe(st, { code = code, how = how, limit = timed_out and "wall" or nil })
  proc:close()
  return result
end

--- Starts argv as the sandbox's long-running process.
function M.start(sb, argv, opts)
  local st = state[sb.id]
  if st and st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is already running")
  end
  local proc, err, failed = spawn(sb, argv, opts)
  if failed then return nil, errors.invalid_argument("argv", failed.error) end
  if not proc then return nil, err end
  st.process, st.status = proc, "running"
  return true
end

--- Runs argv in the sandbox to completion (bounded by limits.wall).
-- @treturn table `{code =, how = "exited"|"killed", limit = nil|"wall"|"memory", usage =}`
function M.exec(sb, argv, opts)
  local proc, err, failed = spawn(sb, argv, opts)
  if failed then return failed end
  if not proc then return nil, err end
  local wall = sb.limits and sb.limits.wall
  local st = state[sb.id]
  local code, how = require("corral.egress.loop").wait(proc, { serve = st.plane ~= nil, wall = wall,
    signals = opts and opts.signals })
  local timed_out = false
  if not code then
    timed_out = true
    proc:kill()
    code, how = proc:wait()
  end
  return classify(sb, proc, code, how, timed_out)
end

--- Serves the egress loop for up to `seconds` (for hosts that run a sandbox started
-- with `start` and want its connections relayed while they wait).
function M.serve(seconds)
  local loop = require "corral.egress.loop"
  local deadline = core.monotime() + (seconds or 0)
  repeat loop.step(math.max(0, math.min(1, deadline - core.monotime()))) until core.monotime() >= deadline
end

--- Where the sandbox's service_port is reachable from the host: `true, "127.0.0.1:PORT"`
-- (the kernel chose PORT), or `true, nil`.
function M.address(sb)
  return resources.address(state[sb.id])
end

--- Waits for the long-running process started by `start`.
function M.wait(sb, timeout)
  local st = state[sb.id]
  if not (st and st.process) then return nil, errors.invalid_argument("sandbox", "not started") end
  local code, how = st.process:wait(timeout)
  if not code then return nil, how end
  st.status = "stopped"
  local result = classify(sb, st.process, code, how, false)
  st.process = nil
  return result
end

--- Stops the sandbox's processes: its init gets SIGKILL, which ends the pid namespace.
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

--- Stops and removes everything the sandbox holds but its storage (data outlives it).
function M.destroy(sb)
  local st = state[sb.id]
  if not st then return true end
  M.stop(sb)
  local ok, err = resources.release(st)
  state[sb.id] = nil
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

--- The cgroup directories of a provisioned sandbox (for leak checks).
function M.cgroup_paths(sb)
  local st = state[sb.id]
  return st and st.cgroup and st.cgroup:paths() or {}
end

return M
