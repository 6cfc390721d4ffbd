--- The life cycle the built-in mechanisms share, around one spawn function of each
-- (`build`: native, bwrap); `share` is the part oci, which runs containers itself, shares too.
-- The contract every mechanism keeps, with what each callback returns and what the
-- host applies around it, is corral.mechanism's (its LDoc, `corral help mechanisms`,
-- docs/mechanisms.md).
--
-- What the host holds (corral.resources), how a run is waited for (corral.egress.loop.wait)
-- and how its end is classified (corral.limits.observe) are one for every mechanism.
-- @module corral.mechanism.lifecycle
local core = require "corral.core"
local errors = require "corral.errors"
local ledger = require "corral.mechanism.ledger"
local limits = require "corral.limits"
local proctree = require "corral.proctree"
local resources = require "corral.resources"

local M = {}

--- Seconds a command is given to end after the first forwarded signal (Ctrl-C, SIGTERM,
-- SIGHUP) before its whole sandbox is killed and the run ends with 128 + that signal:
-- a command that ignores the signal, or defers it, cannot hold `corral run` open.
-- The same as corral.mechanism.oci's and corral.mechanism.watch's.
M.SIGNAL_GRACE = 3

--- What a sandbox under a built-in mechanism requires, in the order the gate asks.
-- @tparam table sb
-- @tparam {string,...} needs the mechanism's own requirements
-- @treturn {string,...}
function M.required_capabilities(sb, needs)
  local req = { "filesystem_confinement", "privilege_separation", "network_restriction" }
  for _, c in ipairs(needs) do req[#req + 1] = c end
  if limits.wants_cgroup(sb) then req[#req + 1] = "resource_limits" end
  -- a disk of its own (corral.disk), which the probe establishes by filling one
  if sb.limits and sb.limits.disk then req[#req + 1] = "disk_quota" end
  if resources.needs_plane(sb) then req[#req + 1] = "nftables" end
  return req
end

--- Completes `mech` with the callbacks every built-in mechanism (oci's too) shares over
-- its state table: provision, status, address and serve.
-- @tparam table mech
-- @tparam table state sandbox id → what corral.resources.acquire returned (`process`,
--   `status` set by the mechanism's start)
-- @tparam[opt] table opts `storage`: corral.resources.acquire's opts; `prepare(sb)`: the
--   sandbox to acquire for, or nil and why, before anything is held; `ready(sb, st)`:
--   true, or nil and why (the sandbox is then destroyed), once it is held
-- @treturn table mech
function M.share(mech, state, opts)
  opts = opts or {}

  --- Creates the storage (owned by the sandbox's host id), the cgroup and the egress plane.
  function mech.provision(sb)
    if state[sb.id] then return nil, errors.invalid_argument("id", sb.id .. " is already provisioned") end
    local view = sb
    if opts.prepare then
      local err
      view, err = opts.prepare(sb)
      if not view then return nil, err end
    end
    local st, err = resources.acquire(view, setmetatable({ mechanism = mech.name }, { __index = opts.storage }))
    if not st then return nil, err end
    state[sb.id] = st
    if opts.ready then
      local ok, rerr = opts.ready(sb, st)
      if not ok then
        mech.destroy(sb)
        return nil, rerr
      end
    end
    return true
  end

  --- "absent" | "provisioned" | "running" | "stopped"
  function mech.status(sb)
    return ledger.status(state, sb)
  end

  --- Where the service_port is reachable from the host: `true, "127.0.0.1:PORT"`, or `true, nil`.
  function mech.address(sb)
    return resources.address(state[sb.id])
  end

  --- Serves the egress loop for `seconds` while a started sandbox runs.
  function mech.serve(seconds)
    return require("corral.egress.loop").serve(seconds)
  end

  return mech
end

--- SIGSTOP: its number on Linux (x86, arm, powerpc, riscv, s390).
M.SIGSTOP = 19

--- Kills what is beneath a process (SIGKILL), twice over to catch one forking meanwhile:
-- a command joined into a running sandbox is no pid 1, and its end would not end them.
-- The process itself is stopped first (SIGSTOP; its caller kills it): it starts nothing
-- more, and runs nothing once its children are gone (a shell's next line).
-- @param proc a corral.process
function M.kill_tree(proc)
  proc:kill(M.SIGSTOP)
  for _ = 1, 2 do
    for _, p in ipairs(proctree.descendants(proc:pid())) do core.proc.kill(p, 9) end
  end
end

--- Completes `mech` with the life cycle callbacks.
-- @tparam table mech the mechanism (name, capabilities, …)
-- @tparam function spawn `spawn(sb, st, argv, opts)` → process; or nil, error; or nil,
--   nil, result when the sandbox was built but the command could not run
-- @tparam[opt] table storage how it reaches the storage (corral.resources.acquire's opts)
-- @tparam[opt] function deliver `deliver(proc, sig)` → true once it has handed a forwarded
--   signal to the command the spawned process runs (false: not yet, asked again); by
--   default the signal goes to the spawned process itself
-- @tparam[opt] boolean joins whether `spawn` lands a command inside the sandbox's running
--   process when there is one (native): then `join` is offered
-- @treturn table mech
function M.build(mech, spawn, storage, deliver, joins)
  local state = {} -- id → {cgroup =, plane =, process =, status =}, handed to spawn
  M.share(mech, state, { storage = storage })

  local function spawn_with_output(sb, argv, opts)
    local st = state[sb.id]
    if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
    opts = opts or {}
    local out
    if opts.output then
      out = io.open(opts.output, "w")
      if not out then return nil, errors.invalid_argument("output", "cannot open " .. opts.output) end
      opts = setmetatable({ stdout = out, stderr = out }, { __index = opts })
    end
    st.spawned = true
    local proc, err, failed = spawn(sb, st, argv, opts)
    if out then out:close() end
    return proc, err, failed
  end

  local function classify(st, proc, code, how, timed_out)
    local result = limits.observe(st, { code = code, how = how, limit = timed_out and "wall" or nil })
    proc:close()
    return result
  end

  --- Starts argv as the sandbox's long-running process.
  function mech.start(sb, argv, opts)
    local st = state[sb.id]
    if st and st.process and st.process:running() then
      return nil, errors.invalid_argument("sandbox", sb.id .. " is already running")
    end
    local proc, err, failed = spawn_with_output(sb, argv, opts)
    if failed then return nil, errors.invalid_argument("argv", failed.error) end
    if not proc then return nil, err end
    st.process, st.status = proc, "running"
    return true
  end

  --- Runs argv in the sandbox to completion (bounded by limits.wall).
  -- @treturn table `{code =, how = "exited"|"killed", limit = nil|"wall"|"memory", usage =}`
  function mech.exec(sb, argv, opts)
    local proc, err, failed = spawn_with_output(sb, argv, opts)
    if failed then return failed end
    if not proc then return nil, err end
    local st = state[sb.id]
    local code, how, _, signalled = require("corral.egress.loop").wait(proc, { serve = st.plane ~= nil,
      wall = sb.limits and sb.limits.wall, signals = opts and opts.signals, grace = M.SIGNAL_GRACE,
      deliver = deliver and function(sig) return deliver(proc, sig) end or nil })
    local timed_out = false
    if not code then
      -- SIGKILL to its init (native: the pid namespace ends with it; bwrap: its
      -- --die-with-parent), and the cgroup emptied too unless a started process shares it;
      -- a command that joined a started process is no pid 1: its tree is killed with it
      if joins and st.process and st.process:running() then M.kill_tree(proc) end
      proc:kill()
      if st.cgroup and not (st.process and st.process:running()) then st.cgroup:kill() end
      code, how = proc:wait()
      -- the grace after a forwarded signal ran out: the run ends as that signal would
      -- have ended it, not as at its wall
      if signalled then
        code, how = 128 + signalled, "killed"
      else
        timed_out = true
      end
    end
    return classify(st, proc, code, how, timed_out)
  end

  --- Starts argv inside the running process `start` left (its namespaces, cgroup, root),
  -- without waiting: a session's exec (corral.session.exec), whose keeper watches it.
  -- Only a mechanism whose spawn joins a running sandbox (native) offers it.
  -- @treturn[1] userdata the process (corral.process)
  -- @return[2] nil
  -- @treturn[2] table the refusal; or nil, nil and `{code =, error =}` when argv could not run
  function mech.join(sb, argv, opts)
    if not joins then return nil, errors.invalid_argument("mechanism", "cannot join a running sandbox") end
    local st = state[sb.id]
    if not (st and st.process and st.process:running()) then
      return nil, errors.invalid_argument("sandbox", sb.id .. " has no running process to join")
    end
    return spawn_with_output(sb, argv, setmetatable({ joining = true }, { __index = opts }))
  end

  --- The running process `start` left (what `join` joins), or nil.
  function mech.process_of(sb)
    local st = state[sb.id]
    return st and st.process
  end

  --- Waits for the long-running process started by `start`.
  function mech.wait(sb, timeout)
    local st = state[sb.id]
    if not (st and st.process) then return nil, errors.invalid_argument("sandbox", "not started") end
    local code, how = st.process:wait(timeout)
    if not code then return nil, how end
    st.status = "stopped"
    local result = classify(st, st.process, code, how, false)
    st.process = nil
    return result
  end

  --- Stops the sandbox's processes (SIGKILL to its init or bubblewrap; the cgroup emptied).
  function mech.stop(sb)
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

  --- Removes everything the sandbox holds but its storage (data outlives it).
  function mech.destroy(sb)
    local st = state[sb.id]
    if not st then return true end
    mech.stop(sb)
    local ok, err = resources.release(st)
    state[sb.id] = nil
    if not ok then return nil, err end
    -- nothing ran in it (a signal before the command, a refusal at `ready`): what its
    -- provision made goes too, as when the provision itself is refused
    if not st.spawned then resources.remove_made(st) end
    return true
  end

  --- Where the host itself reads and writes a provisioned sandbox's storage: its
  -- directory, or its disk's filesystem (corral.resources.storage_view).
  function mech.storage_view(sb)
    return resources.storage_view(sb, state[sb.id])
  end

  --- The cgroup directories of a provisioned sandbox (for leak checks).
  function mech.cgroup_paths(sb)
    local st = state[sb.id]
    return st and st.cgroup and st.cgroup:paths() or {}
  end

  return mech
end

return M
