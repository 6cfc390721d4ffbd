--- `corral confine` and `corral sbpl`: their options, usage and handlers; the profile
-- itself is corral.confinement's.
--
-- Registered by corral.cli, which hands each handler its parser and failure printer.
-- @module corral.confinement.cli
local core = require "corral.core"
local errors = require "corral.errors"
local shell = require "corral.shell"

local M = {}

-- The confine flag a corral.confinement argument came from: the error names what the
-- user typed (`--permit`), never the Lua field (`permit_path`).
local CONFINE_FLAGS = { permit_path = "--permit", cd = "--cd", layers = "--layers", cmd = "CMD" }
local LIST_FLAGS = { permit_extra_subpaths = "--extra", read_only = "--read-only", writable = "--writable" }
local function confine_flag(argument)
  local field, n = argument:match("^([%w_]+)%[(%d+)%]$")
  if field and LIST_FLAGS[field] then return LIST_FLAGS[field] .. " (#" .. n .. ")" end
  return CONFINE_FLAGS[argument] or argument
end

--- `corral confine`'s option groups (corral.cli's `{title, {option, ...}}`).
M.CONFINE_OPTIONS = {
  { "Boundary", {
    { "permit", "value", "DIR", "the one directory CMD may read and write (required)" },
    { "extra", "list", "PATH", "another directory it may read and write, or one file (read-only) or unix " ..
      "socket (to connect to) granted alone" },
    { "cd", "value", "DIR", "its working directory, inside the boundary (default: DIR)" },
    { "layers", "value", "L", "ns, bwrap or landlock, or one of each: ns,landlock (default: all that hold)" },
  } },
  { "Read-only inside the boundary (git hooks and config, .envrc, .vscode, shell rc files...)", {
    { "read-only", "list", "PATH", "also keep PATH (a file or directory inside the boundary) read-only" },
    { "writable", "list", "PATH", "drop the default read-only paths at or beneath PATH" },
  } },
  { "Output", {
    { "json", "flag", nil, "print the spec as JSON" },
    { "exec", "flag", nil, "run the spec instead, exiting with the command's status" },
    { "broker", "flag", nil, "with --exec: stay outside as a broker, so that CMD's `corral run` gets real " ..
      "sandboxes (only within CMD's own boundary and limits)" },
  } },
}

