--- The `corral` subcommands, called by the host (core/host/main.c) when its first
-- argument names a command: parse and print only, the work is the library's.
--
-- Exit: 0 success, 1 failure, 2 bad usage, 3 `cannot_enforce`, 120 `resource`; `confine
-- --exec` exits with the program's status (the wrapper: 125 no layer, 126, 127). Listed
-- once in docs/boundary.md.
-- @module corral.cli
-- first: what a broker hands its corral is read before a run clears the environment
require "corral.broker.boundary"
local confinement_cli = require "corral.confinement.cli"
local core = require "corral.core"
local errors = require "corral.errors"
local run_cli = require "corral.run.cli"

local M = {}

local EXIT_USAGE, EXIT_CANNOT = core.exit.USAGE, core.exit.CANNOT

-- JSON in a stable key order (dkjson, the declared dependency); only --json needs it.
local function json()
  return require "corral.json"
end

local function fail(cmd, err)
  io.stderr:write(string.format("corral %s: %s\n", cmd, tostring(err)))
  if errors.is(err, "cannot_enforce") then return EXIT_CANNOT end
  if errors.is(err, "resource") then return core.exit.START_REFUSED end
  if errors.is(err) then return EXIT_USAGE end
  return 1
end

-- Optimal string alignment distance (Levenshtein with transpositions): `rnu` is one edit from `run`.
local function edit_distance(a, b)
  local d = {}
  for i = 0, #a do d[i] = { [0] = i } end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      d[i][j] = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:sub(i, i) == b:sub(j - 1, j - 1) and a:sub(i - 1, i - 1) == b:sub(j, j) then
        d[i][j] = math.min(d[i][j], d[i - 2][j - 2] + 1)
      end
    end
  end
  return d[#a][#b]
end

-- The candidate closest to `name` (at most two edits, and fewer than its length), or nil.
local function closest(name, candidates)
  local best, best_d
  for _, n in ipairs(candidates) do
    local d = edit_distance(name, n)
    if d <= 2 and d < #name and (not best_d or d < best_d) then best, best_d = n, d end
  end
  return best
end

-- "; did you mean '--memory'?" for a near miss of one of `spec`'s options, else "".
local function option_hint(name, spec)
  local names = {}
  for n in pairs(spec) do names[#names + 1] = n end
  table.sort(names) -- a tie goes the same way every run
  local s = closest(name, names)
  return s and ("; did you mean '--" .. s .. "'?") or ""
end

--- Parses `argv[2..]` against `spec` (`{name = "value" | "list" | "flag"}`): `--name
-- value` or `--name=value`, `--` ends them.
-- @tparam {string,...} argv
-- @tparam table spec
-- @treturn table options and {string,...} the rest; or nil and invalid_argument
function M.parse(argv, spec)
  local opts, rest = {}, {}
  for name, kind in pairs(spec) do
    if kind == "list" then opts[name] = {} end
  end
  local i = 2
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      for j = i + 1, #argv do rest[#rest + 1] = argv[j] end
      break
    end
    local name, inline = a:match("^%-%-([%w-]+)=(.*)$")
    name = name or a:match("^%-%-([%w-]+)$")
    if not name and #rest == 0 and a:match("^%-.") then
      -- before any operand, a dash word is an option, never a command named "-x"
      return nil, errors.invalid_argument(a, "unknown option (options are --long; a command goes after --)")
    elseif not name then
      rest[#rest + 1] = a
    else
      local kind = spec[name]
      if not kind then
        return nil, errors.invalid_argument("--" .. name, "unknown option" .. option_hint(name, spec))
      end
      if kind == "flag" then
        if inline then return nil, errors.invalid_argument("--" .. name, "takes no value") end
        opts[name] = true
      else
        local v = inline
        if not v then
          i = i + 1
          v = argv[i]
          -- `--permit -- CMD`: the option's value is missing, not "--"
          if v == nil or v == "--" then return nil, errors.invalid_argument("--" .. name, "needs a value") end
        end
        if kind == "list" then
          opts[name][#opts[name] + 1] = v
        elseif opts[name] ~= nil then
          -- last-one-wins would let a second --permit silently replace the first
          return nil, errors.invalid_argument("--" .. name, "given twice")
        else
          opts[name] = v
        end
      end
    end
    i = i + 1
  end
  return opts, rest
end

--- Whether `cmd` cannot be run, as a shell says it: `core.exit.NOTFOUND` (127, "command
-- not found") or `core.exit.NOEXEC` (126) and why; nil when it looks runnable.
-- @tparam string cmd
-- @treturn integer|nil status, and the message
function M.missing_command(cmd)
  if not cmd:find("/", 1, true) then
    local r = core.path.resolve_executable(cmd)
    if r and r:find("/", 1, true) then return nil end
    return core.exit.NOTFOUND, cmd .. ": command not found"
  end
  local real, err, errno = core.path.resolve_file(cmd)
  local st = real and core.fs.lstat(real)
  if not st then
    local status = errno == core.errno.ENOENT and core.exit.NOTFOUND or core.exit.NOEXEC
    return status, cmd .. ":" .. tostring(err):match(":([^:]*)$")
  end
  if st.type == "dir" then return core.exit.NOEXEC, cmd .. ": Is a directory" end
  if st.mode & tonumber("111", 8) == 0 then return core.exit.NOEXEC, cmd .. ": Permission denied" end
  return nil
end

local commands = {}
local order = {}

-- Option groups `{title, {option, ...}}`, each `{name, kind, metavar, meaning}`.
local function option_spec(groups)
  local spec = {}
  for _, g in ipairs(groups) do
    for _, o in ipairs(g[2]) do spec[o[1]] = o[2] end
  end
  return spec
end

-- The parser of a command's option groups: corral.cli.parse against their spec.
local function parser(groups)
  local spec = option_spec(groups)
  return function(argv) return M.parse(argv, spec) end
end

-- a meaning that does not fit beside a long option starts on the next line
local OPTION_COLUMN = 28
local function options_text(groups)
  local lines = {}
  local function add(left, meaning)
    if #left + 2 > OPTION_COLUMN then
      lines[#lines + 1] = left
      lines[#lines + 1] = string.rep(" ", OPTION_COLUMN) .. meaning
    else
      lines[#lines + 1] = left .. string.rep(" ", OPTION_COLUMN - #left) .. meaning
    end
  end
  for _, g in ipairs(groups) do
    lines[#lines + 1] = g[1] .. ":"
    for _, o in ipairs(g[2]) do
      add("  --" .. o[1] .. (o[3] and (" " .. o[3]) or ""), o[4] .. (o[2] == "list" and "; repeatable" or ""))
    end
    lines[#lines + 1] = ""
  end
  add("  -h, --help", "this help")
  return table.concat(lines, "\n") .. "\n"
end

-- Registers a subcommand with its synopsis and option groups (see option_spec).
-- usage may be a function returning it, for a command whose module a run need not load;
-- so may `spec`, the parser's spec of a command whose module parses its own flags.
local function command(name, summary, usage, fn, options, spec)
  commands[name] = { summary = summary, usage = usage, run = fn, options = options, spec = spec }
  order[#order + 1] = name
end

-- A help topic (not a command): the mechanism contract, in full in docs/mechanisms.md.
local TOPICS = {
  mechanisms = [[corral help mechanisms

A mechanism is a Lua table (or a .lua file returning one) with provision, start, exec,
stop, destroy and status (optional: address, required_capabilities,
constructed_capabilities). exec returns {code = 0..255, how =, limit =}; every result
is checked and a broken mechanism is named. Around any mechanism the host applies the
gate, the environment filter (corral's own environment is left to what the run passes
on before the mechanism loads), --wall and forwarded signals; a flag it neither
constructs nor asks for (--memory without resource_limits, --workspace without
workspace) is refused; a destroy that fails is named and the run exits 122. Examples:
scripts/examples/; the contract: docs/mechanisms.md.]],
}

--- The command closest to `name` (at most two edits, and fewer than its length), or nil.
-- @tparam string name
-- @treturn string|nil
function M.suggest(name)
  return closest(name, order)
end

-- "; did you mean 'run'?", or where the commands are listed.
local function hint(name)
  local s = M.suggest(name)
  return s and ("; did you mean '" .. s .. "'?") or "; `corral help` lists the commands"
end

local function write_help(c)
  io.write(type(c.usage) == "function" and c.usage() or c.usage, "\n\n")
  if c.options then io.write(options_text(c.options)) end
end

command("help", "list the commands, or explain one",
  [[corral help [COMMAND | mechanisms]

Lists the commands, or prints COMMAND's usage and options (as `corral COMMAND --help`);
`corral help mechanisms` summarises the mechanism contract (docs/mechanisms.md).]],
  function(argv)
    local name = argv[2]
    if name then
      if TOPICS[name] then
        io.write(TOPICS[name], "\n")
        return 0
      end
      local c = commands[name]
      if not c then
        return fail("help", errors.invalid_argument("COMMAND", "no command " .. name .. hint(name)))
      end
      write_help(c)
      return 0
    end
    io.write("corral — process confinement with a C core and Lua policy\n\n")
    io.write("usage: corral COMMAND [ARGS]   |   corral [lua options] [script [args]]\n\n")
    for _, n in ipairs(order) do io.write(string.format("  %-14s %s\n", n, commands[n].summary)) end
    io.write("\n`corral help COMMAND` (or `corral COMMAND --help`) explains one; `corral help mechanisms`\n" ..
      "the mechanism contract; `corral --version` prints the version; `corral` alone opens a\n" ..
      "REPL. Lua's own options, as lua5.4 takes them:\n" ..
      "-e STAT, -l MOD, -l G=MOD, -i, -v, -E, -W, -- and - (stdin).\n")
    return 0
  end)

command("confine", "confine a trusted process to one directory (control-plane profile)", confinement_cli.CONFINE_USAGE,
  function(argv)
    return confinement_cli.confine(argv, { parse = parser(confinement_cli.CONFINE_OPTIONS), fail = fail,
      missing_command = M.missing_command, json = json })
  end, confinement_cli.CONFINE_OPTIONS)

command("sbpl", "print the macOS sandbox-exec profile for a boundary", confinement_cli.SBPL_USAGE,
  function(argv)
    return confinement_cli.sbpl(argv, { parse = parser(confinement_cli.SBPL_OPTIONS), fail = fail })
  end, confinement_cli.SBPL_OPTIONS)

command("resolve", "resolve a command the way the kernel will",
  [[corral resolve CMD

A bare name through PATH, then every symlink component by component. Exits 1, saying
so, when CMD is not found (127's case for a command) or cannot be executed (126's).]],
  function(argv)
    if #argv ~= 2 then return fail("resolve", errors.invalid_argument("CMD", "exactly one is needed")) end
    local _, why = M.missing_command(argv[2])
    if why then return fail("resolve", why) end
    local r, err = core.path.resolve_executable(argv[2])
    if not r then return fail("resolve", err) end
    io.write(r, "\n")
    return 0
  end)

local PROBE_OPTIONS = { { "Output", {
  { "json", "flag", nil, "print the results as JSON" },
  { "fresh", "flag", nil, "probe everything again, dropping what was kept for this boot" },
} } }

command("probe", "establish which protections hold on this host, by doing them",
  [[corral probe [--json] [--fresh]

Each capability runs a control that must succeed and then the breach that must be
denied. Prints capability, holds/absent, the detail measured, and what it gates
("unknown" when a resource ran out while probing: it runs again at the next call).
Results that hold are kept for the boot and host state (in the caller's runtime
directory) and marked "(probed at HH:MM:SS)"; any change of that state, and any launch
whose enforcement step fails, probes again; --fresh does it now. Ctrl-C, SIGTERM or
SIGHUP stop it after the current probe, whose result is dropped, and it exits 128+N.]],
  function(argv)
    local opts, rest = M.parse(argv, option_spec(PROBE_OPTIONS))
    if not opts then return fail("probe", rest) end
    if rest[1] then return fail("probe", errors.invalid_argument(rest[1], "corral probe takes no operand")) end
    local probe = require "corral.probe"
    if opts.fresh then probe.reset() end
    -- held while probing, so that a signal never kills a probe before it removes its
    -- scratch files, nor is taken for its verdict (Lua's "interrupted!" in a probe)
    local STOP = { "INT", "TERM", "HUP" }
    local held = core.signal.fd(STOP)
    local results, sig = probe.probe({ signals = held })
    if held then
      held:close()
      core.signal.unblock(STOP)
    end
    if sig then
      io.stderr:write(string.format("corral probe: stopped by signal %d after %d of %d probes; " ..
        "the one it interrupted was not kept\n", sig, #results, #probe.names()))
      return 128 + sig
    end
    if opts.json then
      io.write(json().encode(results), "\n")
      return 0
    end
    for _, r in ipairs(results) do io.write(probe.line(r), "\n") end
    return 0
  end, PROBE_OPTIONS)

command("run", "run a tenant command in a sandbox (credentials stripped, no network)", run_cli.USAGE,
  function(argv) return run_cli.run(argv, { parse = parser(run_cli.OPTIONS), fail = fail }) end, run_cli.OPTIONS)

-- The step and conformance modules load when their command runs or its usage is asked:
-- every other command (a `corral run`) is spared ~0.4 ms of loading them.
command("step", "run one step at the highest tier this host earns (S0/S1/S2) and print its receipt",
  function() return require("corral.tier.cli").USAGE end,
  function(argv) return require("corral.tier.cli").run(argv, M.parse, fail) end, nil,
  function() return require("corral.tier.cli").SPEC end)

command("exec-confined", "(internal) the confinement wrapper a launch spec runs",
  [[corral exec-confined --permit DIR [--extra PATH]... [--read-only PATH]... [--cd DIR] [--layers L] -- CMD ARGS...

The wrapper named by `corral confine` specs, run in C before any Lua state exists.
L is ns or bwrap (the namespace layer, built by corral or by bubblewrap), landlock, or
one of each joined by a comma (default ns,landlock).
Every layer named in --layers must be built or nothing runs (exit 125); so is each
--read-only path (a file or directory beneath the boundary, bound read-only: it needs
the ns or bwrap layer).]],
  function()
    -- Reached only if the host's C fast path was bypassed (e.g. via corral.cli.main).
    return fail("exec-confined", "must be run as `corral exec-confined`")
  end)

command("conformance", "run the conformance suite against a mechanism (held / breached / unavailable / void)",
  function() return require("corral.conformance.cli").USAGE end, function(argv)
    return require("corral.conformance.cli").run(argv, { parse = M.parse, fail = fail, json = json })
  end, nil, function() return require("corral.conformance.cli").SPEC end)

-- Receipts (corral.receipt.cli): the host key, a receipt verified, a commitment's bytes.
local function receipt_command(name, summary, what)
  command(name, summary, function() return require("corral.receipt.cli")[what .. "_USAGE"] end,
    function(argv) return require("corral.receipt.cli")[name](argv, { parse = M.parse, fail = fail }) end, nil,
    function() return require("corral.receipt.cli")[what .. "_SPEC"] end)
end
receipt_command("key", "print the host key that signs receipts, and its fingerprint", "KEY")
receipt_command("verify", "check a signed receipt and say what was enforced", "VERIFY")

-- Live sandboxes (corral.session.cli): made, entered, listed, changed, removed.
local function session_command(name, summary, what, options)
  local function cli_of() return require "corral.session.cli" end
  command(name, summary, function() return cli_of()[what .. "_USAGE"] end, function(argv)
    local spec = options and option_spec(options) or cli_of()[what .. "_SPEC"]
    return cli_of()[name](argv, { parse = function(a, sp) return M.parse(a, sp or spec) end, fail = fail, json = json })
  end, options, options and nil or function() return cli_of()[what .. "_SPEC"] or {} end)
end
session_command("create", "create a live sandbox (every run flag) kept by a keeper process", "CREATE", run_cli.OPTIONS)
session_command("exec", "run a command inside a live sandbox", "EXEC")
session_command("ls", "list this user's live sandboxes", "LS")
session_command("rm", "stop and remove live sandboxes, leaving nothing", "RM")
session_command("policy", "change a live sandbox's allowlist; or print a receipt's canonical policy", "POLICY")

command("attach", "open the REPL on a live sandbox (its helpers default to it)",
  [[corral attach ID

ID names a sandbox of a running `corral run` of this user (root: anyone's): its id, id@PID
when several share one, or the PID of the corral process serving it; the REPL's
sandboxes() lists them. Its helpers (help() lists them) then default to that sandbox.]],
  function(argv) return require("corral.repl").attach_main(argv, fail) end)

--- Whether `name` is a subcommand.
-- @tparam string name
-- @treturn boolean
function M.is_command(name)
  return commands[name] ~= nil
end

--- The subcommands, in the order `corral help` lists them.
-- @treturn {string,...}
function M.commands()
  return table.move(order, 1, #order, 1, {})
end

--- A subcommand's usage text and the flags its parser accepts.
-- @tparam string name
-- @treturn table `{usage = text, flags = {"--name", ...} sorted}`, or nil for no such command
function M.describe(name)
  local c = commands[name]
  if not c then return nil end
  local spec = c.options and option_spec(c.options) or (c.spec and c.spec()) or {}
  local flags = {}
  for k in pairs(spec) do flags[#flags + 1] = "--" .. k end
  table.sort(flags)
  return { usage = type(c.usage) == "function" and c.usage() or c.usage, flags = flags }
end

-- Whether the words before `--` ask for help (`-h` or `--help`).
local function wants_help(argv)
  for i = 2, #argv do
    if argv[i] == "--" then return false end
    if argv[i] == "-h" or argv[i] == "--help" then return true end
  end
  return false
end

--- Runs a subcommand (`argv[1]`); `-h`/`--help` before `--` prints its help; an unknown
-- name is a usage error naming the closest command.
-- @tparam {string,...} argv
-- @treturn integer exit status
function M.main(argv)
  local name = tostring(argv[1])
  local c = commands[name]
  if not c then
    io.stderr:write("corral: unknown command '", name, "'", hint(name), "\n")
    return EXIT_USAGE
  end
  if wants_help(argv) then
    write_help(c)
    return 0
  end
  -- inside `corral confine --broker`, the broker outside runs it (corral.broker.client)
  if os.getenv("CORRAL_BROKER") then
    local status = require("corral.broker.client").run(argv)
    if status then return status end
  end
  local ok, status = xpcall(c.run, debug.traceback, argv)
  if not ok then
    io.stderr:write("corral ", argv[1], ": ", tostring(status), "\n")
    return 1
  end
  return status
end

return M
