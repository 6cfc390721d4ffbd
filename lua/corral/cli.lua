--- The `corral` subcommands. The host (core/host/main.c) calls `main` when its first
-- argument names a command; everything here is ordinary Lua over the library.
--
-- Exit statuses of the commands themselves: 0 success, 1 failure, 2 bad usage or an
-- invalid argument, 3 a protection this host cannot enforce (`cannot_enforce`). A
-- command that runs another program (`confine --exec`) exits with that program's status;
-- the confinement wrapper itself exits 125 when a layer cannot be built (nothing ran),
-- 126 when the command cannot be executed, 127 when it is not found.
-- @module corral.cli
local core = require "corral.core"
local errors = require "corral.errors"
local shell = require "corral.shell"

local M = {}

local EXIT_USAGE, EXIT_CANNOT = 2, 3

local function json()
  local ok, dkjson = pcall(require, "dkjson")
  if ok then return dkjson end
  local ok2, cjson = pcall(require, "cjson")
  if ok2 then return cjson end
  error("JSON output needs dkjson or lua-cjson (Debian: lua-dkjson)")
end

local function fail(cmd, err)
  io.stderr:write(string.format("corral %s: %s\n", cmd, tostring(err)))
  if errors.is(err, "cannot_enforce") then return EXIT_CANNOT end
  if errors.is(err) then return EXIT_USAGE end
  return 1
end

--- Parses `argv[2..]` against `spec` (`{name = "value" | "list" | "flag"}`); options are
-- `--name value` or `--name=value`; `--` ends them. Returns the options and the rest.
-- @tparam {string,...} argv
-- @tparam table spec
-- @treturn table options
-- @treturn {string,...} remaining words
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the option
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
    if not name then
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
          -- Last-one-wins would let a second --permit silently replace the first.
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