--- `corral confine`'s usage text.
M.CONFINE_USAGE = "corral confine --permit DIR [--extra PATH]... [--cd DIR] [--layers L] [--read-only PATH]... " ..
  "[--writable PATH]... [--json] [--exec] [--broker] -- CMD ARGS...\n" .. [[

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

Read-only inside the boundary: what runs code later on the operator's behalf stays
read-only - in every git repository (the top of DIR and each --extra directory, and any
up to 3 levels beneath): .git/hooks, .git/config, submodules' config and hooks, .envrc,
.vscode, .idea, .devcontainer(.json), .npmrc, .yarnrc(.yml); at the top of DIR and each
--extra directory also the shell rc files (.bashrc .bash_profile .bash_login .bash_logout
.profile .zshenv .zshrc .zprofile .zlogin .zlogout .kshrc .cshrc .tcshrc .login .logout
.config/fish), .gitconfig, .config/git and .ssh. --read-only PATH adds one, --writable
PATH drops the defaults at or beneath it; both inside the boundary. The ns and bwrap
layers bind each read-only and pin the directories on its way (no rename, no removal);
Landlock alone cannot take a path out of the tree it grants: there they stay writable (a
warning says so) and --read-only is refused. A protected name that does not exist is not
protected (made inside, it is writable); the spec lists what is held and what is not.

Sandboxes inside: CMD may build narrower ones (unshare -Ur, unshare -Urn, corral
confine or exec-confined with a --permit inside DIR); none reaches past DIR. Landlock
refuses mount(2) to every process it restricts, so a tool that builds a mount namespace
(bubblewrap: "Failed to make / slave: Operation not permitted") runs only under a mode
without it: --layers ns (or bwrap) keeps the namespace boundary and loses what Landlock
adds (magic links and inherited directory fds are then not covered). Under landlock
alone, a nested user namespace can map ids only for CMD itself (its own /proc/PID is
granted, not its children's), and not uid 0 for a root caller: that needs CAP_SETFCAP
in the host's user namespace, which is never kept.
With --broker (and --exec) this corral stays outside as CMD's broker: CMD's own `corral
run` (create, exec, rm, ls, policy) is sent to it through a socket that only CMD's root
shows (CORRAL_BROKER names it) and runs as a real sandbox, granted only storage,
workspace and files inside DIR and the --extra directories and limits no larger than
CMD's own; a mechanism file, --engine, --link, --receipt and --disk are refused. At most
8 requests at once and 16 live sessions; what CMD left running is ended with it. corral's
own code inside the boundary is kept read-only (the ns or bwrap layer; under Landlock
alone --broker refuses) (docs/sessions.md).
Exit 2: an invalid argument; 3: this host cannot enforce the confinement; with --exec,
the command's status (127 when it is not found, 126 when it cannot be executed).]]

--- Runs `corral confine`.
-- @tparam {string,...} argv
-- @tparam table cli `parse(argv)` (against `CONFINE_OPTIONS`), `fail(cmd, err)`,
--   `missing_command(cmd)` and `json()` (corral.cli's)
-- @treturn integer exit status
function M.confine(argv, cli)
  local opts, rest = cli.parse(argv)
  if not opts then return cli.fail("confine", rest) end
  if #rest == 0 then
    return cli.fail("confine", errors.invalid_argument("CMD", "missing (after --)"))
  end
  local cmdargs = { table.unpack(rest, 2) }
  if opts.exec then
    -- an inherited directory on 0-2 leads out past both layers: refused as the argument
    -- error it is, before any probe runs
    for fd = 0, 2 do
      local st = core.fs.lstat("/proc/self/fd/" .. fd .. "/.")
      if st and st.type == "dir" then
        return cli.fail("confine", errors.invalid_argument("fd " .. fd,
          "is a directory; an inherited directory would lead out of the boundary"))
      end
    end
  end
  if opts.broker and not opts.exec then
    return cli.fail("confine", errors.invalid_argument("--broker", "needs --exec (the broker is the process that " ..
      "runs the command)"))
  end
  local confinement = require "corral.confinement"
  local function make_spec(broker_socket)
    local env, extra = core.proc.environ(), opts.extra
    env.CORRAL_BROKER = broker_socket
    if broker_socket then extra = { broker_socket, table.unpack(opts.extra) } end
    local function confine(read_only)
      return confinement.confine({ rest[1], cmdargs }, {
        permit_path = opts.permit, permit_extra_subpaths = extra, cd = opts.cd, env = env, layers = opts.layers,
        read_only = read_only, writable = opts.writable,
      })
    end
    local spec, err = confine(opts["read-only"])
    if spec and opts.broker then
      -- corral's own code inside the boundary: read-only, or no broker (corral.broker.own_code)
      local roots = { opts.permit, table.unpack(opts.extra) }
      local code, cerr = require("corral.broker.own_code").read_only(roots, spec.layers)
      if not code then return nil, cerr end
      if #code > 0 then spec, err = confine(table.move(code, 1, #code, #opts["read-only"] + 1,
        { table.unpack(opts["read-only"]) })) end
    end
    if not spec then
      if type(err) == "table" and err.argument then
        err.argument = confine_flag(err.argument)
        -- the broker's socket is the first --extra: the user's are numbered from 1
        local n = broker_socket and err.argument:match("^%-%-extra %(#(%d+)%)$")
        if n then err.argument = "--extra (#" .. (tonumber(n) - 1) .. ")" end
      end
      return nil, err
    end
    return spec
  end
  local spec, err = make_spec(nil)
  if not spec then return cli.fail("confine", err) end
  if spec.layers and #spec.layers < 2 then
    io.stderr:write("corral confine: warning: only the ", table.concat(spec.layers, ", "),
      opts.layers and " layer, as --layers asks; " or " layer holds on this host; ", spec.layers[1] == "landlock"
        and "without the namespace layer, metadata changes (chmod, chown, utime), unix sockets and " ..
            "host processes outside the boundary stay reachable, and a root caller's sandboxes inside " ..
            "cannot map uid 0"
        or "without Landlock, magic links and inherited directory fds are not covered",
      opts.layers and "\n" or " (corral probe shows why)\n")
  end
  local ro = spec.read_only
  if ro and not ro.held and #ro.paths > 0 then
    io.stderr:write("corral confine: warning: ", #ro.paths, " read-only path(s) stay writable (",
      ro.paths[1], #ro.paths > 1 and ", ..." or "", "): ", ro.why, "\n")
  end
  if opts.exec then
    local status, why = cli.missing_command(rest[1])
    if status then
      io.stderr:write("corral confine: ", why, "\n")
      return status
    end
    if opts.broker then
      local code, berr = require("corral.broker.server").keep(make_spec, confinement.exec)
      if not code then return cli.fail("confine", berr) end
      return code
    end
    local _, msg = confinement.exec(spec)
    return cli.fail("confine", msg)
  end
  local names = {}
  for i, pair in ipairs(spec.env) do names[i] = pair[1] end
  if opts.json then
    io.write(cli.json().encode({ cmd = spec.cmd, args = spec.args, cd = spec.cd,
      layers = spec.layers, env_names = names, read_only = spec.read_only }), "\n")
  else
    io.write("cmd:    ", spec.cmd, "\n")
    io.write("args:   ", shell.join(spec.args), "\n")
    io.write("cd:     ", spec.cd, "\n")
    io.write("layers: ", table.concat(spec.layers, ", "), "\n")
    io.write("env:    ", #names, " variables passed through unmodified (values not shown)\n")
    if spec.read_only then M.print_read_only(spec.read_only) end
  end
  return 0
end

--- Prints a spec's read-only paths: those held (or not, and why), those that could not
-- be, and how many protected names are absent (an agent may create them).
-- @tparam table ro the spec's `read_only`
function M.print_read_only(ro)
  local label = ro.held and "read-only: " or "writable (not held): "
  for i, p in ipairs(ro.paths) do io.write(i == 1 and label or string.rep(" ", #label), p, "\n") end
  if #ro.paths == 0 then io.write("read-only: none found\n") end
  if ro.why then io.write("  why: ", ro.why, "\n") end
  for _, u in ipairs(ro.unprotected) do io.write("not protected: ", u.path, " (", u.why, ")\n") end
  if ro.stopped then
    io.write("search: stopped at its bound; repositories deeper or further on are not protected\n")
  end
  io.write("absent: ", #ro.absent, " protected names do not exist; made inside, they are writable ",
    "(--json lists them)\n")
end

--- `corral sbpl`'s option groups.
M.SBPL_OPTIONS = {
  { "Boundary", {
    { "permit", "value", "DIR", "the directory the profile permits (required)" },
    { "extra", "list", "PATH", "another directory it permits, or one file (read) or unix socket (connect)" },
  } },
}

--- `corral sbpl`'s usage text.
M.SBPL_USAGE = [[corral sbpl --permit DIR [--extra PATH]...

Emits the SBPL deny-default profile the control-plane confinement uses on macOS, with
DIR and each --extra resolved first (SBPL matches resolved paths; a grant written
against a symlink silently never matches).]]

--- Runs `corral sbpl`.
-- @tparam {string,...} argv
-- @tparam table cli `parse(argv)` (against `SBPL_OPTIONS`), `fail(cmd, err)`
-- @treturn integer exit status
function M.sbpl(argv, cli)
  local opts, rest = cli.parse(argv)
  if not opts then return cli.fail("sbpl", rest) end
  if #rest > 0 then return cli.fail("sbpl", errors.invalid_argument(rest[1], "unexpected argument")) end
  local spec, err = require("corral.confinement").sandbox_exec_spec({ "/bin/sh" },
    { permit_path = opts.permit, permit_extra_subpaths = opts.extra })
  if not spec then
    if type(err) == "table" and err.argument then err.argument = confine_flag(err.argument) end
    return cli.fail("sbpl", err)
  end
  io.write(spec.profile)
  if spec.profile:sub(-1) ~= "\n" then io.write("\n") end
  return 0
end

return M
