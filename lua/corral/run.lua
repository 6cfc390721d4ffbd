--- One command in a fresh sandbox, from start to end: what `corral run` does once its
-- arguments are parsed. A refusal names the argument in the caller's own words; a
-- temporary storage is made and removed; signals are forwarded and the terminal put back.
-- @module corral.run
local core = require "corral.core"
local errors = require "corral.errors"
local leftovers = require "corral.leftovers"
local steps = require "corral.run.steps"

local M = {}

--- The statuses corral's own outcomes exit with (any other is the command's own).
M.EXIT = { not_started = core.exit.START_REFUSED, memory = core.exit.MEMORY, wall = core.exit.WALL,
           invalid = core.exit.USAGE, teardown = core.exit.TEARDOWN }

--- The variables `corral run` keeps of its own environment (corral.run.steps).
M.KEEP_ENV = steps.KEEP_ENV

-- Ctrl-C, SIGTERM and SIGHUP: held in a signalfd from a run's first step to its last,
-- so that one arriving while storage is made or the sandbox provisioned is acted on
-- once that step returns (never a death that leaves them behind), and forwarded to the
-- sandbox while the command runs; unblocked when the run returns, since the caller may
-- live on (a script, the REPL). One still pending then was meant for a sandbox that is
-- gone: it is read off first, or unblocking would deliver it and this process would die
-- of it after the teardown, its command's status lost (a second SIGTERM sent while an
-- engine call of the teardown ran did so).
local FORWARDED = { "INT", "TERM", "HUP" }

local function hold_signals()
  return setmetatable({ fd = core.signal.fd(FORWARDED) }, { __close = function(self)
    if not self.fd then return end
    while core.signal.read(self.fd) do end
    self.fd:close()
    self.fd = nil
    core.signal.unblock(FORWARDED)
  end })
end

-- A held signal that has arrived, without waiting; nil when none has.
local function arrived(held)
  return held.fd and core.signal.read(held.fd) or nil
end

-- What the run says of the command's end, and the status it exits with.
local function outcome(result, xerr, argv, say)
  if not result then
    say(tostring(xerr))
    return (errors.is(xerr, "cannot_enforce") or errors.is(xerr, "resource")) and M.EXIT.not_started or
      M.EXIT.invalid
  end
  if result.error and (result.code == core.exit.NOTFOUND or result.code == core.exit.NOEXEC) then
    local cmd = tostring(argv[1])
    say(result.code == core.exit.NOTFOUND and not cmd:find("/", 1, true) and cmd .. ": command not found"
      or cmd .. ":" .. (tostring(result.error):match(":([^:]*)$") or " cannot be executed"))
  elseif result.error then
    say(result.error)
  end
  if result.limit == "memory" then
    say("the memory cap ended the sandbox")
    return M.EXIT.memory
  elseif result.limit == "wall" then
    say("the wall-clock limit ended the sandbox")
    return M.EXIT.wall
  end
  return result.code
end

-- ---- the run's owners: each releases what its steps acquired, when its scope ends ----

-- A value a later step acquires and the declaring scope releases: the run's control
-- registration outlives the teardown and the messages about the command's end.
local function slot()
  return setmetatable({}, { __close = function(self)
    if self.value then self.value:close() end
  end })
end

-- The terminals on fds 0-2, put back as they were when the command ends.
local function saved_terminal()
  local ttys = {}
  for fd = 0, 2 do ttys[fd] = core.tty.save(fd) end
  return setmetatable(ttys, { __close = function(self)
    for fd = 0, 2 do
      if self[fd] then core.tty.restore(fd, self[fd]) end
    end
  end })
end

-- ---- the steps --------------------------------------------------------------------------

-- The service port said, and the run registered: visible to this user's REPL while it
-- runs, gone when it ends (corral.control). Returns the registration.
local function announced(run, corral, plan, sb)
  local _, addr = corral.address(plan.mech, sb)
  if addr then run.say("service port " .. plan.args.service_port .. " on " .. addr) end
  return (require("corral.control").register(plan.mech, sb, { argv = run.req.argv }))
end

-- The held signals go to the sandbox, and this process stays to clean up (dying here
-- would leave the cgroup behind); a custom mechanism's exec runs in a watched child
-- (corral.mechanism.watch) bounded by --wall and these signals. `alongside` is the run's
-- own work that need not precede the spawn: done while the sandbox's init builds its root
-- where the mechanism offers that wait (`exec_meanwhile`: two cores overlap it), else
-- before the command starts; and once in any case (a spawn that failed early skips it).
local function run_command(corral, mech, sb, argv, held, alongside)
  local terminal <close> = saved_terminal() -- luacheck: ignore
  local result, xerr
  if not corral.mechanism.is_builtin(mech) then
    alongside()
    return require("corral.mechanism.watch").exec(mech, sb, argv, {}, held.fd)
  end
  if not mech.exec_meanwhile then
    alongside()
    return corral.exec(mech, sb, argv, { signals = held.fd })
  end
  local done, raised = false, nil
  local function meanwhile()
    done = true
    local ok, err = pcall(alongside)
    if not ok then raised = err end
  end
  result, xerr = corral.exec(mech, sb, argv, { signals = held.fd, meanwhile = meanwhile })
  if raised then error(raised, 0) end
  if not done then alongside() end
  return result, xerr
