--- `corral create`, `ls`, `rm`, `policy ID` and `exec`'s usage: live sandboxes from the
-- CLI (docs/sessions.md). Registered by corral.cli, which hands each handler its parser
-- and failure printer; the keeper is corral.session.keeper, the exec client the host's
-- C fast path (core/host).
-- @module corral.session.cli
local core = require "corral.core"
local errors = require "corral.errors"
local session = require "corral.session"

local M = {}

M.CREATE_USAGE = [[corral create ID [OPTIONS]

Creates a live sandbox named ID (1 to 63 of A-Z a-z 0-9 _ . -) with every `corral run`
option (its storage, limits, environment, egress allowlist), and leaves a keeper process
holding it: the sandbox waits, and `corral exec ID -- CMD` runs commands in it, each in
the same namespaces, cgroup, seccomp filter, capability set, environment policy and
allowlist as a run, sharing its /tmp, /storage and processes. Prints ID once the sandbox
is ready. Every argument is checked first: a bad one is refused naming its flag (exit 2),
one this host cannot enforce exits 3; nothing is left either way; a keeper that ends
before the sandbox is ready (killed) exits 120. An ID already live is refused. `corral
rm ID` removes it; a killed keeper takes its sandbox with it, and the next corral create,
ls or rm sweeps what stays on disk. Every mechanism: native and bwrap join the sandbox,
oci execs through the engine into the container, a mechanism in Lua runs each exec
through its exec callback (docs/sessions.md).]]

M.EXEC_USAGE = [[corral exec ID [--env NAME|NAME=VALUE]... [--cwd DIR] [-t] -- CMD ARGS...

Runs CMD inside the live sandbox ID (corral create) on this terminal's stdin, stdout and
stderr, or with -t on a pseudo-terminal of the sandbox's own devpts. --env NAME passes
NAME's value from this environment, --env NAME=VALUE sets it (credential-shaped names
and values are refused, naming --env); --cwd DIR starts it there. SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded; if this client goes away, the
command and everything still beneath it are killed. Exit: the command's status (128+N
for signal N; 137 when the keeper went away under it, the sandbox killed), 120 when it
went away before starting it, 2 for a bad argument or no live sandbox ID, 125 when the sandbox cannot
run it, 126/127 not executable/not found. docs/sessions.md has the wire protocol.]]

M.LS_USAGE = [[corral ls [--json]

Lists this user's live sandboxes (corral create, kind session), corral runs in progress
(run) and corral-runtime keepers (runtime, by container id): id, kind, mechanism, age,
processes, egress (allowlist entries; connections allowed and denied since creation),
memory. Every keeper is asked at once; one that has not answered within 2 s is listed
as not answering. Sweeps what killed keepers left.]]
M.LS_SPEC = { json = "flag" }

M.RM_USAGE = [[corral rm ID [ID]...

Stops and destroys each live sandbox ID: its processes, cgroup, network namespace and
egress plane, temporary storage, socket and keeper. A storage given with --storage stays.]]
M.RM_SPEC = {}

