--- The keeper of one live sandbox: the process `corral create ID` leaves behind (as
-- conmon keeps a container), which holds the sandbox `corral run`'s steps provision
-- (corral.run.steps) with a waiting init in it, and serves `session-ID.sock` on its
-- egress loop: every op a run's control socket answers (corral.control_ops), `exec`
-- (corral.session.exec) and `rm`, until `rm` or SIGTERM, SIGINT or SIGHUP.
--
-- Whatever ends the keeper, its scopes release what the steps acquired (socket first,
-- then the execs, the sandbox, the temporary storage, the reports). A SIGKILL cannot be
-- caught: the sandbox's init dies with the keeper (its parent-death signal), taking the
-- sandbox's pid namespace and every exec with it, and what stays on disk (the socket,
-- the cgroup, the temporary storage, the name files) is swept by the next corral call
-- (corral.session.sweep).
-- @module corral.session.keeper
local core = require "corral.core"
local json = require "corral.json"
local steps = require "corral.run.steps"

local M = {}

--- The waiting init every exec joins: a process that never ends on its own.
M.INIT = { "sleep", "infinity" }

local TERMINATING = { "INT", "TERM", "HUP" }

local function loop() return require "corral.egress.loop" end

-- The running execs, each killed (its tree) when the keeper's scope ends.
local function exec_set()
  return setmetatable({}, { __close = function(self)
    for ex in pairs(self) do ex:kill() end
  end })
end

-- Seconds a helper-built sandbox (bwrap) is given to be ready to join.
M.READY_TIMEOUT = 5

-- The sandbox's waiting init, started by the mechanism; with a helper that builds the
-- sandbox itself (bwrap: `root_pid`), ready once that sandbox is built.
-- `view` is corral.session.joins' view of mech.
local function start_init(corral, mech, view, sb)
  local ok, err = corral.start(mech, sb, M.INIT)
  if not ok then return nil, err end
  if not view.root_pid then return true end
  local timeout = view.ready_timeout or M.READY_TIMEOUT
  local deadline = core.clock.monotime() + timeout
  while not view.root_pid(sb) do
    if core.clock.monotime() > deadline or not view.process_of(sb):running() then
      return nil, require("corral.errors").cannot_enforce(mech.name, "its sandbox did not start within " ..
        timeout .. " s")
    end
    core.io.poll({}, 0.005)
  end
  return true
end

-- The ops of the session: a run's, `info` saying the session's id, `exec` and `rm`.
local function session_ops(session, corral, mech, sb)
  local control_ops = require "corral.control_ops"
  local ops = control_ops.for_run(mech, sb, { argv = M.INIT })
  local info = ops.info
  function ops.info(req)
    local i = info(req)
    i.session, i.command = session.id, nil
    return i
  end
  ops.exec = require("corral.session.exec").op(session)
  function ops.rm(_, conn)
    session.rm = conn.take()
    session.done = true
  end
  session.corral = corral
  return ops
end

--- The ops a session's socket answers (`session`: `id`, `mech`, `sb`, `execs`, `init`),
-- named so that the fuzz target tests/fuzz/lua/session.lua answers what a client sends
-- without a sandbox.
M.ops = session_ops

-- Serves until rm or a terminating signal; returns the rm connection, if any.
local function serve(session, held)
  while not session.done do
    local hit = loop().step(1, { held })
    if hit[1] and core.signal.read(held) then session.done = true end
    if session.init and not session.init:running() then session.done = true end
  end
  return session.rm
end

-- Every step from the storage to the served socket; returns the rm connection once
-- everything is released, or nil and the refusal (reported to `corral create` by
-- `ready`, before anything is served).
local function keep(run, corral, plan, id, path, ready)
  local held <close> = core.signal.fd(TERMINATING)
  local reports <close> = setmetatable({ run = run }, steps.Reports)
  local storage <close>, serr = steps.storage_of(run, plan.args)
  if serr then return nil, serr end
  local sandbox <close>, perr = steps.provisioned(run, corral, plan, storage, reports)
  if not sandbox then return nil, perr end
  reports:start_learning()
  local execs <close> = exec_set()
  local mech, with_init = require("corral.session.joins").view(plan.mech)
  if with_init then
    local ok, err = start_init(corral, plan.mech, mech, sandbox.sb)
    if not ok then return nil, run.renamed(err) end
  end
  local session = { id = id, mech = mech, sb = sandbox.sb, execs = execs,
    init = with_init and mech.process_of(sandbox.sb) or nil }
  local server <close>, lerr, lerrno = require("corral.control").serve(session_ops(session, corral, plan.mech,
    sandbox.sb), { path = path, fds_max = 3 })
  if not server then
    local errors = require "corral.errors"
    -- another create of the same ID bound it first: that ID is live, as create's own check says
    if lerrno == core.errno.EADDRINUSE then
      return nil, errors.invalid_argument("ID", id .. " is live already (corral rm " .. id .. ")")
    end
    return nil, errors.cannot_enforce("control_socket", path .. ": " .. tostring(lerr))
  end
  local _, service = corral.address(plan.mech, sandbox.sb)
  if not ready({ ok = true, result = { id = id, pid = core.proc.getpid(), service = service } }) then
    return nil, "corral create went away before its sandbox was ready"
  end
  reports.ran = true
  return serve(session, held)
end

--- Runs a keeper in this (detached) process: provisions the sandbox, says whether it is
-- ready on `ready_fd` (one JSON line: `{"ok":true,...}` or `{"ok":false,"error":,"code":}`),
-- serves it, and releases it. Returns once everything is released; the caller exits.
-- @tparam table run corral.run.steps' context (its request's arguments checked)
-- @tparam table plan corral.run.steps.planned's
-- @tparam string id the session's id
-- @tparam string path its socket
-- @param ready_fd the pipe `corral create` reads
function M.run(run, plan, id, path, ready_fd)
  local told = false
  -- false when `corral create` is no longer there to read it (killed or interrupted
  -- before the sandbox was ready): nobody knows of this sandbox, which then winds down
  local function ready(t)
    if told then return true end
    told = true
    local written = core.io.write(ready_fd, json.encode(t) .. "\n")
    ready_fd:close()
    return written ~= nil
  end
  -- An exec is born in the sandbox's pid namespace sharing this process's memory
  -- (core.spawn's join), its command line this one's until its exec: `corral create`'s
  -- arguments (host paths, the allowlist) are no business of the sandbox's.
  core.proc.set_title("corral-keeper " .. id)
  local corral = require "corral"
  -- Without root each exec forks this process (core.spawn), which leaves every page of
  -- it copy-on-write: a collector that marks the whole heap on each cycle then pays a page
  -- fault per page it writes. Generational collection walks only the young objects; a
  -- major collection once the heap has grown by half (not doubled, Lua's default) keeps
  -- what a thousand execs leave behind them to a few hundred kB.
  collectgarbage("generational", 20, 50)
  local ok, rm, err = pcall(keep, run, corral, plan, id, path, ready)
  if not ok then rm, err = nil, "keeper failed: " .. tostring(rm) end
  if not told then
    ready({ ok = false, error = tostring(err), code = type(err) == "table" and err.code or nil })
  end
  if rm then
    core.unix.sendmsg(rm.fd, json.encode({ ok = true, result = { removed = id } }) .. "\n")
    rm.fd:close()
  end
end

return M
