--- The `corral` subcommands, called by the host (core/host/main.c) when its first
-- argument names a command: parse and print only, the work is the library's.
--
-- Exit: 0 success, 1 failure, 2 bad usage, 3 `cannot_enforce`; `confine --exec` exits
-- with the program's status (the wrapper: 125 no layer, 126, 127). Listed once in
-- docs/boundary.md.
-- @module corral.cli
local core = require "corral.core"
local errors = require "corral.errors"
local shell = require "corral.shell"

local M = {}

local EXIT_USAGE, EXIT_CANNOT = core.exit.USAGE, core.exit.CANNOT

-- JSON in a stable key order (dkjson, the declared dependency); only --json needs it.
local function json()
  return require "corral.json"
end

local function fail(cmd, err)
  io.stderr:write(string.format("corral %s: %s\n", cmd, tostring(err)))
  if errors.is(err, "cannot_enforce") then return EXIT_CANNOT end
  if errors.is(err) then return EXIT_USAGE end
  return 1
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
      if not kind then return nil, errors.invalid_argument("--" .. name, "unknown option") end
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

local RUN_OPTION_NAMES = { storage = "--storage", id = "--id", workspace_path = "--workspace", env = "--env",
                           service_port = "--service-port", network = "--allow", log_json = "--log-json",
                           learn = "--learn", mechanism = "--mechanism", argv = "CMD" }
for _, k in ipairs({ "memory", "pids", "cpu", "wall", "fsize", "nofile", "disk" }) do
  RUN_OPTION_NAMES["limits." .. k] = "--" .. k
end
RUN_OPTION_NAMES.engine = "--engine"
RUN_OPTION_NAMES["network.max_connections"] = "--max-connections"

-- The flag a refusal of the sandbox's network is about: the one given that made it
-- (`--learn` alone makes one, as do `--resolve`, `--internal` and `--link`).
local function network_flag(opts)
  if #(opts.allow or {}) > 0 then return "--allow" end
  if opts["allow-file"] then return "--allow-file" end
  if opts.learn then return "--learn" end
  if #(opts.resolve or {}) > 0 then return "--resolve" end
  if #(opts.internal or {}) > 0 then return "--internal" end
  if opts.link then return "--link" end
  return "--allow"
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

--- The command closest to `name` (at most two edits, and fewer than its length), or nil.
-- @tparam string name
-- @treturn string|nil
function M.suggest(name)
  local best, best_d
  for _, n in ipairs(order) do
    local d = edit_distance(name, n)
    if d <= 2 and d < #name and (not best_d or d < best_d) then best, best_d = n, d end
  end
  return best
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

local CONFINE_OPTIONS = {
  { "Boundary", {
    { "permit", "value", "DIR", "the one directory CMD may read and write (required)" },
    { "extra", "list", "PATH", "another directory it may read and write, or one file (read-only) or unix " ..
      "socket (to connect to) granted alone" },
    { "cd", "value", "DIR", "its working directory, inside the boundary (default: DIR)" },
    { "layers", "value", "L", "ns, bwrap or landlock, or one of each: ns,landlock (default: all that hold)" },
  } },
  { "Output", {
    { "json", "flag", nil, "print the spec as JSON" },
    { "exec", "flag", nil, "run the spec instead, exiting with the command's status" },
  } },
}

-- The confine flag a corral.confinement argument came from: the error names what the
-- user typed (`--permit`), never the Lua field (`permit_path`).
local CONFINE_FLAGS = { permit_path = "--permit", cd = "--cd", layers = "--layers", cmd = "CMD" }
local function confine_flag(argument)
  local n = argument:match("^permit_extra_subpaths%[(%d+)%]$")
  if n then return "--extra (#" .. n .. ")" end
  return CONFINE_FLAGS[argument] or argument
end