M.POLICY_USAGE = [[corral policy ID [--allow ENTRY]... [--revoke ENTRY]... [--cut]
corral policy --canonical FILE

With ID: changes the live sandbox ID's egress allowlist, as the REPL's allow and revoke
(an ENTRY as `corral run --allow` takes it); new connections follow at once, and --cut
resets the open ones a revoke no longer allows. Prints the allowlist. A sandbox made
without --allow has no network to open.
With --canonical: prints the exact bytes a receipt's commitment covers (`corral verify`).]]
M.POLICY_SPEC = { allow = "list", revoke = "list", cut = "flag", canonical = "flag" }

-- The status a refusal exits with, as `corral run`'s (2 invalid, 3 cannot enforce,
-- 120 a resource that ran out for a moment).
local function status_of(code)
  if code == "cannot_enforce" then return core.exit.CANNOT end
  if code == "resource" then return core.exit.START_REFUSED end
  if code then return core.exit.USAGE end
  return 1
end

-- The signals `corral create` holds while its keeper makes the sandbox.
local HELD = { "INT", "TERM", "HUP" }

-- What the keeper said on the ready pipe: one JSON line, or nothing once it is gone; and
-- the first of HELD that arrived meanwhile. The wait goes on after one (the keeper says
-- how far it got, so that create can undo it); a second ends it at once, and the keeper,
-- finding nobody to tell, winds down by itself. HELD stay blocked until create exits: one
-- that comes once the sandbox is ready is too late to undo it, and create ends as made.
local function read_ready(fd)
  local json = require "corral.json" -- loaded first: nothing is interrupted while it loads
  local sigfd = core.signal.fd(HELD)
  local buf, sig = "", nil
  while not buf:find("\n", 1, true) do
    local readable, again = false, false
    for _, i in ipairs(core.io.poll({ fd, sigfd }, -1) or {}) do
      if i == 1 then
        readable = true
      else
        local n = core.signal.read(sigfd)
        again = again or (sig ~= nil and n ~= nil)
        sig = sig or n
      end
    end
    if again then break end
    local data = readable and core.io.read(fd, 4096)
    if data == "" then break end
    buf = buf .. (data or "")
  end
  sigfd:close()
  local ok, t = pcall(json.decode, buf:match("^[^\n]*") or "")
  return ok and type(t) == "table" and t or nil, sig
end

-- The checks `corral create` makes before anything is made: the id, the flags, the
-- environment, the mechanism, the arguments. Returns the run context and plan.
local function planned(argv, cli, say)
  local opts, rest = cli.parse(argv)
  if not opts then return nil, rest end
  if #rest ~= 1 then return nil, errors.invalid_argument("ID", #rest == 0 and "missing" or "only one ID") end
  local id, err = session.check_id(rest[1])
  if not id then return nil, err end
  if opts.receipt then return nil, errors.invalid_argument("--receipt", "a live sandbox has no receipt") end
  local req, names = require("corral.run.cli").request(opts, {})
  if not req then return nil, names end
  req.id = opts.id or (not opts.storage and id) or nil
  session.sweep()
  if session.live(id) then
    return nil, errors.invalid_argument("ID", id .. " is live already (corral rm " .. id .. ")")
  end
  local path, perr = session.path(id)
  if not path then return nil, errors.cannot_enforce("control_socket", tostring(perr)) end
  local steps = require "corral.run.steps"
  local run = steps.context(req, { names = names, clear_environment = true, say = say })
  local plan
  plan, err = steps.planned(run, require "corral")
  if not plan then return nil, err end
  local mechanism = require "corral.mechanism"
  if mechanism.is_builtin(plan.mech) and not (plan.mech.join or plan.mech.name == "oci") then
    return nil, errors.invalid_argument("--mechanism", mechanism.label(plan.mech) .. " cannot hold a live sandbox " ..
      "(docs/sessions.md)")
  end
  return { id = id, path = path, run = run, plan = plan }
end

--- `corral create ID [run flags]`.
function M.create(argv, cli)
  local say = function(line) io.stderr:write("corral create: ", line, "\n") end
  local p, err = planned(argv, cli, say)
  if not p then return cli.fail("create", err) end
  local role, fd = core.proc.detach()
  if not role then return cli.fail("create", errors.cannot_enforce("control_socket", tostring(fd))) end
  if role == "detached" then
    require("corral.session.keeper").run(p.run, p.plan, p.id, p.path, fd)
    core.proc.exit(0)
  end
  local said, sig = read_ready(fd)
  fd:close()
  if sig then
    -- interrupted: what the keeper made is undone, and create ends as that signal would
    if said and said.ok then session.request(p.id, { op = "rm" }, 30) end
    io.stderr:write("corral create: ", p.id, ": signal ", sig, " arrived before it was ready; nothing of it is left\n")
    return 128 + sig
  end
  if not said then
    -- killed, or dead of a failure it could not report: the sandbox could not start
    io.stderr:write("corral create: ", p.id, ": the keeper ended before the sandbox was ready\n")
    return core.exit.START_REFUSED
  end
  if not said.ok then
    io.stderr:write("corral create: ", tostring(said.error), "\n")
    return status_of(said.code)
  end
  local service = type(said.result) == "table" and said.result.service
  if service then say("service port " .. tostring(p.plan.args.service_port) .. " on " .. tostring(service)) end
  io.write(p.id, "\n")
  return 0
end

-- "3m", "2h": an age for ls.
local function age(seconds)
  seconds = math.max(0, seconds)
  if seconds < 120 then return seconds .. "s" end
  if seconds < 7200 then return seconds // 60 .. "m" end
  if seconds < 172800 then return seconds // 3600 .. "h" end
  return seconds // 86400 .. "d"
end

local function mib(bytes)
  return bytes and string.format("%.1fM", bytes / 1048576) or "-"
end

-- One ls row from a registration and its status answer (or an older keeper's info): a
-- session's (by its id), a corral-runtime keeper's (mechanism "runtime", its container's
-- id) or a run's.
local function row_of(reg, a, now)
  local usage, e = a.usage or {}, a.egress
  local runtime = a.mechanism == "corral-runtime"
  return { id = reg.session or a.id, kind = reg.session and "session" or (runtime and "runtime" or "run"),
    mechanism = runtime and "runtime" or a.mechanism, pid = a.pid, age = now - (a.started or now),
    processes = a.processes or usage.pids or #(a.tenant_pids or {}),
    memory = a.memory or usage.memory_current or usage.memory_rss,
    egress = e and { allow = type(e.allow) == "table" and #e.allow or e.allow or 0, connections = e.connections or 0,
      allowed = e.allowed or 0, denied = e.denied or 0 } or nil }
end

--- Seconds `corral ls` waits for all the keepers' answers together: one that accepts and
-- never answers is listed as not answering once they are up.
M.LS_TIMEOUT = 2

-- Each registration's status, all asked at once; a keeper from before `status` (an
-- older corral's, still running) is asked `info`.
local function statuses(control, paths, meanwhile)
  local answers = control.request_all(paths, { op = "status" }, M.LS_TIMEOUT, meanwhile)
  local older, at = {}, {}
  for i, a in ipairs(answers) do
    if a.error and a.error:find("^unknown op status") then older[#older + 1], at[#older + 1] = paths[i], i end
  end
  if #older > 0 then
    for k, a in ipairs(control.request_all(older, { op = "info" }, M.LS_TIMEOUT)) do answers[at[k]] = a end
  end
  return answers
end

-- The registrations that did not answer: a killed keeper's socket is swept (and what it
-- left, should it have died since the sweep ls began with); a live one that did not
-- answer in time is a row that says so.
local function unanswered(failed, why)
  local sockets = {}
  for _, reg in ipairs(failed) do
    if reg.session then sockets[#sockets + 1] = reg.path end
  end
  local gone, n = session.sweep_sockets(sockets)
  if n > 0 then session.sweep({}) end
  local rows = {}
  for _, reg in ipairs(failed) do
    if not gone[reg.path] and core.fs.lstat(reg.path) then
      rows[#rows + 1] = { id = reg.session or ("pid " .. tostring(reg.pid)), kind = reg.session and "session" or "run",
        error = why[reg] }
    end
  end
  return rows
end

local KIND_ORDER = { session = 1, run = 2, runtime = 3 }
local LS_FORMAT = "%-20s %-8s %-10s %6s %6s %-26s %9s\n"

-- The registrations of this user ls shows: through a broker, the sessions it made, none
-- of the operator's own (nor runs).
local function visible(control)
  local regs = control.list()
  local own = require("corral.broker.boundary").sessions()
  if not own then return regs end
  local mine = {}
  for _, reg in ipairs(regs) do
    if reg.session and own[reg.session] then mine[#mine + 1] = reg end
  end
  return mine
end

local function ls_text(rows)
  local out = { string.format(LS_FORMAT, "ID", "KIND", "MECHANISM", "AGE", "PROCS", "EGRESS", "MEMORY") }
  for _, r in ipairs(rows) do
    local e = r.egress
    local egress = e and string.format("%d allow %d ok %d denied", e.allow, e.allowed, e.denied) or "none"
    if r.error then
      out[#out + 1] = string.format(LS_FORMAT, tostring(r.id), r.kind, "-", "-", "-",
        "(no answer within " .. M.LS_TIMEOUT .. " s)", "-")
    else
      out[#out + 1] = string.format(LS_FORMAT, tostring(r.id), r.kind, tostring(r.mechanism), age(r.age),
        tostring(r.processes), egress, mib(r.memory))
    end
  end
  return table.concat(out)
end

--- `corral ls [--json]`: every registration of this user asked at once (sessions, runs
-- in progress, corral-runtime keepers), `LS_TIMEOUT` seconds at most.
function M.ls(argv, cli)
  local opts, rest = cli.parse(argv, M.LS_SPEC)
  if not opts then return cli.fail("ls", rest) end
  if rest[1] then return cli.fail("ls", errors.invalid_argument(rest[1], "corral ls takes no operand")) end
  local control = require "corral.control"
  local regs, paths = visible(control), {}
  for i, reg in ipairs(regs) do paths[i] = reg.path end
  local rows, failed, why, now = {}, {}, {}, os.time()
  -- what killed keepers left is swept while the live ones answer
  for i, answer in ipairs(statuses(control, paths, function() session.sweep({}) end)) do
    if type(answer.result) == "table" then
      rows[#rows + 1] = row_of(regs[i], answer.result, now)
    else
      failed[#failed + 1], why[regs[i]] = regs[i], tostring(answer.error)
    end
  end
  local marked = unanswered(failed, why)
  table.move(marked, 1, #marked, #rows + 1, rows)
  table.sort(rows, function(a, b)
    if a.kind ~= b.kind then return KIND_ORDER[a.kind] < KIND_ORDER[b.kind] end
    return tostring(a.id) < tostring(b.id)
  end)
  if opts.json then
    io.write(cli.json().encode(rows), "\n")
    return 0
  end
  io.write(ls_text(rows))
  return 0
end

local function no_live(id)
  return errors.invalid_argument("ID", "no live sandbox " .. id .. " (corral ls lists this user's)")
end

-- A request its keeper never answered, named by ID (never by a flag: the request was
-- not refused): the keeper was killed meanwhile, its sandbox gone with it and what it
-- left swept, or it is still there and silent.
local function never_answered(id, why)
  session.sweep()
  if not session.live(id) then
    return errors.invalid_argument("ID", "no live sandbox " .. id .. ": its keeper ended before it answered")
  end
  return id .. ": its keeper did not answer: " .. tostring(why)
end

-- Waits (2 s at most) for a keeper that answered rm to be gone, so that nothing of
-- the session is left when rm returns.
local function wait_gone(pid)
  local deadline = core.clock.monotime() + 2
  while pid and core.fs.lstat("/proc/" .. pid) and core.clock.monotime() < deadline do
    core.io.poll({}, 0.01)
  end
end

--- `corral rm ID...`.
function M.rm(argv, cli)
  local opts, rest = cli.parse(argv, M.RM_SPEC)
  if not opts then return cli.fail("rm", rest) end
  if #rest == 0 then return cli.fail("rm", errors.invalid_argument("ID", "missing")) end
  session.sweep()
  local status = 0
  for _, id in ipairs(rest) do
    local ok, err = session.check_id(id)
    if ok and not session.live(id) then err = no_live(id) end
    if ok and not err then
      local info = session.request(id, { op = "info" })
      local keeper = type(info) == "table" and math.tointeger(info.pid)
      -- the keeper answers once everything is released (a cgroup emptied, a plane closed)
      local removed, rerr, how = session.request(id, { op = "rm" }, 30)
      if removed then
        wait_gone(keeper)
        io.write(id, "\n")
      elseif how == "unanswered" then
        wait_gone(keeper)
        err = never_answered(id, rerr)
      else
        err = rerr
      end
    end
    if err then status = math.max(status, cli.fail("rm", err)) end
  end
  session.sweep()
  return status
end

--- `corral policy ID --allow ENTRY --revoke ENTRY`, or a receipt's `--canonical FILE`.
function M.policy(argv, cli)
  local opts, rest = cli.parse(argv, M.POLICY_SPEC)
  if not opts then return cli.fail("policy", rest) end
  if opts.canonical then
    if #opts.allow + #opts.revoke > 0 or opts.cut then
      return cli.fail("policy", errors.invalid_argument(#opts.allow > 0 and "--allow" or
        (#opts.revoke > 0 and "--revoke" or "--cut"), "not with --canonical"))
    end
    return require("corral.receipt.cli").policy(argv, cli)
  end
  if #rest ~= 1 then return cli.fail("policy", errors.invalid_argument("ID", "give one live sandbox")) end
  local id, err = session.check_id(rest[1])
  if not id then return cli.fail("policy", err) end
  if not session.live(id) then return cli.fail("policy", no_live(id)) end
  if #opts.allow + #opts.revoke == 0 then
    return cli.fail("policy", errors.invalid_argument("--allow", "give --allow or --revoke ENTRY"))
  end
  local allow
  for _, step in ipairs({ { "allow", opts.allow }, { "revoke", opts.revoke } }) do
    for _, entry in ipairs(step[2]) do
      local r, rerr, how = session.request(id, { op = step[1], entry = entry, cut = opts.cut or nil })
      if how == "unanswered" then return cli.fail("policy", never_answered(id, rerr)) end
      if not r then
        -- the keeper's refusal names the entry where it is about one entry
        return cli.fail("policy", errors.invalid_argument("--" .. step[1], tostring(rerr)))
      end
      allow = r.allow
    end
  end
  for _, e in ipairs(allow or {}) do io.write(e, "\n") end
  return 0
end

M.EXEC_SPEC = { env = "list", cwd = "value" }

--- `corral exec` reached in Lua: the client is the host's C fast path (core/host), which
-- runs before any Lua state exists; here its arguments are checked as it checks them,
-- and a host built without it says so.
function M.exec(argv, cli)
  local words = {}
  for i, a in ipairs(argv) do
    if a == "--" then table.move(argv, i, #argv, #words + 1, words) break end
    if a ~= "-t" then words[#words + 1] = a end
  end
  local opts, rest = cli.parse(words)
  if not opts then return cli.fail("exec", rest) end
  if not rest[1] then return cli.fail("exec", errors.invalid_argument("ID", "missing")) end
  local id, err = session.check_id(rest[1])
  if not id then return cli.fail("exec", err) end
  if not session.live(id) then return cli.fail("exec", no_live(id)) end
  if not rest[2] then return cli.fail("exec", errors.invalid_argument("CMD", "missing (after --)")) end
  return cli.fail("exec", errors.cannot_enforce("control_socket", "this corral was built without the exec client"))
end

return M