end

-- Every step from the environment to the command's end. Returns what ended the run once
-- the sandbox is destroyed and the storage and reports are released: `{signal =}` held
-- before the command started, or `{result =, xerr =}`, each with the `sandbox`
-- (`torn`, `why`); or nil and the refusal.
local function in_sandbox(run, held, registration)
  local corral = require "corral"
  local plan, err = steps.planned(run, corral)
  if not plan then return nil, err end
  local reports <close> = setmetatable({ run = run }, steps.Reports) -- closed after the storage
  -- the sweeps of what dead processes left wait for the spawn's set-up (`alongside`), or
  -- run when the run ends without one
  local sweeps <close> = leftovers.put_off()
  local storage <close>, serr = steps.storage_of(run, plan.args, true)
  if serr then return nil, serr end
  local sandbox <close>, perr = steps.provisioned(run, corral, plan, storage, reports)
  if not sandbox then return nil, perr end
  -- a signal held while the sandbox was provisioned: the command is not started
  local early = arrived(held)
  if early then return { signal = early, sandbox = sandbox } end
  reports:start_learning()
  if run.hooks.witness then run.hooks.witness.began(corral, plan.mech, sandbox.sb) end
  -- what the registration loads is loaded first: once the init is made, every page this
  -- process writes is copied from the init that shares it (~1 ms for these modules)
  require "corral.control_ops"
  require "corral.egress.loop"
  local function alongside()
    registration.value = announced(run, corral, plan, sandbox.sb)
    if storage.temp then steps.sweep_temp() end
    sweeps.run()
  end
  local result, xerr = run_command(corral, plan.mech, sandbox.sb, run.req.argv, held, alongside)
  reports.ran = result ~= nil
  return { result = result, xerr = xerr, sandbox = sandbox }
end

-- What the run says once everything is released, and the status it exits with.
local function status_of(run, ended)
  local sandbox, say = ended.sandbox, run.say
  if ended.signal then
    say("signal " .. ended.signal .. " arrived before the command started")
    if sandbox.torn then return 128 + ended.signal end
    say(sandbox.why)
    return M.EXIT.teardown
  end
  local status = outcome(ended.result, ended.xerr, run.req.argv, say)
  if sandbox.torn then return status end
  say(sandbox.why)
  say(string.format("exit %d, not %d: the sandbox was not torn down, something of it may be left behind",
    M.EXIT.teardown, status))
  return M.EXIT.teardown
end

--- Runs a command in a new sandbox and releases the sandbox afterwards. Before the
-- mechanism is loaded, this process's environment loses every credential-shaped
-- variable, and with `hooks.clear_environment` everything but `KEEP_ENV` and the `env`
-- names (corral.hardening.clear_own_environment); it stays so afterwards. SIGINT,
-- SIGTERM and SIGHUP are held for the run and forwarded to the sandbox (one that
-- arrives before the command starts ends the run with 128 + its number).
-- @tparam table req what to run:
--   `argv` (the command), `mechanism` (a built-in name, a .lua path or a table; default
--   native), `id`, `storage` (a directory path: the storage itself, kept afterwards;
--   without it a temporary one is made and removed), `workspace`, `limits` (`memory`,
--   `fsize`, `wall`, `disk` as corral.sandbox takes them, `pids`, `nofile`, `cpu` as numbers or
--   numeric strings), `env` (names of the caller's variables to pass), `network` (as
--   corral.sandbox takes it), `service_port`, `log_json` (a path for the decision log),
--   `verbose` (print each egress denial as it happens), `engine` (the oci mechanism's
--   engine: podman, docker or a path), `learn` (a file for the suggested allowlist).
-- @tparam[opt] table hooks how the caller presents: `say(line)` for each message to the
--   user (default: none), `names` the caller's name for each argument a refusal is about
--   (`"limits.memory"`, `"storage"`, `"id"`, `"workspace_path"`, `"env"`,
--   `"service_port"`, `"network"`, `"log_json"`; default: those keys themselves),
--   `clear_environment` true when this process is corral's own (`corral run`): its
--   environment is then left to what the run passes on; `witness` a receipt's
--   (corral.receipt.run.witness), told when the sandbox is provisioned and when the run ends.
-- @treturn[1] integer the exit status: the command's own, or one of `EXIT` (`teardown`
--   when the mechanism's destroy failed: said, by the mechanism's name)
-- @return[2] nil nothing ran
-- @treturn[2] table error (`invalid_argument`, `refused_env` or `cannot_enforce`)
function M.execute(req, hooks)
  local run = steps.context(req, hooks)
  local argv = req.argv
  if type(argv) ~= "table" or type(argv[1]) ~= "string" or argv[1] == "" then
    return run.invalid("argv", "the command to run is missing or empty")
  end
  local held <close> = hold_signals()
  local registration <close> = slot()
  local ended, err = in_sandbox(run, held, registration)
  if not ended then return nil, err end
  local status = status_of(run, ended)
  -- the receipt (corral.receipt.run) is sealed once everything is released
  if run.hooks.witness then return run.hooks.witness.finish(ended, status, run.say) end
  return status
end

return M
