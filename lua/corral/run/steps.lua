--- The named steps a sandbox's life is made of, shared by `corral run` (corral.run: one
-- command, then the end) and a session's keeper (corral.session.keeper: a sandbox kept
-- for many execs): the caller's presentation, the environment taken, the mechanism
-- loaded, the arguments checked, the storage made, the reports opened, the sandbox
-- provisioned. Each owner releases what its step acquired when its scope ends.
-- @module corral.run.steps
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local leftovers = require "corral.leftovers"
local run_request = require "corral.run_request"

local M = {}

local TEMP_DIR = "/tmp"
local TEMP_PREFIX = "corral-run-"

--- The variables `corral run` keeps of its own environment (corral.hardening
-- .clear_own_environment): the tenant's base names and TMPDIR, where corral itself
-- makes its scratch files; the run's `--env` names are kept too.
M.KEEP_ENV = { "PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR" }

--- The caller's presentation shared by every step: `say`, and refusals in its words.
function M.context(req, hooks)
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
                                  errno = err.errno, resource = err.resource })
  end
  return run
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

--- Removes the temporary storages that runs now gone made (a SIGKILLed run leaves its own).
function M.sweep_temp()
  leftovers.sweep_own_soon(TEMP_DIR, TEMP_PREFIX)
end

--- The storage (a to-be-closed value: a temporary one is removed when it closes), made
-- after every argument is checked, so an invalid value leaves nothing behind.
-- @tparam table run the context
-- @tparam table args run_request.arguments'
-- @tparam[opt] boolean sweep_later the caller calls `sweep_temp` itself once a temporary
--   storage is made (corral.run: while the sandbox's init builds its root)
-- @treturn table the storage (`root`, `id`, `temp`), and an error when none could be made
function M.storage_of(run, args, sweep_later)
  local storage = setmetatable({ run = run, root = args.root, id = args.id }, Storage)
  if not run.req.storage then
    if not sweep_later then M.sweep_temp() end
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
M.Reports = Reports

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

-- The tenant's variables are taken first; then this process's environment is left to
-- what the run passes on (corral's own process), or stripped of credentials (a
-- caller's), its original block overwritten, before any mechanism is loaded: nothing
-- it runs (os.execute, /proc/<pid>/environ) finds anything else.
local function take_environment(run)
  local env, keep = {}, table.move(M.KEEP_ENV, 1, #M.KEEP_ENV, 1, {})
  -- under a broker, the agent's values (corral.broker.boundary), never this process's
  local host_env = require("corral.broker.boundary").environment() or core.proc.environ()
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

--- What the run is made of before anything is made: the tenant's environment, the
-- mechanism, the checked arguments, and `describe(storage)`, the sandbox on a storage.
-- @tparam table run the context
-- @tparam table corral the corral module
-- @treturn[1] table `{mech =, args =, describe =}`
-- @return[2] nil
-- @treturn[2] table the refusal
function M.planned(run, corral)
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

--- Provisions the sandbox. A temporary storage whose host id another process holds is
-- made again: a fresh directory gives another id.
-- @treturn[1] table the provisioned sandbox (`sb`, `mech`; destroyed when it closes)
-- @return[2] nil
-- @treturn[2] table the refusal
function M.provision(run, corral, plan, sb, storage)
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

--- The sandbox on a storage, checked, its reports opened, provisioned: what a run and a
-- keeper do once the storage is there.
-- @tparam table run the context
-- @tparam table corral the corral module
-- @tparam table plan `planned`'s
-- @tparam table storage `storage_of`'s
-- @tparam table reports a `Reports` (its log and summary opened here)
-- @treturn[1] table the provisioned sandbox (`sb`, `mech`; destroyed when it closes)
-- @return[2] nil
-- @treturn[2] table the refusal
function M.provisioned(run, corral, plan, storage, reports)
  local sb, err = plan.describe(storage)
  if not sb then return nil, run.renamed(err) end
  local ok
  ok, err = run_request.host_files(run, sb)
  if not ok then return nil, err end
  ok, err = reports:open_log_and_summary()
  if not ok then return nil, err end
  return M.provision(run, corral, plan, sb, storage)
end

return M