--- The `network` table from run's egress options, or nil when none was given.
-- @tparam table opts parsed options
-- @treturn table|nil network
-- @return[2] nil
-- @treturn[2] table error naming the option
function M.network_options(opts)
  -- Every value is checked here, so that a refusal names the option it came from
  -- (--allow, --allow-file with its line, --internal, --resolve) and nothing starts.
  local allowlist = require "corral.egress.allowlist"
  local function invalid(option, fmt, ...)
    return nil, errors.invalid_argument(option, string.format(fmt, ...))
  end
  local allow = {}
  for _, e in ipairs(opts.allow or {}) do
    local _, aerr = allowlist.parse_entry(e)
    if aerr then return invalid("--allow", "%s", aerr.detail) end
    allow[#allow + 1] = e
  end
  if opts["allow-file"] then
    local file = opts["allow-file"]
    local f, ferr = io.open(file)
    if not f then return nil, errors.invalid_argument("--allow-file", tostring(ferr)) end
    local n = 0
    for line in f:lines() do
      n = n + 1
      line = line:gsub("#.*", ""):match("^%s*(.-)%s*$")
      if line ~= "" then
        local _, aerr = allowlist.parse_entry(line)
        if aerr then
          f:close()
          return invalid("--allow-file", "%s:%d: %s", file, n, aerr.detail)
        end
        allow[#allow + 1] = line
      end
    end
    f:close()
  end
  for _, c in ipairs(opts.internal or {}) do
    local ok, why = allowlist.parse_cidr(c)
    if not ok then return invalid("--internal", '"%s": %s (write a CIDR, e.g. 10.20.0.0/16)', c, why) end
  end
  local resolve
  for _, r in ipairs(opts.resolve or {}) do
    local name, addr = r:match("^([^=]*)=(.*)$")
    if not name or name == "" or addr == "" then
      return invalid("--resolve", '"%s": expected NAME=ADDR (e.g. pypi.org=192.0.2.10)', r)
    end
    local n, why = allowlist.normalize_name(name)
    if not n then return invalid("--resolve", '"%s": %s is not a hostname: %s', r, name, why) end
    local text = addr:match("^%[(.*)%]$") or addr
    if not core.inet.parse(text) then
      return invalid("--resolve", '"%s": %s is not an IP address (NAME=ADDR, e.g. pypi.org=192.0.2.10)', r, addr)
    end
    resolve = resolve or {}
    resolve[n] = resolve[n] or {}
    table.insert(resolve[n], text)
  end
  local link
  if opts.link then
    local ns, addr, gw, peer = opts.link:match("^([^,]+),([^,]+),([^,]+),?([^,]*)$")
    if not ns then
      return nil, errors.invalid_argument("--link", opts.link .. ": expected NETNS,ADDR/PREFIX,GATEWAY[,PEER/PREFIX]")
    end
    link = { peer_netns = ns:find("/", 1, true) and ns or ("/run/netns/" .. ns), address = addr, gateway = gw,
             peer_address = peer ~= "" and peer or nil }
    if not core.lstat(link.peer_netns) then
      return nil, errors.invalid_argument("--link", link.peer_netns .. ": no such network namespace")
    end
  end
  if #allow == 0 and #(opts.internal or {}) == 0 and not resolve and not link then return nil end
  return { allow = allow, internal = opts.internal, resolve = resolve, link = link }
end

--- Removes the temporary storage of earlier runs that were killed before they could
-- clean up (SIGKILL leaves no chance): `/tmp/corral-run-PID-XXXXXX` directories of ours
-- whose PID no longer exists. A red-team run found ~240 such directories left behind.
-- @treturn integer how many were removed
function M.sweep_stale_runs()
  local removed = 0
  for _, name in ipairs(core.listdir("/tmp") or {}) do
    local pid = name:match("^corral%-run%-(%d+)%-%w+$")
    if pid and not core.lstat("/proc/" .. pid) then
      local path = "/tmp/" .. name
      local st = core.lstat(path)
      if st and st.type == "dir" and st.uid == core.geteuid() and core.remove_tree(path) then
        removed = removed + 1
      end
    end
  end
  return removed
end

--- The command-line option an error from corral.sandbox is about: the same error with
-- `argument` renamed (`limits.memory` is `--memory`, `workspace_path` is `--workspace`).
-- @tparam table err
-- @tparam table opts the parsed options of `run`
-- @treturn table
function M.as_option(err, opts)
  if type(err) ~= "table" or not err.argument then return err end
  local a = err.argument
  local option = a:match("^limits%.(.+)$")
  option = option and "--" .. option
    or ({ workspace_path = "--workspace", service_port = "--service-port", env = "--env",
          network = "--allow" })[a]
    or ((a == "id" or a == "storage" or a == "storage_root") and (opts.storage and "--storage" or "--id"))
  if not option then return err end
  return errors.new(err.code, { argument = option, capability = err.capability, detail = err.detail })
end

local commands = {}
local order = {}

local function command(name, summary, usage, fn)
  commands[name] = { summary = summary, usage = usage, run = fn }
  order[#order + 1] = name
end

command("help", "list the commands, or explain one",
  "corral help [COMMAND]",
  function(argv)
    local name = argv[2]
    if name then
      local c = commands[name]
      if not c then return fail("help", errors.invalid_argument("COMMAND", "no command " .. name)) end
      io.write(c.usage, "\n\n", c.summary, "\n")
      return 0
    end
    io.write("corral — process confinement with a C core and Lua policy\n\n")
    io.write("usage: corral COMMAND [ARGS]   |   corral [lua options] [script [args]]\n\n")
    for _, n in ipairs(order) do io.write(string.format("  %-14s %s\n", n, commands[n].summary)) end
    io.write("\n`corral help COMMAND` explains one; `corral` alone opens a REPL.\n")
    return 0
  end)

command("confine", "confine a trusted process to one directory (control-plane profile)",
  [[corral confine --permit DIR [--extra DIR]... [--cd DIR] [--json] [--exec] -- CMD ARGS...

Builds the launch spec of the control-plane profile: CMD may read and write DIR (and
each --extra) and nothing else outside the runtime (read-only); the environment passes
through unmodified, credential included; egress stays permitted. Prints the spec (the
command to run is the confinement wrapper); environment values are never printed, only
the names. --exec runs it instead and exits with the command's status. On Linux the
spec names the layers that hold here: ns (mount+pid namespace; bwrap when only
bubblewrap can build it) and landlock.
Exit 2: an invalid argument; 3: this host cannot enforce the confinement.]],
  function(argv)
    local opts, rest = M.parse(argv, { permit = "value", extra = "list", cd = "value",
                                       json = "flag", exec = "flag" })
    if not opts then return fail("confine", rest) end
    if #rest == 0 then
      return fail("confine", errors.invalid_argument("CMD", "missing (after --)"))
    end
    local cmdargs = { table.unpack(rest, 2) }
    if opts.exec then
      -- The wrapper refuses an inherited directory on 0-2 (it leads out past both
      -- layers); say so here, as the argument error it is, before any probe runs.
      for fd = 0, 2 do
        local st = core.lstat("/proc/self/fd/" .. fd .. "/.")
        if st and st.type == "dir" then
          return fail("confine", errors.invalid_argument("fd " .. fd,
            "is a directory; an inherited directory would lead out of the boundary"))
        end
      end
    end
    local confinement = require "corral.confinement"
    local spec, err = confinement.confine({ rest[1], cmdargs }, {
      permit_path = opts.permit, permit_extra_subpaths = opts.extra, cd = opts.cd,
      env = core.environ(),
    })
    if not spec then return fail("confine", err) end
    if spec.layers and #spec.layers < 2 then
      io.stderr:write("corral confine: warning: only the ", table.concat(spec.layers, ", "),
        " layer holds on this host; ", spec.layers[1] == "landlock"
          and "without the namespace layer, metadata changes (chmod, chown, utime), unix sockets and " ..
              "host processes outside the boundary stay reachable"
          or "without Landlock, magic links and inherited directory fds are not covered",
        " (corral probe shows why)\n")
    end
    if opts.exec then
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
  end)

command("sbpl", "print the macOS sandbox-exec profile for a boundary",
  [[corral sbpl --permit DIR [--extra DIR]...

Emits the SBPL deny-default profile the control-plane confinement uses on macOS, with
DIR and each --extra resolved first (SBPL matches resolved paths; a grant written
against a symlink silently never matches).]],
  function(argv)
    local opts, rest = M.parse(argv, { permit = "value", extra = "list" })
    if not opts then return fail("sbpl", rest) end
    if #rest > 0 then return fail("sbpl", errors.invalid_argument(rest[1], "unexpected argument")) end
    local spec, err = require("corral.confinement").sandbox_exec_spec({ "/bin/sh" },
      { permit_path = opts.permit, permit_extra_subpaths = opts.extra })
    if not spec then return fail("sbpl", err) end
    io.write(spec.profile)
    if spec.profile:sub(-1) ~= "\n" then io.write("\n") end
    return 0
  end)

command("resolve", "resolve a command the way the kernel will",
  [[corral resolve CMD

A bare name through PATH, then every symlink component by component. A name not on
PATH is printed unchanged (the exec would earn the OS's own error).]],
  function(argv)
    if #argv ~= 2 then return fail("resolve", errors.invalid_argument("CMD", "exactly one is needed")) end
    local r, err = core.resolve_executable(argv[2])
    if not r then return fail("resolve", err) end
    io.write(r, "\n")
    return 0
  end)

command("probe", "establish which protections hold on this host, by doing them",
  [[corral probe [--json]

Each capability runs a control that must succeed and then the breach that must be
denied. Prints capability, holds/absent, the detail measured, and what it gates.]],
  function(argv)
    local opts, rest = M.parse(argv, { json = "flag" })
    if not opts then return fail("probe", rest) end
    local results = require("corral.capability").probe()
    if opts.json then
      io.write(json().encode(results), "\n")
      return 0
    end
    for _, r in ipairs(results) do
      io.write(string.format("%-26s %-7s %s%s\n", r.name, r.holds and "holds" or "absent",
        r.detail, #r.gates > 0 and ("  [gates: " .. table.concat(r.gates, ", ") .. "]") or ""))
    end
    return 0
  end)

command("run", "run a tenant command in a sandbox (credentials stripped, no network)",
  [[corral run [--mechanism native|bwrap|FILE.lua] [--id ID] [--storage DIR] [--workspace DIR]
           [--memory 256M] [--pids 64] [--cpu 0.5] [--wall 30s] [--fsize 1G] [--nofile 256]
           [--env NAME]... [--allow ENTRY]... [--allow-file FILE] [--internal CIDR]...
           [--resolve NAME=ADDR]... [--service-port N] [--log-json FILE]
           [--link NETNS,ADDR/PREFIX,GATEWAY,PEER/PREFIX]
           [--idle DURATION] [--max-connections N] [--sni match|require|off] [--learn FILE]
           [--verbose] -- CMD ARGS...

Runs CMD as an untrusted tenant: root of its own user namespace mapped to an unprivileged
host id, its storage read-write at /storage (DIR, or a temporary directory removed
afterwards; corral creates DIR, or it must already belong to the sandbox's host id),
--workspace at /workspace, the runtime read-only, no network at all, host processes invisible, every capability
dropped, the tenant seccomp filter. The environment starts from PATH HOME LANG TERM TZ;
--env NAME adds the caller's NAME, unless it is credential-shaped (refused by name).
Egress: --allow ENTRY (pypi.org:443, *.pythonhosted.org:443, 10.20.0.0/16:5432,
[2001:db8::1]:22; no port = any) lets the tenant connect there — any program, any TCP
port, no proxy variables: its DNS gets synthetic addresses for allowed names and
NXDOMAIN for the rest; TCP to a port no entry names is reset at the connect (when
every entry names its ports), and every other connection is decided by the host,
resolved on the host and relayed. --allow-file reads one entry per line (# comments). --internal CIDR admits
a private range that an allowed name resolves into. --resolve NAME=ADDR answers the
host-side resolution of NAME from this table instead of the host's resolver. Every
decision is written as a JSON line to --log-json. --service-port N relays a kernel-chosen
port on 127.0.0.1 to port N inside (printed on stderr). --link gives the sandbox its own
routed link (a veth into network namespace NETNS, a name under /run/netns or a path;
PEER/PREFIX, the address given to its far end, may be left out):
permitted connections then leave from the sandbox's netns through it, on mark-checked
sockets, instead of from the host's.
A name's addresses are all tried (IPv6 first, then raced, as RFC 8305 asks) within the
connect timeout. --idle DURATION (90s, 10m, 2h; default none) cuts a connection that
moved no byte for that long; TCP keepalive runs on both legs, so a dead end is noticed
either way. --max-connections N (default 4096) caps a sandbox's concurrent
connections; each costs the host two sockets (about 7 KiB of kernel memory idle), under
1 KiB of its own and six fds, plus up to 512 KiB of pipe only while bytes wait in it.
--sni (default match): on a connection to an allowed name, a TLS SNI or HTTP Host
naming another host is reset (domain fronting); require also refuses one naming none.
An --allow entry may be a URL (https://api.test is api.test:443). --learn FILE answers
every name the program asks for, denies (and records) every connection not allowed, and
writes the suggested allowlist to FILE for --allow-file.
At the end of the run, what was denied and which connections failed upstream are
summarised on stderr with the option that would change them; --verbose prints each as
it first happens.
Exit status: the command's own (128+N when killed by signal N; under native 127 when
it is not found and 126 when it cannot be executed, which bubblewrap reports as 1); 121
when the memory cap ended it; 124 when --wall did; 120 when the sandbox could not start;
2 for an invalid argument or a refused variable; 3 when this host cannot enforce a
protection. A command can exit with these numbers itself: corral's own say so on stderr.
/workspace is bound read-write, and writable where DIR's permissions let the sandbox's
host id write (its storage is always its own). A terminal on stdin/stdout/stderr is put
back as it was after the run.]],
  function(argv)
    local opts, rest = M.parse(argv, { mechanism = "value", id = "value", storage = "value",
      workspace = "value", memory = "value", pids = "value", cpu = "value", wall = "value",
      fsize = "value", nofile = "value", env = "list", allow = "list", ["allow-file"] = "value",
      internal = "list", resolve = "list", ["service-port"] = "value", ["log-json"] = "value",
      link = "value",
      idle = "value", ["max-connections"] = "value", verbose = "flag", -- egress/run_options, egress/summary
      sni = "value", learn = "value" }) -- egress/run_options, egress/learn
    if not opts then return fail("run", rest) end
    if #rest == 0 then return fail("run", errors.invalid_argument("CMD", "missing (after --)")) end
    local corral = require "corral"
    local mech, merr = corral.mechanism.load(opts.mechanism or "native")
    if not mech then return fail("run", merr) end
    local limits = {}
    for _, k in ipairs({ "memory", "fsize", "wall" }) do limits[k] = opts[k] end
    for _, k in ipairs({ "pids", "nofile" }) do
      if opts[k] then
        limits[k] = math.tointeger(tonumber(opts[k]))
        if not limits[k] then return fail("run", errors.invalid_argument("--" .. k, "must be an integer")) end
      end
    end
    if opts.cpu then
      limits.cpu = tonumber(opts.cpu)
      if not limits.cpu then return fail("run", errors.invalid_argument("--cpu", "must be a number of cores")) end
    end
    local env = {}
    local host_env = core.environ()
    for _, name in ipairs(opts.env) do
      if host_env[name] == nil then
        return fail("run", errors.invalid_argument("--env", name .. " is not set in this environment"))
      end
      env[name] = host_env[name]
    end
    local temp
    local root, id
    id = opts.id
    if opts.storage then
      -- DIR may not exist yet (corral creates it); its parent must, and is resolved.
      local parent, base = opts.storage:gsub("/+$", ""):match("^(.*)/([^/]+)$")
      if opts.storage:sub(1, 1) ~= "/" then
        return fail("run", errors.invalid_argument("--storage", opts.storage .. ": must be an absolute path"))
      end
      if not parent or base == "." or base == ".." then
        return fail("run", errors.invalid_argument("--storage", opts.storage ..
          ": must name a directory below /, ending in its own name (not . or ..)"))
      end
      local dir, err = core.resolve_path(parent == "" and "/" or parent)
      if not dir then return fail("run", errors.invalid_argument("--storage", err)) end
      if opts.id and opts.id ~= base then
        return fail("run", errors.invalid_argument("--id", "the sandbox's id is --storage's last component (" ..
          base .. "); give one of --id and --storage"))
      end
      root, id = dir, base
    end
    local network, nerr = M.network_options(opts)
    if nerr then return fail("run", nerr) end
    network, nerr = require("corral.egress.run_options").apply(network, opts)
    if nerr then return fail("run", nerr) end
    if opts.learn then -- egress/learn
      local _, lerr = require("corral.egress.learn").check(opts.learn)
      if lerr then return fail("run", lerr) end
    end
    local service_port
    if opts["service-port"] then
      service_port = math.tointeger(tonumber(opts["service-port"]))
      if not service_port then
        return fail("run", errors.invalid_argument("--service-port", "must be a port number"))
      end
    end
    -- The temporary storage comes last, once every option has been checked: an invalid
    -- one must leave nothing behind.
    local function new_temp()
      temp = assert(core.mkdtemp("/tmp/corral-run-" .. core.getpid() .. "-"))
      core.chmod(temp, tonumber("711", 8))
      root, id = temp, opts.id or "tenant"
    end
    if not opts.storage then
      M.sweep_stale_runs()
      new_temp()
    end
    local function describe()
      return corral.sandbox({ id = id, storage_root = root, workspace_path = opts.workspace,
        env = env, limits = limits, network = network, service_port = service_port })
    end
    local sb, err = describe()
    local function cleanup()
      if not temp then return end
      local ok, rerr = core.remove_tree(temp)
      if not ok then
        io.stderr:write("corral run: warning: temporary storage ", temp, " not removed: ", tostring(rerr), "\n")
      end
    end
    if not sb then cleanup() return fail("run", M.as_option(err, opts)) end
    local log_close
    if opts["log-json"] then
      local events = require "corral.egress.events"
      local writer, closer = events.json_lines_writer(opts["log-json"])
      if not writer then
        cleanup()
        return fail("run", errors.invalid_argument("--log-json", tostring(closer)))
      end
      events.subscribe(writer)
      log_close = closer
    end
    local summary = network and require("corral.egress.summary").start({ verbose = opts.verbose })
    local learner = opts.learn and require("corral.egress.learn").start(opts.learn) -- egress/learn
    local ok, perr = corral.provision(mech, sb)
    -- A temporary storage whose host id another process holds (sandbox.host_id_holder,
    -- rare): a fresh directory gives another id.
    for _ = 1, 3 do
      if ok or not (temp and type(perr) == "table" and perr.held_by) then break end
      cleanup()
      new_temp()
      sb, err = describe()
      if not sb then cleanup() return fail("run", M.as_option(err, opts)) end
      ok, perr = corral.provision(mech, sb)
    end
    if not ok then cleanup() return fail("run", M.as_option(perr, opts)) end
    local _, addr = corral.address(mech, sb)
    if addr then io.stderr:write("corral run: service port ", service_port, " on ", addr, "\n") end
    -- Ctrl-C, SIGTERM and SIGHUP go to the sandbox (its init forwards them), and this
    -- process stays to clean up; dying here would leave the cgroup behind.
    -- Only the built-in mechanisms read them (and start their children with a clean
    -- mask): a blocked signal would otherwise pass, blocked, to a custom mechanism's
    -- children, since exec keeps the signal mask.
    local builtin = mech.name == "native" or mech.name == "bwrap"
    local signals = builtin and core.signal_fd({ "INT", "TERM", "HUP" }) or nil
    -- The terminal the tenant may share is put back as it was found.
    local ttys = {}
    for fd = 0, 2 do ttys[fd] = core.tty_save(fd) end
    local result, xerr = corral.exec(mech, sb, rest, { signals = signals })
    for fd = 0, 2 do
      if ttys[fd] then core.tty_restore(fd, ttys[fd]) end
    end
    if signals then signals:close() end
    corral.destroy(mech, sb)
    cleanup()
    if summary then summary.finish() end
    if learner then -- egress/learn
      local ok_l, n = learner.finish()
      io.stderr:write("corral run: --learn: ", ok_l and (n .. " entries written to " .. opts.learn)
        or ("not written: " .. tostring(n)), "\n")
    end
    if log_close then log_close() end
    if not result then
      io.stderr:write("corral run: ", tostring(xerr), "\n")
      return errors.is(xerr, "cannot_enforce") and 120 or EXIT_USAGE
    end
    if result.error then io.stderr:write("corral run: ", result.error, "\n") end
    if result.limit == "memory" then
      io.stderr:write("corral run: the memory cap ended the sandbox\n")
      return 121
    elseif result.limit == "wall" then
      io.stderr:write("corral run: the wall-clock limit ended the sandbox\n")
      return 124
    end
    return result.code
  end)

local tier_cli = require "corral.tier.cli"
command("step", tier_cli.SUMMARY, tier_cli.USAGE,
  function(argv) return tier_cli.run(argv, M.parse, fail) end)

command("exec-confined", "(internal) the confinement wrapper a launch spec runs",
  [[corral exec-confined --permit DIR [--extra DIR]... [--cd DIR] [--layers L] -- CMD ARGS...

The wrapper named by `corral confine` specs, run in C before any Lua state exists.
L is ns or bwrap (the namespace layer, built by corral or by bubblewrap), landlock, or
one of each joined by a comma (default ns,landlock).
Every layer named in --layers must be built or nothing runs (exit 125).]],
  function()
    -- Reached only if the host's C fast path was bypassed (e.g. via corral.cli.main).
    return fail("exec-confined", "must be run as `corral exec-confined`")
  end)

command("conformance", "run the conformance suite against a mechanism (held / breached / unavailable / void)",
  require("corral.conformance.cli").USAGE, function(argv)
    return require("corral.conformance.cli").run(argv, { parse = M.parse, fail = fail, json = json })
  end)

--- Whether `name` is a subcommand.
-- @tparam string name
-- @treturn boolean
function M.is_command(name)
  return commands[name] ~= nil
end

--- Runs a subcommand; `argv[1]` is its name.
-- @tparam {string,...} argv
-- @treturn integer exit status
function M.main(argv)
  local c = commands[argv[1]]
  if not c then return fail("", errors.invalid_argument("COMMAND", "no command " .. tostring(argv[1]))) end
  local ok, status = xpcall(c.run, debug.traceback, argv)
  if not ok then
    io.stderr:write("corral ", argv[1], ": ", tostring(status), "\n")
    return 1
  end
  return status
end

--- Registers a subcommand (later modules add theirs: run, …).
-- @tparam string name
-- @tparam string summary
-- @tparam string usage
-- @tparam function fn receives argv, returns an exit status
M.register = command

return M
