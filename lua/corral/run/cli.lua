--- `corral run`: its options, its usage and its handler, which turns the flags into
-- corral.run's request (the run itself is that module's).
--
-- Registered by corral.cli, which hands the handler its parser and failure printer.
-- @module corral.run.cli
local errors = require "corral.errors"

local M = {}

-- The flag or operand each corral.run argument comes from: a refusal names what the
-- user typed, never the Lua field.
local OPTION_NAMES = { storage = "--storage", id = "--id", workspace_path = "--workspace", env = "--env",
                       service_port = "--service-port", network = "--allow", log_json = "--log-json",
                       learn = "--learn", mechanism = "--mechanism", argv = "CMD" }
for _, k in ipairs({ "memory", "pids", "cpu", "wall", "fsize", "nofile", "disk" }) do
  OPTION_NAMES["limits." .. k] = "--" .. k
end
OPTION_NAMES.engine = "--engine"
OPTION_NAMES["network.max_connections"] = "--max-connections"

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

--- The option groups (corral.cli's `{title, {option, ...}}`). --idle, --max-connections
-- and --verbose are read by corral.egress.run_options and corral.egress.summary.
M.OPTIONS = {
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
    { "secret", "list", "NAME@HOST[:PORT][,HOST...]", "NAME holds a stand-in; the value (corral's $NAME) "
      .. "is put into request headers toward HOST only (TLS terminated there)" },
    { "secret-file", "list", "NAME=PATH@HOST[:PORT][,HOST...]", "as --secret, the value read from PATH "
      .. "(a 0600 file of yours)" },
    { "ca-file", "value", "FILE", "with --secret: trust FILE's CA for the bound hosts, besides the host's store" },
  } },
  { "Network and egress", {
    { "allow", "list", "ENTRY", "may connect there: pypi.org:443, *.pythonhosted.org, 10.0.0.0/8:5432, "
      .. "udp:ntp.test:123; https://HOST/PATH[*] on a --secret host: only those paths" },
    { "allow-file", "value", "FILE", "--allow entries from FILE, one per line (# comments)" },
    { "upstream-proxy", "value", "URL", "http://HOST:PORT: every relayed connection through its CONNECT "
      .. "(asked for the address corral checked)" },
    { "method", "value", "M[,M...]", "with --secret: requests on its hosts use one of these methods, e.g. GET,HEAD" },
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
    { "receipt", "value", "FILE", "write a signed receipt of the run to FILE (docs/receipts.md; `corral verify`)" },
  } },
}

--- The usage text.
M.USAGE = [[corral run [OPTIONS] -- CMD ARGS...

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

--secret NAME@HOST[:PORT][,HOST...] (the value from corral's own $NAME; --secret-file
NAME=PATH@HOST... from a 0600 file of yours) gives the tenant NAME holding a stand-in of
the same shape; TLS to each HOST (port 443 unless written) is terminated under a per-run
CA the tenant trusts, every HTTP/1.1 request on it must name HOST, and the value replaces
the stand-in in request headers only. The stand-in in a URL, a body, a header toward
another host, plain HTTP or a DNS name is refused (403 where a request is visible) and
logged as a leak. Upstream certificates are verified against the host's store
(--ca-file FILE adds a CA). README.md, "Secrets the tenant never holds".

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
memory cap ended it; 124 when --wall did; 120 when the sandbox could not start, or
a resource ran out for a moment (file descriptors, memory, disk space: "setup failed",
not a protection this host lacks); 122 when the mechanism could not tear it down; 2 for an invalid argument or a refused
variable; 3 when this host cannot enforce a protection. A command can exit with these
numbers itself: corral's own say so on stderr.]]

-- Under a broker, the files its checks granted are opened again here with no symlink
-- followed and used through their fds (corral.broker.boundary): one swapped after the
-- broker's check is refused, not followed out of the agent's boundary.
local function pin_brokered(opts)
  local boundary = require "corral.broker.boundary"
  if boundary.get() then
    boundary.grant("storage", opts.storage)
    boundary.grant("workspace", opts.workspace)
  end
  local ways = { ["allow-file"] = boundary.file, ["log-json"] = boundary.child, learn = boundary.child }
  for flag, way in pairs(ways) do
    if opts[flag] and opts[flag] ~= "-" then
      local at, err = way("--" .. flag, opts[flag])
      if not at then return nil, err end
      opts[flag] = at
    end
  end
  return true
end

--- The corral.run request the flags say (every value checked, each refusal naming its
-- flag), and the caller's name of each argument (corral.run.steps' `names`). Shared by
-- `corral run` and `corral create` (corral.session.cli).
-- @tparam table opts the parsed flags
-- @tparam {string,...} argv the command (create: none)
-- @treturn[1] table the request
-- @treturn[1] table the names
-- @return[2] nil
-- @treturn[2] table the refusal
function M.request(opts, argv)
  local pinned, perr = pin_brokered(opts)
  if not pinned then return nil, perr end
  local run_options = require "corral.egress.run_options"
  local network, nerr = run_options.network(opts)
  if nerr then return nil, nerr end
  network, nerr = run_options.apply(network, opts)
  if nerr then return nil, nerr end
  network, nerr = run_options.secrets(network, opts)
  if nerr then return nil, nerr end
  local meant, cerr = run_options.combination(network, opts)
  if not meant then return nil, cerr end
  local there, terr = run_options.link_namespace(network)
  if not there then return nil, terr end
  if opts.learn then
    local _, lerr = require("corral.egress.learn").check(opts.learn)
    if lerr then return nil, lerr end
  end
  return {
    argv = argv, mechanism = opts.mechanism, id = opts.id, storage = opts.storage, workspace = opts.workspace,
    limits = { memory = opts.memory, pids = opts.pids, cpu = opts.cpu, wall = opts.wall, fsize = opts.fsize,
               nofile = opts.nofile, disk = opts.disk },
    env = opts.env, network = network, service_port = opts["service-port"], log_json = opts["log-json"],
    verbose = opts.verbose, engine = opts.engine, learn = opts.learn,
  }, setmetatable({ network = network_flag(opts) }, { __index = OPTION_NAMES })
end

--- Runs `corral run`.
-- @tparam {string,...} argv
-- @tparam table cli `parse(argv)` (corral.cli.parse against `OPTIONS`), `fail(cmd, err)`
-- @treturn integer exit status
function M.run(argv, cli)
  local opts, rest = cli.parse(argv)
  if not opts then return cli.fail("run", rest) end
  if #rest == 0 then return cli.fail("run", errors.invalid_argument("CMD", "missing (after --)")) end
  local req, names = M.request(opts, rest)
  if not req then return cli.fail("run", names) end
  local witness, werr
  if opts.receipt then
    local receipts = require "corral.receipt.run"
    witness, werr = receipts.witness(opts.receipt, rest)
    if not witness then return cli.fail("run", receipts.flagged(werr)) end
  end
  local status, err = require("corral.run").execute(req, { names = names, clear_environment = true,
    witness = witness, say = function(line) io.stderr:write("corral run: ", line, "\n") end })
  if not status then return cli.fail("run", err) end
  return status
end

return M
