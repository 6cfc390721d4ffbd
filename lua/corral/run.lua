--- One command in a fresh sandbox, from start to end: what `corral run` does once its
-- arguments are parsed. A refusal names the argument in the caller's own words; a
-- temporary storage is made and removed; signals are forwarded and the terminal put back.
-- @module corral.run
local core = require "corral.core"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local leftovers = require "corral.leftovers"

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

-- Sizes and durations as given (corral.sandbox parses them), counts to integers, cpu to a
-- number; each written in plain decimal (tonumber would take "0x10" and " 5").
local function convert_limits(given, invalid)
  local sandbox = require "corral.sandbox"
  local limits = {}
  given = given or {}
  for _, k in ipairs({ "memory", "fsize", "wall", "disk" }) do limits[k] = given[k] end
  for _, k in ipairs({ "pids", "nofile" }) do
    if given[k] then
      limits[k] = sandbox.parse_integer(given[k])
      if not limits[k] then
        return invalid("limits." .. k, string.format("must be a whole number in decimal, got %q", tostring(given[k])))
      end
    end
  end
  if given.cpu then
    limits.cpu = sandbox.parse_decimal(given.cpu)
    if not limits.cpu then
      return invalid("limits.cpu", string.format("must be a number of cores in decimal (e.g. 0.5), got %q",
        tostring(given.cpu)))
    end
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

