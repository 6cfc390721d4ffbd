--- One command in a fresh sandbox, from start to end: what `corral run` does once its
-- arguments are parsed. A refusal names the argument in the caller's own words; a
-- temporary storage is made and removed; signals are forwarded and the terminal put back.
-- @module corral.run
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local resources = require "corral.resources"

local M = {}

--- The statuses corral's own outcomes exit with (any other is the command's own).
M.EXIT = { not_started = core.exit.START_REFUSED, memory = core.exit.MEMORY, wall = core.exit.WALL,
           invalid = core.exit.USAGE }

local TEMP_DIR = "/tmp"
local TEMP_PATTERN = "^corral%-run%-(%d+)%-%w+$"

-- A temporary storage of ours; never a link, nor a tree another user made.
local function remove_own_tree(path)
  local st = core.fs.lstat(path)
  return st and st.type == "dir" and st.uid == core.proc.geteuid() and core.fs.remove_tree(path)
end

-- Sizes and durations as given (corral.sandbox parses them), counts to integers, cpu to a number.
local function convert_limits(given, invalid)
  local limits = {}
  given = given or {}
  for _, k in ipairs({ "memory", "fsize", "wall" }) do limits[k] = given[k] end
  for _, k in ipairs({ "pids", "nofile" }) do
    if given[k] then
      limits[k] = math.tointeger(tonumber(given[k]))
      if not limits[k] then return invalid("limits." .. k, "must be an integer") end
    end
  end
  if given.cpu then
    limits.cpu = tonumber(given.cpu)
    if not limits.cpu then return invalid("limits.cpu", "must be a number of cores") end
  end
  return limits
end

