-- corral-runtime under real engines: podman (`--runtime`) and a containerd this spec
-- starts on a socket of its own (`ctr run --runc-binary`). A container annotated
-- corral.dev/allow reaches its allowed name (the control, after the attempts) and
-- nothing else: a name, a port and an IP literal not allowed are refused in under 0.1 s
-- and the test server never sees them; the decisions are logged; delete leaves no
-- keeper, netns, state directory or control socket. A keeper killed leaves its container
-- with no network at all. Malformed annotations are refused naming them.
local h = require "helpers"
local internet = require "internet"
local json = require "dkjson"

local RUNTIME = h.host:gsub("[^/]*$", "") .. "corral-runtime"
local is_root = h.sh("id -u"):match("^0") ~= nil

local function have(cmd) return select(2, h.sh("command -v " .. cmd .. " >/dev/null")) == 0 end

-- Why this host cannot run the engine tests, or nil.
local built = select(2, h.sh("test -x " .. h.quote(RUNTIME))) == 0

local function missing(engine)
  if not built then return "no corral-runtime beside " .. h.host .. " (make all links it)" end
  if not is_root then return "needs root (an engine and a netns of the runtime's own)" end
  if not (have("runc") or have("crun")) then return "neither runc nor crun is installed" end
  if not have("nft") then return "nftables is not installed" end
  if not have(engine) then return engine .. " is not installed" end
end

-- The client run inside a container: each destination attempted in order, one JSON line
-- each: what happened and how long it took.
local CLIENT = [[
import json, socket, sys, time
for dest in sys.argv[1:]:
    host, port = dest.rsplit(":", 1)
    t = time.monotonic()
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        got = "connected:" + s.recv(100).decode().strip()
        s.close()
    except Exception as e:
        got = "refused:" + type(e).__name__
    print(json.dumps({"dest": dest, "got": got, "seconds": time.monotonic() - t}), flush=True)
]]