-- Why the host must not write `path` (a --learn or --log-json file), or nil. It may lie
-- where the tenant writes — its storage, its workspace — and there a tenant of an earlier
-- run may have put a symbolic link in its way (the host's write would land where it points:
-- /etc/passwd truncated by --learn) or a FIFO (the host's open would block for ever). Each
-- component is examined in turn: outside those trees a link is the operator's and is
-- followed; inside, none is, and what the path names must be a regular file or missing.
local function unsafe_host_file(path, sb)
  local trees = {}
  for _, dir in ipairs({ require("corral.sandbox").storage_path(sb), sb.workspace_path }) do
    local st = core.fs.lstat(dir)
    if st and st.type == "dir" then trees[#trees + 1] = st end
  end
  local function is_tree(st)
    for _, t in ipairs(trees) do
      if st.dev == t.dev and st.ino == t.ino then return true end
    end
    return false
  end
  if path == "-" or #trees == 0 then return nil end
  local cur = path:sub(1, 1) == "/" and "" or (core.path.resolve(".") or ".")
  local inside, st = false, nil
  for comp in path:gmatch("[^/]+") do
    local at = cur .. "/" .. comp
    st = core.fs.lstat(at)
    if not st then return nil end -- the rest does not exist yet: the write makes it, or fails
    if st.type == "link" then
      if inside then
        return at .. " is a symbolic link inside the sandbox's storage or workspace (name the file itself)"
      end
      at = core.path.resolve(at)
      st = at and core.fs.lstat(at)
      if not st then return nil end
    end
    cur = at
    inside = inside or (st.type == "dir" and is_tree(st))
  end
  if inside and st and st.type ~= "file" then
    return path .. " is not a regular file (" .. st.type .. ") inside the sandbox's storage or workspace"
  end
  return nil
end

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
--   environment is then left to what the run passes on.
-- @treturn[1] integer the exit status: the command's own, or one of `EXIT` (`teardown`
--   when the mechanism's destroy failed: said, by the mechanism's name)
-- @return[2] nil nothing ran
-- @treturn[2] table error (`invalid_argument`, `refused_env` or `cannot_enforce`)
function M.execute(req, hooks)
  hooks = hooks or {}
  local say = hooks.say or function() end
  local names = hooks.names or {}
  local function name(key) return names[key] or key end
  local function invalid(key, detail) return nil, errors.invalid_argument(name(key), detail) end
  -- The error in the caller's words: its argument renamed, and a detail that names the
  -- argument (the gate's: "so limits.memory cannot be honoured") rebuilt from its
  -- detail_format; never a substitution inside the detail, which quotes the user's value.
  local function renamed(err)
    if type(err) ~= "table" or not err.argument then return err end
    local key = err.argument
    if key == "id" or key == "storage" or key == "storage_root" then key = req.storage and "storage" or "id" end
    if not names[key] then return err end
    local detail = err.detail_format and string.format(err.detail_format, names[key]) or err.detail
    return errors.new(err.code, { argument = names[key], capability = err.capability, detail = detail,
                                  errno = err.errno })
  end

  local argv = req.argv
  if type(argv) ~= "table" or type(argv[1]) ~= "string" or argv[1] == "" then
    return invalid("argv", "the command to run is missing or empty")
  end

  local held <close> = hold_signals()
  local corral = require "corral"
  -- The tenant's variables are taken first; then this process's environment is left to
  -- what the run passes on (corral's own process), or stripped of credentials (a
  -- caller's), its original block overwritten, before any mechanism is loaded: nothing
  -- it runs (os.execute, /proc/<pid>/environ) finds anything else.
  local env, keep = {}, table.move(M.KEEP_ENV, 1, #M.KEEP_ENV, 1, {})
  local host_env = core.proc.environ()
  for _, var in ipairs(req.env or {}) do
    if host_env[var] == nil then return invalid("env", var .. " is not set in this environment") end
    env[var] = host_env[var]
    keep[#keep + 1] = var
  end
  -- each reads what it needs of the environment as it loads: XDG_RUNTIME_DIR (where runs
  -- register), and what the probes' results depend on (TMPDIR, PATH)
  require "corral.control"
  require "corral.probe_cache"
  local cleared, cerr = hardening.clear_own_environment(hooks.clear_environment and keep or nil)
  if not cleared then
    return nil, errors.cannot_enforce("environment_filter", "corral's own environment could not be cleared " ..
      "before the mechanism is loaded: " .. tostring(cerr))
  end
  local mech, merr = corral.mechanism.load(req.mechanism or "native")
  if not mech then return nil, renamed(merr) end
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
    service_port = require("corral.sandbox").parse_integer(req.service_port)
    if not service_port then
      return invalid("service_port", string.format("must be a port number in decimal, got %q",
        tostring(req.service_port)))
    end
  end

  -- the temporary storage comes last, so an invalid value leaves nothing behind
  local temp
  local function new_temp()
    local made, terr = leftovers.make(TEMP_DIR, TEMP_PREFIX)
    if not made then
      -- a full or read-only /tmp (inside `corral confine`) is the host's, not the arguments'
      return nil, errors.cannot_enforce("filesystem_confinement", "cannot make a temporary storage in " ..
        TEMP_DIR .. " (" .. tostring(terr) .. "); give " .. name("storage") .. " DIR")
    end
    temp = made
    core.fs.chmod(temp, tonumber("711", 8))
    root, id = temp, req.id or "tenant"
    return true
  end
  local function remove_temp()
    if not temp then return end
    local ok, rerr = core.fs.remove_tree(temp)
    if not ok then say("warning: temporary storage " .. temp .. " not removed: " .. tostring(rerr)) end
  end
  if not req.storage then
    leftovers.sweep_own(TEMP_DIR, TEMP_PREFIX)
    local made, terr = new_temp()
    if not made then return nil, terr end
  end
  local function describe()
    return corral.sandbox({ id = id, storage_root = root, workspace_path = req.workspace,
      env = env, limits = limits, network = req.network, service_port = service_port })
  end
  local sb, err = describe()
  if not sb then remove_temp() return nil, renamed(err) end
  for _, key in ipairs({ "log_json", "learn" }) do
    local why = req[key] and unsafe_host_file(req[key], sb)
    if why then
      remove_temp()
      return invalid(key, why)
    end
  end

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
  local learner
  -- ran: whether the command ran (only then is there anything for --learn to write)
  local function release(ran)
    remove_temp()
    if summary then summary.finish() end
    if learner and ran then
      local ok, n = learner.finish()
      say("--learn: " .. (ok and (n .. " entries written to " .. req.learn) or ("not written: " .. tostring(n))))
    elseif learner then
      learner.cancel()
    end
    if log_close then log_close() end
  end

  if not corral.mechanism.is_builtin(mech) and corral.mechanism.claims_nothing(mech, sb) then
    say(string.format("warning: mechanism %s claims none of %s: the command runs as the caller (uid %d), " ..
      "on the host", corral.mechanism.label(mech), table.concat(corral.mechanism.ISOLATION, ", "),
      core.proc.geteuid()))
  end
  local ok, perr = corral.provision(mech, sb)
  -- a temporary storage whose host id another process holds: a fresh directory gives another id
  for _ = 1, 3 do
    if ok or not (temp and type(perr) == "table" and perr.held_by) then break end
    remove_temp()
    temp = nil
    local made, terr = new_temp()
    if not made then release(false) return nil, terr end
    sb, err = describe()
    if not sb then release(false) return nil, renamed(err) end
    ok, perr = corral.provision(mech, sb)
  end
  if not ok then release(false) return nil, renamed(perr) end
  local asked = type(req.network) == "table" and req.network.max_connections
  if asked then
    -- the plane has raised this process's RLIMIT_NOFILE as far as it goes (corral.egress.fdlimit)
    local cap, why = require("corral.egress.fdlimit").fit(asked)
    if why then say(string.format("%s %d lowered to %d: %s", name("network.max_connections"), asked, cap, why)) end
  end

  -- A destroy that fails is reported by the mechanism's name, and the run exits
  -- EXIT.teardown whatever the command did: something of the sandbox may be left behind.
  local function teardown()
    local dok, derr = corral.destroy(mech, sb)
    if dok then return true end
    local label, text = corral.mechanism.label(mech), tostring(derr)
    if not text:find("mechanism " .. label, 1, true) then
      text = "mechanism " .. label .. ": destroy failed: " .. text
    end
    return false, text
  end

  -- a signal held while the sandbox was provisioned: the command is not started
  local early = arrived(held)
  if early then
    local torn, why = teardown()
    release(false)
    say("signal " .. early .. " arrived before the command started")
    if torn then return 128 + early end
    say(why)
    return M.EXIT.teardown
  end

  learner = req.learn and require("corral.egress.learn").start(req.learn)
  local _, addr = corral.address(mech, sb)
  if addr then say("service port " .. service_port .. " on " .. addr) end
  -- Visible to this user's REPL while it runs, gone when it ends (corral.control).
  local registration <close> = require("corral.control").register(mech, sb, { argv = req.argv }) -- luacheck: ignore

  -- The held signals go to the sandbox, and this process stays to clean up (dying here
  -- would leave the cgroup behind); a custom mechanism's exec runs in a watched child
  -- (corral.mechanism.watch) bounded by --wall and these signals.
  local ttys = {}
  for fd = 0, 2 do ttys[fd] = core.tty.save(fd) end
  local result, xerr
  if corral.mechanism.is_builtin(mech) then
    result, xerr = corral.exec(mech, sb, req.argv, { signals = held.fd })
  else
    result, xerr = require("corral.mechanism.watch").exec(mech, sb, req.argv, {}, held.fd)
  end
  for fd = 0, 2 do
    if ttys[fd] then core.tty.restore(fd, ttys[fd]) end
  end
  local torn, why = teardown()
  release(result ~= nil)
  local status = outcome(result, xerr, req.argv, say)
  if torn then return status end
  say(why)
  say(string.format("exit %d, not %d: the sandbox was not torn down, something of it may be left behind",
    M.EXIT.teardown, status))
  return M.EXIT.teardown
end

return M