-- The storage root and id from a storage path: DIR may not exist yet, its parent must
-- (corral.sandbox.check_root, the Lua API's rule too); the id is DIR's last component.
local function split_storage(storage, id, invalid, name)
  local parent, base = storage:gsub("/+$", ""):match("^(.*)/([^/]+)$")
  if storage:sub(1, 1) ~= "/" then return invalid("storage", storage .. ": must be an absolute path") end
  if not parent or base == "." or base == ".." then
    return invalid("storage", storage .. ": must name a directory below /, ending in its own name (not . or ..)")
  end
  local dir, err = require("corral.sandbox").check_root(parent == "" and "/" or parent)
  if not dir then return invalid("storage", err.detail) end
  if id and id ~= base then
    return invalid("id", string.format("the sandbox's id is %s's last component (%s); give one of %s and %s",
      name("storage"), base, name("id"), name("storage")))
  end
  return dir, base
end

--- Runs a command in a new sandbox and releases the sandbox afterwards.
-- @tparam table req what to run:
--   `argv` (the command), `mechanism` (a built-in name, a .lua path or a table; default
--   native), `id`, `storage` (a directory path: the storage itself, kept afterwards;
--   without it a temporary one is made and removed), `workspace`, `limits` (`memory`,
--   `fsize`, `wall` as corral.sandbox takes them, `pids`, `nofile`, `cpu` as numbers or
--   numeric strings), `env` (names of the caller's variables to pass), `network` (as
--   corral.sandbox takes it), `service_port`, `log_json` (a path for the decision log),
--   `verbose` (print each egress denial as it happens), `engine` (the oci mechanism's
--   engine: podman, docker or a path), `learn` (a file for the suggested allowlist).
-- @tparam[opt] table hooks how the caller presents: `say(line)` for each message to the
--   user (default: none), `names` the caller's name for each argument a refusal is about
--   (`"limits.memory"`, `"storage"`, `"id"`, `"workspace_path"`, `"env"`,
--   `"service_port"`, `"network"`, `"log_json"`; default: those keys themselves).
-- @treturn[1] integer the exit status: the command's own, or one of `EXIT`
-- @return[2] nil nothing ran
-- @treturn[2] table error (`invalid_argument`, `refused_env` or `cannot_enforce`)
function M.execute(req, hooks)
  hooks = hooks or {}
  local say = hooks.say or function() end
  local names = hooks.names or {}
  local function name(key) return names[key] or key end
  local function invalid(key, detail) return nil, errors.invalid_argument(name(key), detail) end
  local function renamed(err)
    if type(err) ~= "table" or not err.argument then return err end
    local key = err.argument
    if key == "id" or key == "storage" or key == "storage_root" then key = req.storage and "storage" or "id" end
    if not names[key] then return err end
    -- a gate refusal names the field in its detail too (limits.memory is --memory)
    local detail = err.detail:gsub(err.argument:gsub("%p", "%%%0"), (names[key]:gsub("%%", "%%%%")))
    return errors.new(err.code, { argument = names[key], capability = err.capability, detail = detail })
  end

  local corral = require "corral"
  -- the tenant's variables are taken first, then credential-shaped ones leave this
  -- process's environment before any mechanism is loaded: its os.execute inherits the rest
  local env = {}
  local host_env = core.proc.environ()
  for _, var in ipairs(req.env or {}) do
    if host_env[var] == nil then return invalid("env", var .. " is not set in this environment") end
    env[var] = host_env[var]
  end
  hardening.clear_own_environment()
  local mech, merr = corral.mechanism.load(req.mechanism or "native")
  if not mech then return nil, merr end
  if req.engine then
    if type(mech.engine) ~= "function" then return invalid("engine", "only the oci mechanism drives an engine") end
    local _, why = mech.engine(req.engine)
    if why then return invalid("engine", why) end
    mech.config.engine = req.engine
  end
  local limits, lerr = convert_limits(req.limits, invalid)
  if not limits then return nil, lerr end
  local root, id = nil, req.id
  if req.storage then
    local base_or_err
    root, base_or_err = split_storage(req.storage, req.id, invalid, name)
    if not root then return nil, base_or_err end
    id = base_or_err
  end
  local service_port
  if req.service_port then
    service_port = math.tointeger(tonumber(req.service_port))
    if not service_port then return invalid("service_port", "must be a port number") end
  end

  -- the temporary storage comes last, so an invalid value leaves nothing behind
  local temp
  local function new_temp()
    temp = assert(core.fs.mkdtemp(TEMP_DIR .. "/corral-run-" .. core.proc.getpid() .. "-"))
    core.fs.chmod(temp, tonumber("711", 8))
    root, id = temp, req.id or "tenant"
  end
  local function remove_temp()
    if not temp then return end
    local ok, rerr = core.fs.remove_tree(temp)
    if not ok then say("warning: temporary storage " .. temp .. " not removed: " .. tostring(rerr)) end
  end
  if not req.storage then
    resources.sweep(TEMP_DIR, TEMP_PATTERN, remove_own_tree)
    new_temp()
  end
  local function describe()
    return corral.sandbox({ id = id, storage_root = root, workspace_path = req.workspace,
      env = env, limits = limits, network = req.network, service_port = service_port })
  end
  local sb, err = describe()
  if not sb then remove_temp() return nil, renamed(err) end

  local log, log_close
  if req.log_json then
    local events = require "corral.egress.events"
    local writer, closer = events.json_lines_writer(req.log_json)
    if not writer then
      remove_temp()
      return invalid("log_json", tostring(closer))
    end
    log = events.subscribe(writer)
    log_close = function()
      events.unsubscribe(log)
      closer()
    end
  end
  local summary = req.network and require("corral.egress.summary").start({ verbose = req.verbose })
  local learner = req.learn and require("corral.egress.learn").start(req.learn)
  local function release()
    remove_temp()
    if summary then summary.finish() end
    if learner then
      local ok, n = learner.finish()
      say("--learn: " .. (ok and (n .. " entries written to " .. req.learn) or ("not written: " .. tostring(n))))
    end
    if log_close then log_close() end
  end

  local ok, perr = corral.provision(mech, sb)
  -- a temporary storage whose host id another process holds: a fresh directory gives another id
  for _ = 1, 3 do
    if ok or not (temp and type(perr) == "table" and perr.held_by) then break end
    remove_temp()
    new_temp()
    sb, err = describe()
    if not sb then release() return nil, renamed(err) end
    ok, perr = corral.provision(mech, sb)
  end
  if not ok then release() return nil, renamed(perr) end
  local asked = type(req.network) == "table" and req.network.max_connections
  if asked then
    -- the plane has raised this process's RLIMIT_NOFILE as far as it goes (corral.egress.fdlimit)
    local cap, why = require("corral.egress.fdlimit").fit(asked)
    if why then say(string.format("%s %d lowered to %d: %s", name("network.max_connections"), asked, cap, why)) end
  end
  local _, addr = corral.address(mech, sb)
  if addr then say("service port " .. service_port .. " on " .. addr) end
  -- Visible to this user's REPL while it runs, gone when it ends (corral.control).
  local registration <close> = require("corral.control").register(mech, sb, { argv = req.argv }) -- luacheck: ignore

  -- Ctrl-C, SIGTERM and SIGHUP go to the sandbox, and this process stays to clean up
  -- (dying here would leave the cgroup behind); a custom mechanism's exec runs in a
  -- watched child (corral.mechanism.watch) bounded by --wall and these signals.
  local forwarded = { "INT", "TERM", "HUP" }
  local signals = core.signal.fd(forwarded)
  local ttys = {}
  for fd = 0, 2 do ttys[fd] = core.tty.save(fd) end
  local result, xerr
  if corral.mechanism.is_builtin(mech) then
    result, xerr = corral.exec(mech, sb, req.argv, { signals = signals })
  else
    result, xerr = require("corral.mechanism.watch").exec(mech, sb, req.argv, {}, signals)
  end
  for fd = 0, 2 do
    if ttys[fd] then core.tty.restore(fd, ttys[fd]) end
  end
  if signals then
    signals:close()
    core.signal.unblock(forwarded) -- the caller may live on (a script, the REPL)
  end
  corral.destroy(mech, sb)
  release()

  if not result then
    say(tostring(xerr))
    return errors.is(xerr, "cannot_enforce") and M.EXIT.not_started or M.EXIT.invalid
  end
  if result.error and (result.code == 127 or result.code == 126) then
    local cmd = tostring(req.argv[1])
    say(result.code == 127 and not cmd:find("/", 1, true) and cmd .. ": command not found"
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

return M