-- A server that logs each connection it accepts and greets it, on each port given.
local SERVER = [[
import socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, peer = s.accept(); log.write("%d %s\n" % (port, peer[0])); c.sendall(b"hello-%d\n" % port); c.close()
for p in sys.argv[2:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
open(sys.argv[1] + ".up", "w").close()
threading.Event().wait()
]]

describe("corral-runtime #root #netns", function()
  local net, dir, allowed, denied_port

  -- Every file of a keeper, its netns and its control socket are gone.
  local function assert_nothing_left(root, id, keeper)
    assert.is_nil(h.read(root .. "/" .. id .. "/keeper"), "state directory left")
    assert.is_falsy(io.open(root .. "/" .. id), root .. "/" .. id .. " left")
    if keeper then
      assert.truthy(h.wait_for(function() return not io.open("/proc/" .. keeper.pid .. "/stat") end, 5),
        "keeper " .. keeper.pid .. " still running")
      local holders = h.sh("find /proc/[0-9]*/ns/net /proc/[0-9]*/fd -maxdepth 1 -lname " .. h.quote(keeper.netns)
        .. " 2>/dev/null | head -3")
      assert.are.equal("", holders, "the plane's netns is still held")
      assert.is_nil(io.open("/run/corral/0/" .. keeper.pid .. "-1.sock"), "control socket left")
    end
  end

  local function keeper_of(root, id)
    local text = assert(h.read(root .. "/" .. id .. "/keeper"), "no keeper for " .. id)
    local pid, fd = text:match("^(%d+) (%d+)")
    return { pid = pid, netns = h.sh("readlink /proc/" .. pid .. "/fd/" .. fd):gsub("%s+$", "") }
  end

  -- The client's lines, by destination.
  local function results(out)
    local by = {}
    for line in out:gmatch("[^\n]+") do
      local r = json.decode(line)
      if type(r) == "table" and r.dest then by[#by + 1] = r end
    end
    return by
  end

  -- Attempts: a name not allowed, a port not allowed, an IP literal; then the control.
  local function destinations()
    return { "other.test:" .. allowed, "api.test:" .. denied_port, net.ip .. ":" .. allowed, "api.test:" .. allowed }
  end

  local function assert_only_allowed(out)
    local r = results(out)
    assert.are.equal(4, #r, out)
    for i = 1, 3 do
      assert.matches("^refused:", r[i].got, nil, false, out)
      assert.is_true(r[i].seconds < 0.1, r[i].dest .. " took " .. r[i].seconds .. " s")
    end
    assert.are.equal("connected:hello-" .. allowed, r[4].got, out)
    -- the server saw the control only: one connection, to the allowed port
    local seen = h.read(dir .. "/server.log") or ""
    assert.are.equal(allowed .. " " .. net.host_ip .. "\n", seen)
  end

  local function annotations(flag)
    return { flag, "corral.dev/allow=api.test:" .. allowed, flag, "corral.dev/resolve=api.test=" .. net.ip,
      flag, "corral.dev/internal=" .. net.cidr }
  end

  setup(function()
    if missing("podman") and missing("containerd") then return end
    net = internet.start()
    dir = net.dir
    allowed, denied_port = 9101, 9102
    h.write(dir .. "/client.py", CLIENT)
    h.write(dir .. "/server.py", SERVER)
    h.sh("ip netns exec " .. net.ns .. " python3 " .. dir .. "/server.py " .. dir .. "/server.log " .. allowed
      .. " " .. denied_port .. " >/dev/null 2>&1 &")
    assert(h.wait_for(function() return io.open(dir .. "/server.log.up") end, 5), "test server did not start")
    -- the containers' root: /usr of the host bound over links to it
    h.sh("mkdir -p " .. dir .. "/rootfs/usr " .. dir .. "/rootfs/etc " .. dir .. "/rootfs/proc "
      .. dir .. "/rootfs/sys " .. dir .. "/rootfs/dev " .. dir .. "/rootfs/tmp && for l in bin lib lib64 sbin; do "
      .. "ln -s usr/$l " .. dir .. "/rootfs/$l; done")
  end)

  teardown(function()
    if net then internet.stop(net) end
  end)

  before_each(function() if dir then h.write(dir .. "/server.log", "") end end)

  describe("under podman", function()
    local image = "localhost/corral-runtime-test:1"
    local ROOT = "/run/corral-runtime"
    local function podman(...)
      return h.capture({ "podman", "--runtime", RUNTIME, "--cgroup-manager", "cgroupfs", ... })
    end
    local function run_args(extra, ...)
      local a = { "run", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pull", "never",
        "-v", "/usr:/usr:ro", "-v", dir .. ":/t:ro" }
      for _, v in ipairs(extra) do a[#a + 1] = v end
      for _, v in ipairs({ ... }) do a[#a + 1] = v end
      return table.unpack(a)
    end

    setup(function()
      if missing("podman") then return end
      local out, status = h.capture({ "sh", "-c", "tar -C " .. dir .. "/rootfs -c . | podman import - " .. image })
      assert(status == 0, out)
    end)
    teardown(function()
      if not missing("podman") then h.capture({ "podman", "rmi", "-f", image }) end
    end)

    -- An annotated container left running: its name, id and keeper.
    local function start_detached(prefix)
      local name = prefix .. h.own_pid()
      h.defer(finally, function() podman("rm", "-f", "-t", "0", name) end)
      -- the sysctl would let the tenant bind below 1024 in corral's netns: dropped
      local out, status = podman(run_args(annotations("--annotation"), "-d", "--name", name,
        "--sysctl", "net.ipv4.ip_unprivileged_port_start=0", image, "sleep", "60"))
      assert.are.equal(0, status, out)
      local id = out:match("(%x+)%s*$")
      return name, id, keeper_of(ROOT, id)
    end

    -- `podman rm`, then nothing of the container left.
    local function remove(name, id, keeper)
      local out, status = podman("rm", "-f", "-t", "0", name)
      assert.are.equal(0, status, out)
      assert_nothing_left(ROOT, id, keeper)
    end

    it("reaches only the allowed name, logs each decision, and delete leaves nothing", function()
      local why = missing("podman")
      if why then return pending(why) end
      local name, id, keeper = start_detached("corral-rt-")
      local out = podman("exec", name, "python3", "/t/client.py", table.unpack(destinations()))
      assert_only_allowed(out)
      -- every decision in the container's log, the refused ones named
      local log = h.read(ROOT .. "/" .. id .. "/decisions.jsonl") or ""
      assert.matches('"name":"other.test"', log)
      assert.matches('"verdict":"deny"', log)
      assert.matches('"kind":"connect","name":"api.test","ip":"[%d.]+","port":' .. allowed .. ',"verdict":"allow"',
        log)
      -- invariant 4 in the container (root, the engine's default capabilities): no mark,
      -- no port below 1024, no ruleset change; then the controls of each
      out = podman("exec", name, "python3", "-c", [[
import socket, subprocess
def attempt(what, fn):
    try:
        fn(); print(what, "allowed")
    except OSError as e:
        print(what, "refused", e.errno)
s = socket.socket()
attempt("mark", lambda: s.setsockopt(socket.SOL_SOCKET, 36, 7))
attempt("bind80", lambda: socket.socket().bind(("127.0.0.1", 80)))
r = subprocess.run(["/usr/sbin/nft", "flush", "ruleset"], capture_output=True)
print("nft", "allowed" if r.returncode == 0 else "refused")
attempt("keepalive", lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
attempt("bind8080", lambda: socket.socket().bind(("127.0.0.1", 8080)))
]])
      assert.matches("mark refused 1\nbind80 refused 13\nnft refused\nkeepalive allowed\nbind8080 allowed\n", out)
      -- corral's REPL sees the container as a sandbox, served by its keeper
      local seen = h.capture({ h.host, "-e", "for _, s in ipairs(require('corral.operator').sandboxes()) do "
        .. "print(s.id, s.pid, s.mechanism) end" })
      assert.matches(id .. "%s+" .. keeper.pid .. "%s+corral%-runtime", seen)
      -- and corral ls lists its keeper: kind and mechanism runtime, by the container's id
      local ls_out, ls_status = h.corral("ls", "--json")
      assert.are.equal(0, ls_status, ls_out)
      local row
      for _, r in ipairs(require("dkjson").decode(ls_out:match("%b[]")) or {}) do
        if r.id == id then row = r end
      end
      assert.are.same({ "runtime", "runtime", tonumber(keeper.pid) }, { row and row.kind, row and row.mechanism,
        row and math.tointeger(row.pid) })
      -- podman names no --log: the summary is kept in the node's log directory
      local kept = "/var/log/corral-runtime/" .. id .. ".summary.json"
      h.defer(finally, function() os.remove(kept) end)
      remove(name, id, keeper)
      local summary = assert(json.decode(h.read(kept) or ""), "no summary at " .. kept)
      assert.are.equal("deleted", summary.ended)
      assert.matches("denied other.test", table.concat(summary.decisions, "\n"), nil, true)
    end)

    it("a container whose keeper died has no network at all, and delete still leaves nothing", function()
      local why = missing("podman")
      if why then return pending(why) end
      local name, id, keeper = start_detached("corral-rt-dead-")
      h.sh("kill -9 " .. keeper.pid)
      assert.truthy(h.wait_for(function() return not io.open("/proc/" .. keeper.pid .. "/stat") end, 5))
      -- the allowed name, its address and the IP literal: nothing answers; then the
      -- control: the container itself still runs commands
      local out = podman("exec", name, "sh", "-c", "python3 /t/client.py api.test:" .. allowed .. " "
        .. net.ip .. ":" .. allowed .. "; echo alive")
      local r = results(out)
      assert.are.equal(2, #r, out)
      for _, x in ipairs(r) do assert.matches("^refused:", x.got, nil, false, out) end
      assert.matches("alive\n$", out)
      assert.are.equal("", h.read(dir .. "/server.log"))
      remove(name, id, nil)
    end)

    -- `corral conformance --mechanism oci --runtime corral-runtime`: the same egress checks
    -- native runs, each container's plane its keeper's (no plane in corral's process), each
    -- attempt before its control. The delegate alone, given the same annotations, must void
    -- every check (a network none: the controls fail): the plane the checks held came
    -- from corral-runtime, not from the engine.
    it("holds every conformance egress check through corral-runtime; its delegate alone voids them", function()
      local why = missing("podman")
      if why then return pending(why) end
      local function census(runtime)
        local out = h.capture({ h.host, "conformance", "--mechanism", "oci", "--runtime", runtime, "--only",
          "egress", "--json" })
        return assert(json.decode(out:match("{.*}") or ""), out), out
      end
      local n = 0
      for _, c in ipairs(require("corral.conformance").ids()) do if c.group == "egress" then n = n + 1 end end
      local before = h.sh("ls " .. ROOT .. " 2>/dev/null | grep -v '^$' || true")
      -- the summaries each container's keeper leaves in the node's log directory: the test's go
      local LOGS = "/var/log/corral-runtime"
      local kept = h.sh("ls " .. LOGS .. " 2>/dev/null || true")
      h.defer(finally, function()
        local had = {}
        for f in kept:gmatch("[^\n]+") do had[f] = true end
        for f in h.sh("ls " .. LOGS .. " 2>/dev/null || true"):gmatch("[^\n]+") do
          if not had[f] and f:match("^%x+%.summary%.json$") then os.remove(LOGS .. "/" .. f) end
        end
      end)
      local report, out = census(RUNTIME)
      assert.are.equal(n, #report.results, out)
      for _, r in ipairs(report.results) do assert.are.equal("held", r.outcome, r.id .. ": " .. r.detail) end
      assert.are.equal(n, report.census.groups.egress.held)
      -- every container deleted: no keeper's directory left behind
      assert.are.equal(before, h.sh("ls " .. ROOT .. " 2>/dev/null | grep -v '^$' || true"))
      local delegate = h.capture({ RUNTIME, "--version" }):match("%(delegate: (.-)%)")
      report, out = census(delegate)
      assert.are.equal(n, #report.results, out)
      for _, r in ipairs(report.results) do assert.are.equal("void", r.outcome, r.id .. ": " .. r.detail) end
      -- bad input: --runtime names the flag, exit 2
      local bad, status = h.capture({ h.host, "conformance", "--mechanism", "native", "--runtime", RUNTIME })
      assert.are.equal(2, status, bad)
      assert.matches("--runtime", bad, nil, true)
      bad, status = h.capture({ h.host, "conformance", "--mechanism", "oci", "--runtime", "/nonexistent/rt" })
      assert.are.equal(2, status, bad)
      assert.matches("--runtime: /nonexistent/rt", bad, nil, true)
      bad, status = h.capture({ h.host, "conformance", "--mechanism", "oci", "--runtime", "/tmp" })
      assert.are.equal(2, status, bad)
      assert.matches("--runtime: /tmp: not an executable file", bad, nil, true)
    end)

    it("refuses a malformed or unknown annotation by name, leaving nothing; a good one runs", function()
      local why = missing("podman")
      if why then return pending(why) end
      for _, case in ipairs({ { "corral.dev/allow=*.com", "corral.dev/allow" },
                              { "corral.dev/alow=api.test:80", "corral.dev/alow" },
                              { "corral.dev/idle=soon", "corral.dev/idle" },
                              { "corral.dev/secret=TOKEN", "corral.dev/secret" } }) do
        local out, status = podman(run_args({ "--rm", "--annotation", "corral.dev/allow=api.test:" .. allowed,
          "--annotation", case[1] }, image, "true"))
        assert.are_not.equal(0, status, out)
        assert.matches(case[2]:gsub("%p", "%%%0"), out)
      end
      assert.are.equal("", h.sh("ls " .. ROOT .. " | grep -v '^$' || true"))
      -- control: the same container with good annotations runs
      local out, status = podman(run_args({ "--rm", table.unpack(annotations("--annotation")) }, image,
        "python3", "/t/client.py", "api.test:" .. allowed))
      assert.are.equal(0, status, out)
      assert.matches("connected:hello%-" .. allowed, out)
    end)
  end)

  describe("called directly", function()
    -- A scratch root with a bundle: an empty rootfs, its own mount and pid namespaces (the
    -- delegate's mounts never reach the host's), annotated corral.dev/allow=ALLOW.
    local function scratch_bundle(tag, allow)
      local root = h.tmpdir(tag)
      h.defer(finally, function() h.rmrf(root) end)
      local bundle = root .. "/bundle"
      h.sh("mkdir -p " .. bundle .. "/rootfs")
      h.write(bundle .. "/config.json", json.encode({ ociVersion = "1.0.2", root = { path = "rootfs" },
        process = { args = { "/bin/true" }, cwd = "/" }, annotations = { ["corral.dev/allow"] = allow },
        linux = { namespaces = { { type = "mount" }, { type = "pid" } } } }))
      return root, bundle
    end

    -- `corral-runtime run` on a bundle of its own (runc's foreground run: create, start,
    -- wait, delete by the delegate itself, no `delete` from any engine): the container
    -- reaches only its allowed name; its keeper ends when the delegate forgets it, leaving
    -- nothing in the state root and its summary in CORRAL_RUNTIME_LOG_DIR, where a summary
    -- older than SUMMARY_DAYS is swept and a recent one kept. `features` is the delegate's.
    it("runs a bundle with an allowlist through `run`; its summary outlives it; features pass through", function()
      local why = missing("runc")
      if why then return pending(why) end
      if not net then return pending("the test internet was not started (no engine installed)") end
      local root = h.tmpdir("rt-run")
      h.defer(finally, function() h.rmrf(root) end)
      local logs = root .. "/logs"
      h.sh("mkdir -p " .. logs .. " " .. root .. "/bundle && touch -d '8 days ago' " .. logs .. "/old.summary.json "
        .. "&& touch -d '6 days ago' " .. logs .. "/recent.summary.json")
      local ann = {}
      for i = 2, #annotations("-"), 2 do
        local k, v = annotations("-")[i]:match("^([^=]+)=(.*)$")
        ann[k] = v
      end
      local function bind(src, dst)
        return { destination = dst, type = "bind", source = src, options = { "rbind", "ro" } }
      end
      local args = { "python3", "/t/client.py" }
      for _, d in ipairs(destinations()) do args[#args + 1] = d end
      h.write(root .. "/bundle/config.json", json.encode({ ociVersion = "1.0.2", hostname = "rt",
        root = { path = dir .. "/rootfs", readonly = true },
        process = { terminal = false, user = { uid = 0, gid = 0 }, args = args, env = { "PATH=/usr/bin:/bin" },
          cwd = "/", noNewPrivileges = true },
        mounts = { { destination = "/proc", type = "proc", source = "proc" },
          { destination = "/dev", type = "tmpfs", source = "tmpfs", options = { "nosuid", "mode=755" } },
          bind("/usr", "/usr"), bind(dir, "/t") },
        annotations = ann,
        linux = { namespaces = { { type = "pid" }, { type = "mount" }, { type = "ipc" }, { type = "uts" } } } }))
      local id = "corral-rt-run-" .. h.own_pid()
      local out, status = h.capture({ "env", "CORRAL_RUNTIME_LOG_DIR=" .. logs, RUNTIME, "--root", root .. "/state",
        "run", "--bundle", root .. "/bundle", id })
      assert.are.equal(0, status, out)
      assert_only_allowed(out)
      -- the keeper saw the delegate forget the container, wrote its summary and ended
      local path = logs .. "/" .. id .. ".summary.json"
      assert.truthy(h.wait_for(function() return io.open(path) end, 5), "no summary at " .. path)
      local summary = assert(json.decode(h.read(path)))
      assert.are.equal(id, summary.id)
      assert.is_true(summary.allowed >= 1 and summary.denied >= 3, h.read(path))
      local said = table.concat(summary.decisions, "\n")
      for _, d in ipairs({ "denied other.test", "denied " .. net.ip .. ":" .. allowed,
                           "denied api.test:" .. denied_port }) do
        assert.matches(d, said, nil, true)
      end
      assert.matches("delegate no longer knows", summary.ended, nil, true)
      assert.matches("600", h.sh("stat -c %a " .. path))
      assert.truthy(h.wait_for(function() return not io.open(root .. "/state/" .. id) end, 5), "state dir left")
      assert.are.equal("", h.sh("pgrep -f '[k]eeper " .. root .. "/state' || true"))
      assert.is_nil(io.open(logs .. "/old.summary.json"), "a summary older than 7 days was kept")
      assert.truthy(io.open(logs .. "/recent.summary.json"), "a recent summary was swept")
      -- features: the delegate's own JSON, untouched
      local mine, st1 = h.capture({ RUNTIME, "features" })
      assert.are.equal(0, st1, mine)
      local delegate = h.capture({ RUNTIME, "--version" }):match("%(delegate: (.-)%)")
      local theirs = h.capture({ delegate, "features" })
      local f = assert(json.decode(mine), mine)
      assert.truthy(f.ociVersionMax, mine)
      assert.are.same(json.decode(theirs), f)
    end)

    it("renders oci's network as annotations corral-runtime reads back; what they cannot carry is refused",
      function()
      local annotate = require "corral.mechanism.oci.annotate"
      local parser = require "corral.runtime.annotations"
      local asked = {}
      local resolve = function(name) asked[#asked + 1] = name return { "127.0.0.1" } end
      -- what annotations cannot carry: refused, never dropped
      for _, case in ipairs({ { allow = { "*.a.test:443" }, resolve = resolve },
                              { allow = { "a.test:80,443" } },
                              { allow = { "a.test:80" }, learn = true },
                              { allow = { "a.test:80" }, link = { peer_netns = "/run/netns/x" } } }) do
        local ok, err = annotate.flags(case)
        assert.is_nil(ok)
        assert.are.equal("cannot_enforce", err.code, tostring(err))
      end
      -- control: a resolver asked once per allowed name, its answer a table the keeper reads
      local flags = assert(annotate.flags({ allow = { "a.test:80", "udp:a.test:123", "b.test:443" },
        internal = { "127.0.0.0/8" }, resolve = resolve, idle = 90, sni = "match" }))
      table.sort(asked)
      assert.are.same({ "a.test", "b.test" }, asked)
      local ann = {}
      for i = 1, #flags, 2 do
        assert.are.equal("--annotation", flags[i])
        local k, v = flags[i + 1]:match("^([^=]+)=(.*)$")
        ann[k] = v
      end
      local network = assert(parser.network(ann))
      assert.are.same({ "a.test:80", "udp:a.test:123", "b.test:443" }, network.allow)
      assert.are.same({ "127.0.0.1" }, network.resolve["b.test"])
      assert.are.equal(90, network.idle)
      assert.are.equal("match", network.sni)
    end)

    it("reads annotations with corral run's grammar, each refusal naming its annotation", function()
      local parser = require "corral.runtime.annotations"
      local network = assert(parser.network({ ["corral.dev/allow"] = "a.test:443,\n b.test:80\nudp:c.test:123",
        ["corral.dev/idle"] = "10m", ["other/key"] = "x" }))
      assert.are.same({ "a.test:443", "b.test:80", "udp:c.test:123" }, network.allow)
      assert.are.equal(600, network.idle)
      assert.are.equal(false, (parser.network({ ["io.kubernetes.cri.container-type"] = "sandbox" })))
      for _, case in ipairs({
        { { ["corral.dev/allow"] = "a.test:443", ["corral.dev/resolve"] = "a.test" }, "corral.dev/resolve" },
        { { ["corral.dev/allow"] = "a.test:443", ["corral.dev/log-json"] = "/etc/passwd" }, "corral.dev/log-json" },
        { { ["corral.dev/allow"] = "a.test:443", ["corral.dev/learn"] = "l.txt" }, "corral.dev/learn" },
        { { ["corral.dev/sni"] = "require" }, "corral.dev/sni" },
        { { ["corral.dev/allow"] = " , " }, "corral.dev/allow" } }) do
        local ok, err = parser.network(case[1])
        assert.is_nil(ok)
        assert.are.equal(case[2], err.argument, tostring(err))
        assert.is_nil(tostring(err.detail):find("%-%-%a"), tostring(err)) -- no flag of corral run's named
      end
      -- controls: the same keys well formed are taken
      local ok = parser.network({ ["corral.dev/allow"] = "a.test:443", ["corral.dev/resolve"] = "a.test=192.0.2.1",
        ["corral.dev/log-json"] = "a.jsonl", ["corral.dev/sni"] = "require" })
      assert.truthy(ok)
      assert.are.equal("192.0.2.1", ok.resolve["a.test"][1])
    end)

    it("sweeps the directory of a dead keeper whose container is gone, and keeps a live one's", function()
      if not is_root or not built then return pending("needs root and corral-runtime beside the host") end
      local root = h.tmpdir("rt-sweep")
      h.defer(finally, function() h.rmrf(root) end)
      -- a pid that was a process and is no more; a live process whose argv names a keeper
      local dead = h.sh("sh -c 'echo $$'"):match("%d+")
      local live = h.sh("bash -c 'exec -a keeper sleep 30' >/dev/null 2>&1 & echo $!"):match("%d+")
      h.defer(finally, function() h.sh("kill " .. live) end)
      h.sh("mkdir -p " .. root .. "/gone " .. root .. "/kept && echo '" .. dead .. " 3' >" .. root .. "/gone/keeper && "
        .. "echo '" .. live .. " 3' >" .. root .. "/kept/keeper")
      local out, status = h.capture({ RUNTIME, "--root", root, "delete", "no-such-container" })
      assert.are_not.equal(0, status, out) -- the delegate knows no such container
      assert.is_nil(io.open(root .. "/gone/keeper"), "a dead keeper's directory left")
      assert.truthy(io.open(root .. "/kept/keeper"), "a live keeper's directory swept")
    end)

    it("refuses to run a plane it cannot build (exit 3, naming what is missing), leaving nothing", function()
      if not is_root or not built then return pending("needs root and corral-runtime beside the host") end
      local root, bundle = scratch_bundle("rt-cannot", "api.test:443")
      local runc = h.sh("command -v runc || command -v crun"):gsub("%s+$", "")
      local function create(path)
        return h.capture({ "env", "PATH=" .. path, "CORRAL_RUNTIME_DELEGATE=" .. runc, RUNTIME, "--root", root .. "/s",
          "create", "--bundle", bundle, "c1" })
      end
      -- without setsid the keeper could not outlive the runtime: refused, nothing made
      local out, status = create("/nonexistent")
      assert.are.equal(3, status, out)
      assert.matches("cannot_enforce: network_restriction: setsid", out, nil, true)
      assert.is_nil(io.open(root .. "/s/c1"))
      -- control: with it, the plane is built and the bundle joins it (the delegate then
      -- fails on this empty root); delete ends the keeper
      out = create(h.PATH)
      local cfg = json.decode(h.read(bundle .. "/config.json"))
      local joined
      for _, ns in ipairs(cfg.linux.namespaces) do
        if ns.type == "network" then joined = ns.path end
      end
      assert.matches("^/proc/%d+/fd/%d+$", joined, nil, false, out)
      local keeper = keeper_of(root .. "/s", "c1")
      h.capture({ RUNTIME, "--root", root .. "/s", "delete", "--force", "c1" })
      assert_nothing_left(root .. "/s", "c1", keeper)
    end)

    it("refuses a config.json whose members it reads have another shape: exit 2 naming --bundle, nothing made",
      function()
      if not is_root or not built then return pending("needs root and corral-runtime beside the host") end
      -- found by the runtime fuzz target (tests/fuzz/corpus/runtime/crash-*): each of these raised
      local root, bundle = scratch_bundle("rt-shape", "api.test:99999")
      local good = h.read(bundle .. "/config.json")
      for _, member in ipairs({ { "annotations", "corral.dev/allow" }, { "linux", "x" },
          { "linux", { namespaces = { 7 } } }, { "linux", { sysctl = "net.x" } } }) do
        local cfg = json.decode(good)
        cfg[member[1]] = member[2]
        h.write(bundle .. "/config.json", json.encode(cfg))
        local out, status = h.capture({ RUNTIME, "--root", root .. "/state", "create", "--bundle", bundle, "c1" })
        assert.are.equal(2, status, out)
        assert.matches("--bundle", out, nil, true)
        assert.matches(member[1], out, nil, true)
        assert.is_nil(io.open(root .. "/state/c1"))
      end
      -- the control: the same config in its own shape is read, and refused for its annotation
      h.write(bundle .. "/config.json", good)
      local out, status = h.capture({ RUNTIME, "--root", root .. "/state", "create", "--bundle", bundle, "c1" })
      assert.are.equal(2, status, out)
      assert.matches("corral.dev/allow", out, nil, true)
    end)

    it("writes its refusal to --log in the format asked, exit 2, nothing made", function()
      if not is_root or not built then return pending("needs root and corral-runtime beside the host") end
      local root, bundle = scratch_bundle("rt-root", "api.test:99999")
      for _, format in ipairs({ "json", "text" }) do
        local log = root .. "/log." .. format
        local out, status = h.capture({ RUNTIME, "--root", root .. "/state", "--log", log, "--log-format", format,
          "create", "--bundle", bundle, "c1" })
        assert.are.equal(2, status, out)
        assert.matches("corral.dev/allow", out, nil, true)
        local line = assert(h.read(log))
        if format == "json" then
          local e = assert(json.decode(line), line)
          assert.are.equal("error", e.level)
          assert.matches("corral.dev/allow", e.msg, nil, true)
        else
          assert.matches('^time="[^"]+" level=error msg=".*corral.dev/allow', line)
        end
        assert.is_nil(io.open(root .. "/state/c1"))
      end
    end)
  end)

  describe("under containerd", function()
    local ctd, sock
    local function ctr(...)
      return h.capture({ "ctr", "-a", sock, ... })
    end

    setup(function()
      if missing("containerd") or not net then return end
      ctd = h.tmpdir("rt-ctd")
      sock = ctd .. "/c.sock"
      h.write(ctd .. "/config.toml", table.concat({ "version = 2", 'root = "' .. ctd .. '/root"',
        'state = "' .. ctd .. '/state"', 'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
        "[grpc]", '  address = "' .. sock .. '"', "[ttrpc]", '  address = "' .. sock .. '.ttrpc"', "" }, "\n"))
      h.sh("containerd --config " .. ctd .. "/config.toml >" .. ctd .. "/log 2>&1 & echo $! >" .. ctd .. "/pid")
      assert(h.wait_for(function() return select(2, ctr("version")) == 0 end, 10), h.read(ctd .. "/log"))
    end)

    teardown(function()
      if ctd then
        h.sh("kill $(cat " .. ctd .. "/pid); sleep 0.2; umount -R " .. ctd .. "/state " .. ctd .. "/root 2>/dev/null")
        h.rmrf(ctd)
      end
    end)

    local function run(id, ...)
      local rest = { ... }
      local detach = rest[1] == "-d" and table.remove(rest, 1)
      local extra = {}
      while rest[1] == "--annotation" do
        extra[#extra + 1] = table.remove(rest, 1)
        extra[#extra + 1] = table.remove(rest, 1)
      end
      local a = { "run", detach or "--rm", "--runc-binary", RUNTIME,
        "--mount", "type=bind,src=/usr,dst=/usr,options=rbind:ro",
        "--mount", "type=bind,src=" .. dir .. ",dst=/t,options=rbind:ro", "--env", "PATH=/usr/bin:/bin" }
      for _, v in ipairs(annotations("--annotation")) do a[#a + 1] = v end
      for _, v in ipairs(extra) do a[#a + 1] = v end
      a[#a + 1] = "--rootfs"
      a[#a + 1] = dir .. "/rootfs"
      a[#a + 1] = id
      for _, v in ipairs(rest) do a[#a + 1] = v end
      return ctr(table.unpack(a))
    end
    local ROOT = "/run/containerd/runc/default"
    local function stopped(id) return ctr("task", "ls"):find(id:gsub("%p", "%%%0") .. "%s+%d+%s+STOPPED") end

    it("reaches only the allowed name, with the decisions in the engine's log, and delete leaves nothing", function()
      local why = missing("containerd")
      if why then return pending(why) end
      local id = "corral-rt-" .. h.own_pid()
      h.defer(finally, function() ctr("task", "rm", "-f", id) ctr("container", "rm", id) end)
      local out, status = run(id, "-d", "sleep", "60")
      assert.are.equal(0, status, out)
      local keeper = keeper_of(ROOT, id)
      out = ctr("task", "exec", "--exec-id", "client", id, "python3", "/t/client.py", table.unpack(destinations()))
      assert_only_allowed(out)
      -- containerd's --log (log.json, --log-format json): the runtime's lines and each decision
      local log = h.read(ctd .. "/state/io.containerd.runtime.v2.task/default/" .. id .. "/log.json") or ""
      local allow, deny
      for line in log:gmatch("[^\n]+") do
        local e = json.decode(line)
        if type(e) == "table" and type(e.corral) == "table" then
          if e.corral.verdict == "allow" and e.corral.kind == "connect" then allow = e end
          if e.corral.verdict == "deny" then deny = e end
        end
      end
      assert.truthy(allow and deny, log)
      assert.are.equal("api.test", allow.corral.name)
      assert.are.equal("warning", deny.level)
      ctr("task", "kill", "-s", "KILL", id)
      assert.truthy(h.wait_for(function() return stopped(id) end, 5))
      out, status = ctr("task", "rm", id)
      assert.are.equal(0, status, out)
      ctr("container", "rm", id)
      assert_nothing_left(ROOT, id, keeper)
    end)

    -- A pod as containerd's CRI makes it: its sandbox container carries the pod's
    -- annotations and the keeper; each other container joins the sandbox's plane.
    it("puts a pod's containers in its sandbox's plane; one whose sandbox has no keeper is refused", function()
      local why = missing("containerd")
      if why then return pending(why) end
      local sb, app, orphan = "corral-rt-sb-" .. h.own_pid(), "corral-rt-app-" .. h.own_pid(),
        "corral-rt-orphan-" .. h.own_pid()
      h.defer(finally, function()
        for _, id in ipairs({ orphan, app, sb }) do ctr("task", "rm", "-f", id) ctr("container", "rm", id) end
      end)
      local out, status = run(sb, "-d", "--annotation", "io.kubernetes.cri.container-type=sandbox", "sleep", "60")
      assert.are.equal(0, status, out)
      local keeper = keeper_of(ROOT, sb)
      -- a container whose sandbox has no keeper, annotated: refused, never unfiltered
      out, status = run(orphan, "--annotation", "io.kubernetes.cri.container-type=container", "--annotation",
        "io.kubernetes.cri.sandbox-id=no-such-sandbox", "python3", "/t/client.py", net.ip .. ":" .. allowed)
      assert.are_not.equal(0, status, out)
      assert.matches("no live corral keeper", out, nil, true)
      -- the pod's container, no corral.dev/ annotation of its own: the sandbox's plane
      out, status = ctr("run", "--rm", "--runc-binary", RUNTIME, "--mount",
        "type=bind,src=/usr,dst=/usr,options=rbind:ro",
        "--mount", "type=bind,src=" .. dir .. ",dst=/t,options=rbind:ro",
        "--env", "PATH=/usr/bin:/bin", "--annotation", "io.kubernetes.cri.container-type=container",
        "--annotation", "io.kubernetes.cri.sandbox-id=" .. sb, "--rootfs", dir .. "/rootfs", app,
        "python3", "/t/client.py", table.unpack(destinations()))
      assert.are.equal(0, status, out)
      assert_only_allowed(out)
      -- the app's delete left the sandbox's keeper alone
      assert.truthy(io.open("/proc/" .. keeper.pid .. "/stat"))
      ctr("task", "kill", "-s", "KILL", sb)
      assert.truthy(h.wait_for(function() return stopped(sb) end, 5))
      out, status = ctr("task", "rm", sb)
      assert.are.equal(0, status, out)
      assert_nothing_left(ROOT, sb, keeper)
    end)

    -- N containers created and deleted in a row (the bench runs 100): nothing left
    it("creates and deletes 10 containers in a row, leaving no keeper or state", function()
      local why = missing("containerd")
      if why then return pending(why) end
      for i = 1, 10 do
        local id = "corral-rt-loop-" .. h.own_pid() .. "-" .. i
        local out, status = run(id, "true")
        assert.are.equal(0, status, out)
      end
      assert.are.equal("", h.sh("ls " .. ROOT .. " | grep corral-rt-loop || true"))
      assert.are.equal("", h.sh("pgrep -f '[k]eeper " .. ROOT .. " corral-rt-loop' || true"))
    end)
  end)
end)

-- The Kubernetes documents, checked on paper: no API server runs here, and kubectl's
-- `apply --dry-run=client` needs one (its REST mapping comes from the server's discovery),
-- so each manifest goes through kubectl's offline path (`label --local --dry-run=client`,
-- which parses every document and its kind) and this spec checks what ties them together.
describe("deploy/kubernetes", function()
  local DIR = "deploy/kubernetes"
  local function have_kubectl() return select(2, h.sh("command -v kubectl >/dev/null")) == 0 end

  local function objects(file)
    local out, status = h.capture({ "kubectl", "label", "--local", "--dry-run=client", "-o", "json", "-f", file,
      "corral.dev/checked=yes" })
    assert.are.equal(0, status, out)
    local doc = assert(json.decode(out), out)
    return doc.kind == "List" and doc.items or { doc }
  end

  it("parses every manifest, and a broken one is refused by the same check", function()
    if not have_kubectl() then return pending("kubectl is not installed (Debian: kubernetes-client)") end
    local tmp = h.tmpdir("k8s")
    h.defer(finally, function() h.rmrf(tmp) end)
    h.write(tmp .. "/broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers: [\n")
    local out, status = h.capture({ "kubectl", "label", "--local", "--dry-run=client", "-o", "json", "-f",
      tmp .. "/broken.yaml", "a=b" })
    assert.are_not.equal(0, status, out)
    local kinds = {}
    for _, f in ipairs({ "runtimeclass.yaml", "daemonset.yaml", "pod-example.yaml" }) do
      for _, o in ipairs(objects(DIR .. "/" .. f)) do kinds[o.kind] = o end
    end
    local rc, ds, pod = kinds.RuntimeClass, kinds.DaemonSet, kinds.Pod
    assert.truthy(rc and ds and pod)
    -- the pod names the RuntimeClass, whose handler is the containerd entry's name
    assert.are.equal(rc.metadata.name, pod.spec.runtimeClassName)
    local toml = assert(h.read(DIR .. "/containerd-runtime.toml"))
    assert.matches('runtimes%.' .. rc.handler .. '%]', toml)
    assert.matches('runtime_type = "io.containerd.runc.v2"', toml, nil, true)
    assert.matches('pod_annotations = ["corral.dev/*"]', toml, nil, true)
    assert.matches('BinaryName = "/usr/local/bin/corral-runtime"', toml, nil, true)
    -- the DaemonSet's selector picks its own pods
    for k, v in pairs(ds.spec.selector.matchLabels) do assert.are.equal(v, ds.spec.template.metadata.labels[k]) end
    -- the pod's annotations are ones corral-runtime accepts (its own parser)
    local annotations = require "corral.runtime.annotations"
    local network, err = annotations.network(pod.metadata.annotations)
    assert.truthy(network, tostring(err))
    assert.are.equal(3, #network.allow)
  end)
end)
