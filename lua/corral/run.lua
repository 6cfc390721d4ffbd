--- One command in a fresh sandbox, from start to end: what `corral run` does once its
-- arguments are parsed. A refusal names the argument in the caller's own words; a
-- temporary storage is made and removed; signals are forwarded and the terminal put back.
-- @module corral.run
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local leftovers = require "corral.leftovers"
local run_request = require "corral.run_request"

local M = {}

--- The statuses corral's own outcomes exit with (any other is the command's own).
M.EXIT = { not_started = core.exit.START_REFUSED, memory = core.exit.MEMORY, wall = core.exit.WALL,
           invalid = core.exit.USAGE, teardown = core.exit.TEARDOWN }

local TEMP_DIR = "/tmp"
local TEMP_PREFIX = "corral-run-"

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

--- The variables `corral run` keeps of its own environment (corral.hardening
-- .clear_own_environment): the tenant's base names and TMPDIR, where corral itself
-- makes its scratch files; the run's `--env` names are kept too.
M.KEEP_ENV = { "PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR" }

-- What the run says of the command's end, and the status it exits with.
local function outcome(result, xerr, argv, say)
  if not result then
    say(tostring(xerr))
    return errors.is(xerr, "cannot_enforce") and M.EXIT.not_started or M.EXIT.invalid
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