command("confine", "confine a trusted process to one directory (control-plane profile)",
  [[corral confine --permit DIR [--extra PATH]... [--cd DIR] [--layers L] [--json] [--exec] -- CMD ARGS...

Builds the launch spec of the control-plane profile: CMD may read and write DIR (and
each --extra directory) and nothing else outside the runtime (read-only); an --extra
file is shown alone, read-only, and an --extra unix socket alone, to connect to (e.g.
$SSH_AUTH_SOCK; not a credential store, nor a file the runtime shows already). The
environment passes through unmodified, credential included, except HOME: when it is
outside DIR, HOME is a private tmpfs (with the ns or bwrap layer, as are /tmp, /var/tmp
and /run), or DIR/.corral-home under landlock alone. Egress stays permitted. Prints the spec (the
command to run is the confinement wrapper); environment values are never printed, only
the names. --exec runs it instead and exits with the command's status. On Linux the
spec names the layers that hold here: ns (mount+pid namespace; bwrap when only
bubblewrap can build it) and landlock; --layers names them instead (each must hold).

Sandboxes inside: CMD may build narrower ones (unshare -Ur, unshare -Urn, corral
confine or exec-confined with a --permit inside DIR); none reaches past DIR. Landlock
refuses mount(2) to every process it restricts, so a tool that builds a mount namespace
(bubblewrap: "Failed to make / slave: Operation not permitted") runs only under a mode
without it: --layers ns (or bwrap) keeps the namespace boundary and loses what Landlock
adds (magic links and inherited directory fds are then not covered). Under landlock
alone, a nested user namespace can map ids only for CMD itself (its own /proc/PID is
granted, not its children's), and not uid 0 for a root caller: that needs CAP_SETFCAP
in the host's user namespace, which is never kept.
Exit 2: an invalid argument; 3: this host cannot enforce the confinement; with --exec,
the command's status (127 when it is not found, 126 when it cannot be executed).]],
  function(argv)
    local opts, rest = M.parse(argv, option_spec(CONFINE_OPTIONS))
    if not opts then return fail("confine", rest) end
    if #rest == 0 then
      return fail("confine", errors.invalid_argument("CMD", "missing (after --)"))
    end
    local cmdargs = { table.unpack(rest, 2) }
    if opts.exec then
      -- an inherited directory on 0-2 leads out past both layers: refused as the argument
      -- error it is, before any probe runs
      for fd = 0, 2 do
        local st = core.fs.lstat("/proc/self/fd/" .. fd .. "/.")
        if st and st.type == "dir" then
          return fail("confine", errors.invalid_argument("fd " .. fd,
            "is a directory; an inherited directory would lead out of the boundary"))
        end
      end
    end
    local confinement = require "corral.confinement"
    local spec, err = confinement.confine({ rest[1], cmdargs }, {
      permit_path = opts.permit, permit_extra_subpaths = opts.extra, cd = opts.cd,
      env = core.proc.environ(), layers = opts.layers,
    })
    if not spec then
      if type(err) == "table" and err.argument then err.argument = confine_flag(err.argument) end
      return fail("confine", err)
    end
    if spec.layers and #spec.layers < 2 then
      io.stderr:write("corral confine: warning: only the ", table.concat(spec.layers, ", "),
        opts.layers and " layer, as --layers asks; " or " layer holds on this host; ", spec.layers[1] == "landlock"
          and "without the namespace layer, metadata changes (chmod, chown, utime), unix sockets and " ..
              "host processes outside the boundary stay reachable, and a root caller's sandboxes inside " ..
              "cannot map uid 0"
          or "without Landlock, magic links and inherited directory fds are not covered",
        opts.layers and "\n" or " (corral probe shows why)\n")
    end
    if opts.exec then
      local status, why = M.missing_command(rest[1])
      if status then
        io.stderr:write("corral confine: ", why, "\n")
        return status
      end
      local _, msg = confinement.exec(spec)
      return fail("confine", msg)
    end
    local names = {}
    for i, pair in ipairs(spec.env) do names[i] = pair[1] end
    if opts.json then
      io.write(json().encode({ cmd = spec.cmd, args = spec.args, cd = spec.cd,
        layers = spec.layers, env_names = names }), "\n")
    else
      io.write("cmd:    ", spec.cmd, "\n")
      io.write("args:   ", shell.join(spec.args), "\n")
      io.write("cd:     ", spec.cd, "\n")
      io.write("layers: ", table.concat(spec.layers, ", "), "\n")
      io.write("env:    ", #names, " variables passed through unmodified (values not shown)\n")
    end
    return 0
  end, CONFINE_OPTIONS)

local SBPL_OPTIONS = {
  { "Boundary", {
    { "permit", "value", "DIR", "the directory the profile permits (required)" },
    { "extra", "list", "PATH", "another directory it permits, or one file (read) or unix socket (connect)" },
  } },
}

command("sbpl", "print the macOS sandbox-exec profile for a boundary",
  [[corral sbpl --permit DIR [--extra PATH]...

Emits the SBPL deny-default profile the control-plane confinement uses on macOS, with
DIR and each --extra resolved first (SBPL matches resolved paths; a grant written
against a symlink silently never matches).]],
  function(argv)
    local opts, rest = M.parse(argv, option_spec(SBPL_OPTIONS))
    if not opts then return fail("sbpl", rest) end
    if #rest > 0 then return fail("sbpl", errors.invalid_argument(rest[1], "unexpected argument")) end
    local spec, err = require("corral.confinement").sandbox_exec_spec({ "/bin/sh" },
      { permit_path = opts.permit, permit_extra_subpaths = opts.extra })
    if not spec then
      if type(err) == "table" and err.argument then err.argument = confine_flag(err.argument) end
      return fail("sbpl", err)
    end
    io.write(spec.profile)
    if spec.profile:sub(-1) ~= "\n" then io.write("\n") end
    return 0
  end, SBPL_OPTIONS)

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
denied. Prints capability, holds/absent, the detail measured, and what it gates.
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
    for _, r in ipairs(results) do
      io.write(string.format("%-26s %-7s %s%s%s\n", r.name, r.holds and "holds" or "absent",
        r.detail, r.probed_at and os.date(" (probed at %H:%M:%S)", r.probed_at) or "",
        #r.gates > 0 and ("  [gates: " .. table.concat(r.gates, ", ") .. "]") or ""))
    end
    return 0
  end, PROBE_OPTIONS)

-- --idle, --max-connections and --verbose are read by corral.egress.run_options and
-- corral.egress.summary.
local RUN_OPTIONS = {
  { "Sandbox", {
    { "mechanism", "value", "NAME", "native (default), bwrap, oci, or FILE.lua (a mechanism in Lua)" },
    { "engine", "value", "ENGINE", "with --mechanism oci: podman or docker (default: whichever is installed)" },
    { "id", "value", "ID", "the sandbox's id (default tenant; with --storage, its last component)" },
    { "storage", "value", "DIR", "its storage at /storage, kept (default: a temporary one, removed)" },
    { "workspace", "value", "DIR", "a directory bound read-write at /workspace" },
  } },
  { "Limits", {
    { "memory", "value", "SIZE", "memory cap, e.g. 256M (exit 121 when it ends the command)" },
    { "pids", "value", "N", "at most N processes and threads, 4 to kernel.pid_max, e.g. 64" },
    { "cpu", "value", "CORES", "CPU bandwidth in cores, 0.01 to 1024, e.g. 0.5" },
    { "wall", "value", "DURATION", "wall-clock limit, e.g. 30s (exit 124 when it ends the command)" },
    { "fsize", "value", "SIZE", "largest file the command may write, e.g. 1G" },
    { "nofile", "value", "N", "at most N open files, 16 to corral's hard ulimit -n, e.g. 256" },
    { "disk", "value", "SIZE", "the storage on a disk of its own of SIZE, e.g. 1G, kept beside DIR (as root)" },
  } },
  { "Environment", {
    { "env", "list", "NAME", "pass the caller's NAME, unless it is credential-shaped" },
  } },
  { "Network and egress", {
    { "allow", "list", "ENTRY", "may connect there: pypi.org:443, *.pythonhosted.org, 10.0.0.0/8:5432, "
      .. "udp:ntp.test:123" },
    { "allow-file", "value", "FILE", "--allow entries from FILE, one per line (# comments)" },
    { "internal", "list", "CIDR", "admit a private range that an allowed name resolves into" },
    { "resolve", "list", "NAME=ADDR", "NAME is ADDR on the host, instead of what the resolver says" },
    { "service-port", "value", "N", "relay a port on 127.0.0.1 (printed on stderr) to port N inside" },
    { "link", "value", "NETNS,ADDR/PREFIX,GATEWAY[,PEER/PREFIX]",
      "its own routed link: a veth into NETNS (under /run/netns, or a path); root only" },
    { "idle", "value", "DURATION", "cut a connection idle that long, e.g. 10m (default: never)" },
    { "max-connections", "value", "N", "the sandbox's concurrent connections (default 4096, or as ulimit -Hn allows)" },
    { "udp-idle", "value", "DURATION", "end a UDP flow silent that long both ways (default 2m)" },
    { "max-udp-flows", "value", "N", "the sandbox's concurrent UDP flows (default 1024)" },
    { "sni", "value", "MODE", "match (default): reset a TLS SNI or first HTTP Host naming another host; require, off" },
    { "learn", "value", "FILE", "deny and record every connection; write the suggested allowlist to FILE (0600); "
      .. "not with --allow" },
  } },
  { "Output", {
    { "log-json", "value", "FILE", "write every egress decision to FILE (yours, regular, 0600) as a JSON line" },
    { "verbose", "flag", nil, "print each denial or upstream failure as it first happens" },
  } },
}

command("run", "run a tenant command in a sandbox (credentials stripped, no network)",
  [[corral run [OPTIONS] -- CMD ARGS...

Runs CMD as an untrusted tenant: root of its own user namespace mapped to an unprivileged
host id, its storage read-write at /storage (--storage DIR, or a temporary directory
removed afterwards), --workspace at /workspace, the runtime read-only, no network at
all, host processes invisible, every capability dropped, the tenant seccomp filter. The
environment starts from PATH HOME LANG TERM TZ. A terminal on stdin/stdout/stderr is put
back as it was after the run.

Storage and workspace: corral creates DIR owned by the sandbox's host id, or takes one
that id owns. One made by someone else (an operator's, owned by root; a repository
another user checked out) is shown, as root with native or bwrap, through an idmapped
mount: the tenant's root owns inside what DIR's owner owns, and what it creates lands
owned by that owner; nothing is chowned, the mount is nosuid,nodev. That hands the
tenant the whole tree: it is refused inside the runtime (/etc, /usr …), for a tree
holding a hard link to a file outside it or a setuid, setgid or file-capability program
(a write through a shared mapping keeps the bit), and for a storage in a root others may
write (anyone could have made it) or owned by another sandbox's host id. A directory
anyone may write (--workspace /tmp) is not its owner's alone: as a workspace it is shown
as it is, as a storage it is refused. A workspace that is, lies inside or (idmapped)
holds another sandbox's storage is refused, and one that is, lies on or holds a kernel
interface filesystem (/proc, /sys, /dev, cgroup …, judged by the filesystem's type). No
storage is made inside another either (each is marked with a trusted.corral.storage
attribute no tenant can touch): the outer tenant would reach the inner one's files and
disk. Where no idmapped mount can be made (the
filesystem, an unprivileged caller, --mechanism oci) such a storage is refused, saying
why, and such a workspace is writable only where its permissions let the host id
write. --disk SIZE puts the storage on an ext4 filesystem of that size of its own (an
image DIR's parent keeps as .ID.disk, made once and kept with the storage; as root,
native or bwrap): a write past it fails with ENOSPC. It must fit in the free space of
the filesystem that holds it (a kept one: what it may still grow). A run refused before
its command starts leaves no storage directory or image it made.

Egress (--allow ENTRY: name, *.suffix, IP or CIDR, [IPv6], each with :port, :a-b or
:80,443, or no port for any): any program, any TCP port, no proxy variables. The tenant's DNS gets
synthetic addresses for allowed names and NXDOMAIN for the rest; TCP to a port no entry
names is reset at the connect (when every entry names its ports), and every other
connection is decided by the host, resolved on the host and relayed. A name's addresses
are all tried (IPv6 first, then raced, as RFC 8305 asks) within the connect timeout;
TCP keepalive runs on both legs, so a dead end is noticed either way. Each connection
costs the host six fds, about 20 KiB of kernel memory (two sockets, two pipes, its NAT
entry) and 2 KiB of corral's own, plus up to 512 KiB of pipe only while bytes wait in
it; corral raises its own soft fd limit to the hard one. With --link,
permitted connections leave from the sandbox's netns through its link, on mark-checked
sockets, instead of from the host's; it needs root (exit 3 without). Without root the
rest holds the same: the sandbox's netns then belongs to a user namespace of the
caller's own, beneath which the tenant's is made. At the end of the run, what was denied
and which connections failed upstream are summarised on stderr with the option that
would change them. An --allow entry may be a URL (https://api.test is api.test:443). --sni match
(the default) resets a connection to an allowed name whose TLS SNI or first HTTP Host
names another host; a client silent for half a second (a server-first protocol) is
connected with its own bytes held until they are checked; require also refuses one
naming none. It reads the first flight only: later requests on a kept-alive HTTP
connection, and a Host inside TLS (domain fronting behind an allowed SNI), are not
seen. --learn FILE answers every name, denies and records every connection, and writes
the suggested allowlist to FILE for --allow-file.

A flag that cannot apply is refused (exit 2), naming it: --internal, --resolve, --link,
--idle, --max-connections and --sni without an --allow entry; --idle, --max-connections
and --sni when every entry is udp:, --sni when none names a host; --udp-idle and
--max-udp-flows without a udp: entry; --log-json and --verbose with no egress at all.
--learn takes them (so that the same command line runs again with --allow-file FILE),
but not --allow: what that lets through would be relayed and never recorded.

UDP leaves only for an entry that says so: --allow udp:ntp.test:123, udp:api.test:443
(QUIC), with the same grammar after udp: and its ports required. Each flow (the
tenant's address and port, and the destination) is decided on its first datagram as a
connection is, relayed from a socket on the host, and ends after --udp-idle of silence;
its decision and its end (bytes each way) are logged. UDP to a port no udp: entry names
is dropped and logged by the ruleset; DNS (port 53) is always the sandbox's own
responder, never relayed. A TCP entry never lets a datagram through, nor a udp: entry a
connection.

Signals: Ctrl-C, SIGTERM and SIGHUP are forwarded to the command. What still runs 3 s
after a SIGTERM or SIGHUP is killed; Ctrl-C starts that grace the second time, or the
first when everything in the sandbox ignores it (a command that handles one runs on, as
at a terminal).

Exit status: the command's own (128+N when killed by signal N; 127 when it is not
found, 126 when it cannot be executed, under every built-in mechanism); 121 when the
memory cap ended it; 124 when --wall did; 120 when the sandbox could not start;
122 when the mechanism could not tear it down; 2 for an invalid argument or a refused
variable; 3 when this host cannot enforce a protection. A command can exit with these
numbers itself: corral's own say so on stderr.]],
  function(argv)
    local opts, rest = M.parse(argv, option_spec(RUN_OPTIONS))
    if not opts then return fail("run", rest) end
    if #rest == 0 then return fail("run", errors.invalid_argument("CMD", "missing (after --)")) end
    local run_options = require "corral.egress.run_options"
    local network, nerr = run_options.network(opts)
    if nerr then return fail("run", nerr) end
    network, nerr = run_options.apply(network, opts)
    if nerr then return fail("run", nerr) end
    local meant, cerr = run_options.combination(network, opts)
    if not meant then return fail("run", cerr) end
    if opts.learn then
      local _, lerr = require("corral.egress.learn").check(opts.learn)
      if lerr then return fail("run", lerr) end
    end
    local status, err = require("corral.run").execute({
      argv = rest, mechanism = opts.mechanism, id = opts.id, storage = opts.storage, workspace = opts.workspace,
      limits = { memory = opts.memory, pids = opts.pids, cpu = opts.cpu, wall = opts.wall, fsize = opts.fsize,
                 nofile = opts.nofile, disk = opts.disk },
      env = opts.env, network = network, service_port = opts["service-port"], log_json = opts["log-json"],
      verbose = opts.verbose, engine = opts.engine, learn = opts.learn,
    }, { names = setmetatable({ network = network_flag(opts) }, { __index = RUN_OPTION_NAMES }),
         clear_environment = true, say = function(line) io.stderr:write("corral run: ", line, "\n") end })
    if not status then return fail("run", err) end
    return status
  end, RUN_OPTIONS)

-- The step and conformance modules load when their command runs or its usage is asked:
-- every other command (a `corral run`) is spared ~0.4 ms of loading them.
command("step", "run one step at the highest tier this host earns (S0/S1/S2) and print its receipt",
  function() return require("corral.tier.cli").USAGE end,
  function(argv) return require("corral.tier.cli").run(argv, M.parse, fail) end, nil,
  function() return require("corral.tier.cli").SPEC end)

command("exec-confined", "(internal) the confinement wrapper a launch spec runs",
  [[corral exec-confined --permit DIR [--extra PATH]... [--cd DIR] [--layers L] -- CMD ARGS...

The wrapper named by `corral confine` specs, run in C before any Lua state exists.
L is ns or bwrap (the namespace layer, built by corral or by bubblewrap), landlock, or
one of each joined by a comma (default ns,landlock).
Every layer named in --layers must be built or nothing runs (exit 125).]],
  function()
    -- Reached only if the host's C fast path was bypassed (e.g. via corral.cli.main).
    return fail("exec-confined", "must be run as `corral exec-confined`")
  end)

command("conformance", "run the conformance suite against a mechanism (held / breached / unavailable / void)",
  function() return require("corral.conformance.cli").USAGE end, function(argv)
    return require("corral.conformance.cli").run(argv, { parse = M.parse, fail = fail, json = json })
  end, nil, function() return require("corral.conformance.cli").SPEC end)

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
  local ok, status = xpcall(c.run, debug.traceback, argv)
  if not ok then
    io.stderr:write("corral ", argv[1], ": ", tostring(status), "\n")
    return 1
  end
  return status
end

return M
