--- An example mechanism built on the core's primitives alone: core.spawn.start with its own
-- plan (new user, mount, pid, ipc, uts, cgroup and net namespaces; the runtime
-- read-only; the storage at /storage; the tenant seccomp filter), without corral's
-- shared life cycle, root plan or cgroups.
--
-- `corral run --mechanism scripts/examples/primitives.lua -- id`
--
-- What it constructs, honestly: filesystem_confinement, privilege_separation,
-- network_restriction (an empty network namespace) and rlimits (nofile, fsize, nproc
-- through the spawn). It builds no cgroup, so it does not list resource_limits, and the
-- gate refuses --memory, --pids and --cpu for it; nor an egress plane, so --allow and
-- --service-port are refused. It bounds each exec by limits.wall itself (corral run
-- also does, around any mechanism).
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local ledger = require "corral.mechanism.ledger"
local sandbox = require "corral.sandbox"

local M = { name = "primitives" }

local state = {} -- id → {lock =, process =, status =}

--- Kernel features the spawn builds on, asked of the host probe.
function M.required_capabilities() return { "user_namespaces", "seccomp" } end

--- What this mechanism builds itself.
function M.constructed_capabilities()
  return { "filesystem_confinement", "privilege_separation", "network_restriction", "rlimits" }
end

local RUNTIME = { "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc" }

local function plan(sb, argv, opts)
  local path = argv[1]
  if not path:find("/", 1, true) then path = core.path.resolve_executable(path, sb.env.PATH) end
  local binds = {}
  for _, dir in ipairs(RUNTIME) do binds[#binds + 1] = { src = dir, dest = dir, optional = true } end
  binds[#binds + 1] = { src = sandbox.storage_path(sb), dest = "/storage", rw = true }
  local id = sandbox.host_id(sb)
  local l = sb.limits or {}
  return {
    path = path, argv = argv, env = hardening.envp(sb.env), cwd = "/storage", hostname = sb.id,
    new_net = true, uid = id, gid = id, binds = binds, proc = true, dev = true, tmp_mib = 64,
    seccomp = true, rlimits = { nofile = l.nofile, fsize = l.fsize, nproc = sandbox.default_nproc(sb) },
    stdout = opts.stdout, stderr = opts.stderr,
  }
end

-- Spawns argv (opts.output: a host file for its stdout and stderr).
local function spawn(sb, argv, opts)
  opts = opts or {}
  local out
  if opts.output then
    out = io.open(opts.output, "w")
    if not out then return nil, errors.invalid_argument("output", "cannot open " .. opts.output) end
    opts = { stdout = out, stderr = out }
  end
  local proc, err, errno = core.spawn.start(plan(sb, argv, opts))
  local step = err and err:match("^spawn: (.-): ")
  if out then out:close() end
  if not proc and step == "exec" then
    local code = errno == core.errno.ENOENT and core.exit.NOTFOUND or core.exit.NOEXEC
    return nil, nil, { code = code, how = "exited", error = err }
  end
  if not proc then return nil, errors.cannot_enforce("filesystem_confinement", tostring(err)) end
  return proc
end

--- Creates the storage (owned by the sandbox's host id) and holds its lock.
function M.provision(sb)
  if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
  local ok, lock = sandbox.prepare_storage(sb)
  if not ok then return nil, lock end
  state[sb.id] = { lock = lock, status = "provisioned" }
  return true
end

--- Runs argv to completion, bounded by limits.wall.
function M.exec(sb, argv, opts)
  if not state[sb.id] then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  local proc, err, failed = spawn(sb, argv, opts)
  if failed then return failed end
  if not proc then return nil, err end
  local wall = sb.limits and sb.limits.wall
  local code, how = proc:wait(wall)
  local limit
  if not code then
    proc:kill()
    code, how = proc:wait()
    limit = "wall"
  end
  proc:close()
  return { code = code, how = how, limit = limit }
end

--- Starts argv as the sandbox's long-running process.
function M.start(sb, argv, opts)
  return ledger.start(state, sb, spawn, argv, opts)
end

--- Kills the running process (its init takes its whole pid namespace with it).
function M.stop(sb)
  return ledger.stop(state, sb, function(process) process:close() end)
end

--- Stops the sandbox and releases its storage lock (the storage itself stays).
function M.destroy(sb)
  ledger.release(state, sb, M.stop)
  return true
end

--- "absent" | "provisioned" | "running" | "stopped"
function M.status(sb) return ledger.status(state, sb) end

return M