-- The caller's presentation shared by every step: `say`, and refusals in its words.
local function context(req, hooks)
  hooks = hooks or {}
  local names = hooks.names or {}
  local run = { req = req, hooks = hooks, say = hooks.say or function() end }
  function run.name(key) return names[key] or key end
  function run.invalid(key, detail) return nil, errors.invalid_argument(run.name(key), detail) end
  -- The error in the caller's words: its argument renamed, and a detail that names the
  -- argument (the gate's: "so limits.memory cannot be honoured") rebuilt from its
  -- detail_format; never a substitution inside the detail, which quotes the user's value.
  function run.renamed(err)
    if type(err) ~= "table" or not err.argument then return err end
    local key = err.argument
    if key == "id" or key == "storage" or key == "storage_root" then key = req.storage and "storage" or "id" end
    if not names[key] then return err end
    local detail = err.detail_format and string.format(err.detail_format, names[key]) or err.detail
    return errors.new(err.code, { argument = names[key], capability = err.capability, detail = detail,
                                  errno = err.errno })
  end
  return run
end

-- A value a later step acquires and the declaring scope releases: the run's control
-- registration outlives the teardown and the messages about the command's end.
local function slot()
  return setmetatable({}, { __close = function(self)
    if self.value then self.value:close() end
  end })
end

-- The storage: the caller's directory (root, id), or a temporary one made here and
-- removed when the run ends, before its reports are closed.
local Storage = {}
Storage.__index = Storage

function Storage:new_temp()
  local made, terr = leftovers.make(TEMP_DIR, TEMP_PREFIX)
  if not made then
    -- a full or read-only /tmp (inside `corral confine`) is the host's, not the arguments'
    return nil, errors.cannot_enforce("filesystem_confinement", "cannot make a temporary storage in " ..
      TEMP_DIR .. " (" .. tostring(terr) .. "); give " .. self.run.name("storage") .. " DIR")
  end
  self.temp = made
  core.fs.chmod(self.temp, tonumber("711", 8))
  self.root, self.id = self.temp, self.run.req.id or "tenant"
  return true
end

function Storage:remove_temp()
  if not self.temp then return end
  local ok, rerr = core.fs.remove_tree(self.temp)
  if not ok then self.run.say("warning: temporary storage " .. self.temp .. " not removed: " .. tostring(rerr)) end
end
Storage.__close = Storage.remove_temp

-- The temporary storage comes after every argument is checked, so an invalid value
-- leaves nothing behind.
local function storage_of(run, args)
  local storage = setmetatable({ run = run, root = args.root, id = args.id }, Storage)
  if not run.req.storage then
    leftovers.sweep_own(TEMP_DIR, TEMP_PREFIX)
    local made, terr = storage:new_temp()
    if not made then return storage, terr end
  end
  return storage
end

-- What the run reports besides its status: the --log-json file, the egress summary and
-- the --learn file, each opened by its step; closed in the order summary, --learn (written
-- only when the command ran: `ran`), log.
local Reports = {}
Reports.__index = Reports

function Reports:open_log_and_summary()
  local req = self.run.req
  if req.log_json then
    local events = require "corral.egress.events"
    local writer, closer = events.json_lines_writer(req.log_json)
    if not writer then return self.run.invalid("log_json", tostring(closer)) end
    local log = events.subscribe(writer)
    self.log_close = function()
      events.unsubscribe(log)
      closer()
    end
  end
  self.summary = req.network and require("corral.egress.summary").start({ verbose = req.verbose })
  return true
end

function Reports:start_learning()
  local req = self.run.req
  self.learner = req.learn and require("corral.egress.learn").start(req.learn)
end

function Reports:__close()
  if self.summary then self.summary.finish() end
  if self.learner and self.ran then
    local ok, n = self.learner.finish()
    self.run.say("--learn: " .. (ok and (n .. " entries written to " .. self.run.req.learn)
      or ("not written: " .. tostring(n))))
  elseif self.learner then
    self.learner.cancel()
  end
  if self.log_close then self.log_close() end
end

-- The provisioned sandbox, destroyed first when the run ends. A destroy that fails is
-- reported by the mechanism's name (`torn` false, `why`), and the run exits
-- EXIT.teardown whatever the command did: something of the sandbox may be left behind.
local Provisioned = {}

function Provisioned:__close()
  local dok, derr = self.corral.destroy(self.mech, self.sb)
  if dok then
    self.torn = true
    return
  end
  local label, text = self.corral.mechanism.label(self.mech), tostring(derr)
  if not text:find("mechanism " .. label, 1, true) then
    text = "mechanism " .. label .. ": destroy failed: " .. text
  end
  self.torn, self.why = false, text
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

-- The tenant's variables are taken first; then this process's environment is left to
-- what the run passes on (corral's own process), or stripped of credentials (a
-- caller's), its original block overwritten, before any mechanism is loaded: nothing
-- it runs (os.execute, /proc/<pid>/environ) finds anything else.
local function take_environment(run)
  local env, keep = {}, table.move(M.KEEP_ENV, 1, #M.KEEP_ENV, 1, {})
  local host_env = core.proc.environ()
  for _, var in ipairs(run.req.env or {}) do
    if host_env[var] == nil then return run.invalid("env", var .. " is not set in this environment") end
    env[var] = host_env[var]
    keep[#keep + 1] = var
  end
  -- each reads what it needs of the environment as it loads: XDG_RUNTIME_DIR (where runs
  -- register), and what the probes' results depend on (TMPDIR, PATH); and where the
  -- host key is, which no storage or workspace may hold (CORRAL_STATE_DIR, HOME)
  require "corral.control"
  require "corral.probe_cache"
  require("corral.state_dir").dir()
  local cleared, cerr = hardening.clear_own_environment(run.hooks.clear_environment and keep or nil)
  if not cleared then
    return nil, errors.cannot_enforce("environment_filter", "corral's own environment could not be cleared " ..
      "before the mechanism is loaded: " .. tostring(cerr))
  end
  return env
end

local function load_mechanism(run, corral)
  local req = run.req
  local mech, merr = corral.mechanism.load(req.mechanism or "native")
  if not mech then return nil, run.renamed(merr) end
  if req.engine then
    if type(mech.engine) ~= "function" then return run.invalid("engine", "only the oci mechanism drives an engine") end
    local _, why = mech.engine(req.engine)
    if why then return run.invalid("engine", why) end
    mech.config.engine = req.engine
  end
  return mech
end

local function warn_if_unconfined(run, corral, mech, sb)
  if not corral.mechanism.is_builtin(mech) and corral.mechanism.claims_nothing(mech, sb) then
    run.say(string.format("warning: mechanism %s claims none of %s: the command runs as the caller (uid %d), " ..
      "on the host", corral.mechanism.label(mech), table.concat(corral.mechanism.ISOLATION, ", "),
      core.proc.geteuid()))
  end
end

local function fit_connections(run)
  local asked = type(run.req.network) == "table" and run.req.network.max_connections
  if asked then
    -- the plane has raised this process's RLIMIT_NOFILE as far as it goes (corral.egress.fdlimit)
    local cap, why = require("corral.egress.fdlimit").fit(asked)
    if why then
      run.say(string.format("%s %d lowered to %d: %s", run.name("network.max_connections"), asked, cap, why))
    end
  end
end

-- What the run is made of before anything is made: the tenant's environment, the
-- mechanism, the checked arguments, and `describe(storage)`, the sandbox on a storage.
local function planned(run, corral)
  local req = run.req
  local env, err = take_environment(run)
  if not env then return nil, err end
  local mech, args
  mech, err = load_mechanism(run, corral)
  if not mech then return nil, err end
  args, err = run_request.arguments(run)
  if not args then return nil, err end
  local function describe(storage)
    return corral.sandbox({ id = storage.id, storage_root = storage.root, workspace_path = req.workspace,
      env = env, limits = args.limits, network = req.network, service_port = args.service_port })
  end
  return { mech = mech, args = args, describe = describe }
end

-- Provisions the sandbox. A temporary storage whose host id another process holds is
-- made again: a fresh directory gives another id.
local function provision(run, corral, plan, sb, storage)
  local mech = plan.mech
  warn_if_unconfined(run, corral, mech, sb)
  local ok, perr = corral.provision(mech, sb)
  for _ = 1, 3 do
    if ok or not (storage.temp and type(perr) == "table" and perr.held_by) then break end
    storage:remove_temp()
    storage.temp = nil
    local made, terr = storage:new_temp()
    if not made then return nil, terr end
    local err
    sb, err = plan.describe(storage)
    if not sb then return nil, run.renamed(err) end
    ok, perr = corral.provision(mech, sb)
  end
  if not ok then return nil, run.renamed(perr) end
  fit_connections(run)
  return setmetatable({ corral = corral, mech = mech, sb = sb }, Provisioned)
end

-- The service port said, and the run registered: visible to this user's REPL while it
-- runs, gone when it ends (corral.control). Returns the registration.
local function announced(run, corral, plan, sb)
  local _, addr = corral.address(plan.mech, sb)
  if addr then run.say("service port " .. plan.args.service_port .. " on " .. addr) end
  return (require("corral.control").register(plan.mech, sb, { argv = run.req.argv }))
end

-- The held signals go to the sandbox, and this process stays to clean up (dying here
-- would leave the cgroup behind); a custom mechanism's exec runs in a watched child
-- (corral.mechanism.watch) bounded by --wall and these signals.
local function run_command(corral, mech, sb, argv, held)
  local terminal <close> = saved_terminal() -- luacheck: ignore
  local result, xerr
  if corral.mechanism.is_builtin(mech) then
    result, xerr = corral.exec(mech, sb, argv, { signals = held.fd })
  else
    result, xerr = require("corral.mechanism.watch").exec(mech, sb, argv, {}, held.fd)
  end
  return result, xerr
end

-- Every step from the environment to the command's end. Returns what ended the run once
-- the sandbox is destroyed and the storage and reports are released: `{signal =}` held
-- before the command started, or `{result =, xerr =}`, each with the `sandbox`
-- (`torn`, `why`); or nil and the refusal.
local function in_sandbox(run, held, registration)
  local corral = require "corral"
  local plan, err = planned(run, corral)
  if not plan then return nil, err end
  local reports <close> = setmetatable({ run = run }, Reports) -- closed after the storage
  local storage <close>, serr = storage_of(run, plan.args)
  if serr then return nil, serr end
  local sb, ok
  sb, err = plan.describe(storage)
  if not sb then return nil, run.renamed(err) end
  ok, err = run_request.host_files(run, sb)
  if not ok then return nil, err end
  ok, err = reports:open_log_and_summary()
  if not ok then return nil, err end
  local sandbox <close>, perr = provision(run, corral, plan, sb, storage)
  if not sandbox then return nil, perr end
  -- a signal held while the sandbox was provisioned: the command is not started
  local early = arrived(held)
  if early then return { signal = early, sandbox = sandbox } end
  reports:start_learning()
  if run.hooks.witness then run.hooks.witness.began(corral, plan.mech, sandbox.sb) end
  registration.value = announced(run, corral, plan, sandbox.sb)
  local result, xerr = run_command(corral, plan.mech, sandbox.sb, run.req.argv, held)
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
  local run = context(req, hooks)
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
