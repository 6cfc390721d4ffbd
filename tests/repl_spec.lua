-- The REPL as a diagnostic console, driven through a real pseudo-terminal (tests/pty.lua:
-- util-linux `script`), typing and reading the screen: help, the table printer, Tab
-- completion, and the live sandboxes of other `corral run` processes reached through
-- their control sockets (listing, why, allow and revoke reaching the tenant's next
-- connection, attach); the SO_PEERCRED refusal; no registration left behind however a
-- run ends. Run `make` first.
local core = require "corral.core"
local h = require "helpers"
local pty = require "pty"

local HOST = h.host
local is_root = core.proc.geteuid() == 0

-- Every clean-up goes through h.defer: busted keeps one `finally` per test.
local function defer(fn) h.defer(finally, fn) end

local function tempdir()
  local d = h.tmpdir("repl")
  defer(function() h.rmrf(d) end)
  return d
end

-- The runtime directory corral registers in (see corral.control.dir).
local function runtime_dir()
  return assert(require("corral.control").dir())
end

local function registrations(pid)
  local out = {}
  for _, name in ipairs(core.fs.listdir(runtime_dir()) or {}) do
    if name:match("^" .. pid .. "%-%d+%.sock$") then out[#out + 1] = runtime_dir() .. "/" .. name end
  end
  return out
end

-- Starts `corral run ARGS...` in the background; returns its pid and the file its
-- output goes to, once it has registered. The run is killed when the test ends.
local function background_run(...)
  local d = tempdir()
  local log = d .. "/run.log"
  local pidfile = d .. "/pid"
  local words = { h.quote(HOST), "run" }
  for _, a in ipairs({ ... }) do words[#words + 1] = h.quote(a) end
  h.must(string.format("%s sh -c 'echo $$ > \"$0\"; exec \"$@\"' %s %s > %s 2>&1 &", pty.CLEAN, h.quote(pidfile),
    table.concat(words, " "), h.quote(log)))
  assert(h.wait_for(function() return (h.read(pidfile) or ""):match("%d+") end, 5), "no pid")
  local pid = tonumber(h.read(pidfile):match("%d+"))
  defer(function() os.execute("kill -9 " .. pid .. " 2>/dev/null") end)
  assert(h.wait_for(function() return #registrations(pid) == 1 end, 10), "the run never registered: " ..
    (h.read(log) or ""))
  return pid, log, registrations(pid)[1]
end

local function gone(pid)
  return h.wait_for(function() return not core.fs.lstat("/proc/" .. pid) end, 10)
end

describe("corral.pretty", function()
  local pretty = require "corral.pretty"

  it("writes tables as constructors: list first, keys sorted, cycles and depth cut", function()
    local t = { 1, "two", id = "tenant", ["a b"] = true, limits = { pids = 64 } }
    assert.are.equal('{ 1, "two", ["a b"] = true, id = "tenant", limits = { pids = 64 } }', pretty.format(t))
    t.self = t
    assert.matches("self = <cycle: table: 0x%x+>", pretty.format(t))
    local deep = { x = { x = { x = { x = {} } } } }
    assert.are.equal("{ x = { x = {…} } }", pretty.format(deep, { depth = 2 }))
    assert.are.equal("{ x = { x = { x = { x = {} } } } }", pretty.format(deep)) -- control: within the default
    local long = {}
    for i = 1, 30 do long[i] = i end
    assert.matches("28, 29, 30 }$", pretty.format(long, { width = 1000 }))
    assert.matches("9, 10, … %(20 more%) }$", pretty.format(long, { items = 10, width = 1000 }))
    local wide = {}
    for i = 1, 3 do wide["key" .. i] = string.rep("v", 40) end
    assert.are.equal(3, select(2, pretty.format(wide):gsub("\n  key", "")))
  end)

  it("shows strings as print does and a table's own __tostring", function()
    assert.are.equal("hi\t42\tnil\t{}", pretty.results("hi", 42, nil, {}))
    local custom = setmetatable({}, { __tostring = function() return "custom" end })
    assert.are.equal("{ e = custom }", pretty.format({ e = custom }))
  end)
end)

describe("core.unix", function()
  it("listens with the mode asked, reports the peer's credentials, refuses a stale path", function()
    local d = tempdir()
    local path = d .. "/s.sock"
    local l = assert(core.unix.listen(path, tonumber("600", 8)))
    assert.are.equal(tonumber("600", 8), core.fs.lstat(path).mode)
    local c = assert(core.unix.connect(path, 1))
    local s = assert(core.unix.accept(l, 1))
    local cred = assert(core.unix.peercred(s))
    assert.are.same({ core.proc.getpid(), core.proc.geteuid() }, { cred.pid, cred.uid })
    assert(core.sock.send(c, "ping\n"))
    assert.are.equal("ping\n", core.sock.recv(s, 100, 1))
    local none, _, errno = core.unix.accept(l)
    assert.is_nil(none)
    assert.are.equal(core.errno.EAGAIN, errno)
    l:close()
    local stale, err = core.unix.connect(path, 1)
    assert.is_nil(stale)
    assert.matches("refused", err)
  end)
end)

describe("core.unix.peer_in_own_userns", function()
  it("is false for a peer in a user namespace beneath, true for one of its own (control)", function()
    local d = tempdir()
    local path = d .. "/u.sock"
    local l = assert(core.unix.listen(path, tonumber("600", 8)))
    defer(function() l:close() end)
    -- attempt: a peer in a user namespace of its own (root there, mapped to our uid)
    local child = assert(io.popen("unshare --user --map-root-user /usr/bin/python3 -c " .. h.quote(
      "import socket, time; s = socket.socket(socket.AF_UNIX); s.connect(" .. string.format("%q", path) ..
      "); time.sleep(3)") .. " 2>&1"))
    local s
    assert(h.wait_for(function() s = core.unix.accept(l, 1); return s ~= nil end, 5), "the peer did not connect")
    local cred = assert(core.unix.peercred(s))
    assert.are.equal(core.proc.geteuid(), cred.uid) -- its uid is ours all the same
    assert.is_false(core.unix.peer_in_own_userns(s))
    s:close()
    child:close()
    -- control, on the same listener: this process itself
    local c = assert(core.unix.connect(path, 1))
    local own = assert(core.unix.accept(l, 1))
    assert.is_true(core.unix.peer_in_own_userns(own))
    own:close()
    c:close()
  end)
end)

describe("REPL console on a terminal", function()
  it("help() lists every helper and help(name) explains one", function()
    local out, code = pty.repl("-i", { "help()\n", 'help("why")\n', "help(revoke)\n", 'help("nosuch")\n',
      "os.exit(0)\n" })
    assert.are.equal(0, code)
    for _, name in ipairs({ "sandboxes", "connections", "decisions", "ruleset", "namespaces", "why", "allow",
      "revoke", "attach" }) do
      assert.truthy(out:find("\n  " .. name .. "(", 1, true), name .. " missing from help():\n" .. out)
    end
    assert.truthy(out:find("which allowlist entry lets host:port through", 1, true))
    assert.truthy(out:find("Decided with the sandbox's current policy", 1, true)) -- help("why")'s long text
    assert.truthy(out:find("With {cut = true}", 1, true)) -- help(revoke), by the function itself
    assert.truthy(out:find("no helper nosuch", 1, true))
  end)

  it("prints a table result as a table, not as its address", function()
    local out, code = pty.repl("-i", { '{ id = "t", limits = { pids = 64 }, 1 }\n', "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.truthy(pty.line_at(out, '{ 1, id = "t", limits = { pids = 64 } }'), out)
    assert.is_nil(out:find("table: 0x", 1, true))
  end)

  it("Tab completes globals and fields, and file names where the word is a path", function()
    if not pty.has_readline() then
      pending("host built without readline: no completion")
      return
    end
    local d = tempdir()
    h.write(d .. "/uniquely-named.txt", "")
    local out, code = pty.repl("-i", {
      "print(type(corral.decis\t))\n", 0.2,      -- one candidate: completed in the line
      "print(type(sandbo\t))\n", 0.2,            -- a REPL global
      "print(string.form\t('%d', 7))\n", 0.2,    -- a library field
      "corral.s\t\t", 0.3, "\21", 0.2,           -- several: listed (Ctrl-U drops the line)
      'print("' .. d .. '/uniq\t)\n', 0.2,       -- a path: file names (readline closes the quote)
      "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.are.equal(2, select(2, out:gsub("\nfunction\n", "")), out)
    assert.truthy(pty.line_at(out, "7"), out)
    assert.truthy(out:find("corral.sandboxes", 1, true) and out:find("corral.sandbox%s"), out)
    assert.truthy(pty.line_at(out, d .. "/uniquely-named.txt"), out)
  end)
end)

describe("REPL on a custom mechanism's run", function()
  it("lists it with its usage from /proc and attaches to it, while its exec blocks in os.execute", function()
    local d = tempdir()
    local mech = d .. "/custom.lua"
    h.write(mech, [[
local M = { name = "custom" }
local state = {}
function M.provision(sb) state[sb.id] = "provisioned"; return true end
function M.start() return true end
function M.exec(_, argv)
  local _, how, n = os.execute(table.concat(argv, " "))
  return { code = how == "exit" and n or 128 + n, how = how == "exit" and "exited" or "killed" }
end
function M.stop() return true end
function M.destroy(sb) state[sb.id] = nil; return true end
function M.status(sb) return state[sb.id] or "absent" end
return M
]])
    local pid = background_run("--id", "repl-custom", "--mechanism", mech, "--", "sleep 30")
    local out, code = pty.repl("-i", { "sandboxes()\n", "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.truthy(out:find('ref = "repl-custom@' .. pid .. '"', 1, true), out)
    assert.matches('id = "repl%-custom",%s+limits = %b{},%s+mechanism = "custom"', out)
    local entry = out:match('id = "repl%-custom",.-usage = (%b{})')
    assert.truthy(entry, out)
    assert.truthy(entry:find('from = "/proc"', 1, true), out) -- no cgroup of its own to read
    -- the watched child, the shell os.execute started and sleep
    local n = tonumber(entry:match("pids = (%d+)"))
    assert.truthy(n and n >= 3, out)
    out, code = pty.repl("attach repl-custom", { "info().pid\n", "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.truthy(out:find("attached to repl-custom@" .. pid, 1, true), out)
    assert.truthy(pty.line_at(out, tostring(pid)), out)
  end)
end)

describe("REPL on live sandboxes #root", function()
  before_each(function()
    if not is_root then pending("needs root: native sandboxes") end
  end)

  it("lists a sandbox another corral run serves, with its pid, mechanism and tenant", function()
    local pid = background_run("--id", "repl-list", "--pids", "32", "--", "sleep", "30")
    local out, code = pty.repl("-i", { "sandboxes()\n", 'why("repl-list", "pypi.org:443")\n',
      'namespaces("repl-list").net\n', "namespaces(" .. pid .. ").net\n", "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.truthy(out:find('ref = "repl-list@' .. pid .. '"', 1, true), out)
    assert.truthy(out:find('mechanism = "native"', 1, true), out)
    assert.truthy(out:find("pids = 32", 1, true), out) -- its limits
    assert.truthy(out:find('command = { "sleep", "30" }', 1, true), out)
    assert.truthy(out:find('reason = "no egress policy for this sandbox"', 1, true), out)
    -- the tenant's own netns; control: the corral process serving it shares the host's
    local tenant_ns, serving_ns = out:find("shared = false", 1, true), out:find("shared = true", 1, true)
    assert.truthy(tenant_ns and serving_ns and serving_ns > tenant_ns, out)
  end)

  it("allow and revoke reach the other process: the tenant's next connection follows", function()
    local internet = require "internet"
    local net = internet.start()
    defer(function() internet.stop(net) end)
    -- Each second the tenant tries pypi.org (not allowed at first) and then echo.test
    -- (always allowed: the control that the path itself works at that moment).
    -- One connection to echo.test stays open all along (for connections()).
    local probe = "sleep 60 | nc echo.test 9007 >/dev/null 2>&1 & for i in $(seq 1 60); do " ..
      "if echo x | nc -N -w 2 pypi.org 9007 >/dev/null 2>&1; then a=ok; else a=no; fi; " ..
      "if echo x | nc -N -w 2 echo.test 9007 >/dev/null 2>&1; then b=ok; else b=no; fi; " ..
      "echo \"try A=$a B=$b\"; sleep 0.5; done"
    local pid, log = background_run("--id", "repl-egress", "--internal", net.cidr, "--resolve", "pypi.org=" .. net.ip,
      "--resolve", "echo.test=" .. net.ip, "--allow", "echo.test:9007", "--", "sh", "-c", probe)
    local function tries() return h.read(log) or "" end
    assert(h.wait_for(function() return tries():find("try A=no B=ok", 1, true) end, 15),
      "no denied attempt with its control: " .. tries())
    local ref = "repl-egress@" .. pid
    -- the pauses last until the tenant's log shows the change (4 s at most): what the
    -- assertions below then read of it
    local allowed = { until_ = "grep -q 'try A=ok B=ok' " .. h.quote(log), seconds = 4 }
    local revoked = { until_ = "awk '/try A=ok B=ok/ { ok = 1 } ok && /try A=no B=ok/ { f = 1 } END { exit !f }' " ..
      h.quote(log), seconds = 4 }
    local out, code = pty.repl("-i", {
      string.format('why(%q, "pypi.org:9007")\n', ref),
      -- UDP to the allowed TCP destination: its own protocol's entries decide (none here)
      string.format('why(%q, "udp:echo.test:9007")\n', ref),
      string.format('why(%q, "echo.test:9007")\n', ref),
      string.format('allow(%q, "pypi.org:9007")\n', ref), allowed,
      string.format('why(%q, "pypi.org:9007")\n', ref),
      string.format("connections(%q)\n", ref),
      string.format("ruleset(%q)\n", ref),
      string.format('revoke(%q, "pypi.org:9007")\n', ref), revoked,
      -- the same entry again: no longer there, which is said rather than counted as 0
      string.format('revoke(%q, "pypi.org:9007")\n', ref),
      string.format("decisions(%q, 3)\n", ref),
      "os.exit(0)\n" }, nil, 20)
    assert.are.equal(0, code)
    local log_text = tries()
    local first_no = log_text:find("try A=no B=ok", 1, true)
    local ok_at = log_text:find("try A=ok B=ok", 1, true)
    assert.truthy(ok_at and ok_at > first_no, "allow never reached the tenant:\n" .. log_text)
    local no_again = log_text:find("try A=no B=ok", ok_at, true)
    assert.truthy(no_again, "revoke never reached the tenant (with its control B=ok):\n" .. log_text)
    local udp_deny = out:find('reason = "udp to echo.test port 9007', 1, true)
    local tcp_allow = out:find("allowed by echo.test:9007", 1, true)
    assert.truthy(udp_deny and tcp_allow and tcp_allow > udp_deny, out)
    local why_deny = out:find("pypi.org is not in the allowlist", 1, true)
    local why_allow = out:find("allowed by pypi.org:9007", 1, true)
    assert.truthy(why_deny and why_allow and why_allow > why_deny, out)
    assert.truthy(out:find('allowed = "pypi.org:9007"', 1, true), out)
    assert.truthy(out:find("removed = 1", 1, true), out)
    assert.truthy(out:find("pypi.org:9007 is not in repl-egress's allowlist, which holds: echo.test:9007", 1, true),
      out)
    assert.truthy(out:find('sandbox = "repl-egress"', 1, true), out) -- decisions
    -- connections(): the held one (an id: no decision has one), the entry that allowed it
    assert.matches('entry = "echo%.test:9007",%s+id = %d+,%s+ip = "[^"]+",%s+name = "echo%.test",%s+port = 9007,%s+' ..
      'upstream = "' .. net.ip:gsub("%.", "%%.") .. '"', out)
    -- ruleset(): the table read back from the kernel, its default-drop output chain
    assert.truthy(out:find("table inet corral", 1, true), out)
    assert.truthy(out:find("chain filter_out type filter hook output priority 0 policy drop", 1, true), out)
  end)

  it("corral attach ID opens the REPL with the helpers defaulting to it", function()
    local pid = background_run("--id", "repl-attach", "--", "sleep", "30")
    local out, code = pty.repl("attach repl-attach", { "info().pid\n", 'why("example.org:80").verdict\n',
      "help()\n", "os.exit(0)\n" })
    assert.are.equal(0, code)
    assert.truthy(out:find("attached to repl-attach@" .. pid, 1, true), out)
    assert.truthy(out:find("corral[repl-attach]> ", 1, true), out)
    assert.truthy(pty.line_at(out, tostring(pid)), out)
    assert.truthy(pty.line_at(out, "deny"), out)
    local nosuch, _, status = pty.run(pty.CLEAN .. h.quote(HOST) .. " attach no-such-sandbox </dev/null")
    assert.are_not.equal(0, status)
    assert.is_nil(nosuch:find("attached", 1, true))
  end)

  it("why() reads a host of 4 or 16 characters as a name, never as a packed address", function()
    local pid = background_run("--id", "repl-why", "--allow", "pypi.org:443", "--", "sleep", "30")
    local out, code = pty.repl("attach repl-why", {
      'print("A", why("host:443").reason)\n',
      'print("B", why("api.example.test:443").reason)\n',
      'print("C", allow("api.example.test:443").allowed)\n', 1,
      'local w = why("api.example.test:443"); print("D", w.verdict, w.entry, w.dns)\n',
      'print("E", why("104.111.115.116:443").reason)\n', -- control: an address stays one
      -- one argument is the destination, never an id: without a port, or out of range, refused
      'print("F", why("example.test"))\n', 'print("G", why("https://example.test"))\n',
      'print("H", why("[::1]"))\n', 'print("I", why("example.test:99999"))\n',
      'print("J", why("[::1]:443").verdict)\n', -- control: with its port, the same kind of host is asked
      "os.exit(0)\n" })
    assert.are.equal(0, code, out)
    assert.truthy(out:find("attached to repl-why@" .. pid, 1, true), out)
    assert.truthy(out:find("\nA\thost port 443: host is not in the allowlist", 1, true), out)
    assert.truthy(out:find("\nB\tapi.example.test port 443: api.example.test is not in the allowlist", 1, true), out)
    assert.truthy(out:find("\nC\tapi.example.test:443", 1, true), out)
    assert.truthy(out:find("\nD\tallow\tapi.example.test:443\tanswered (a synthetic address)", 1, true), out)
    assert.truthy(out:find("\nE\t104.111.115.116 port 443: 104.111.115.116 is not in the allowlist", 1, true), out)
    assert.is_nil(out:find("6170:692e", 1, true), out)
    for _, l in ipairs({ "F\tnil\texample.test: give host:port", "G\tnil\thttps://example.test: give host:port",
                         "H\tnil\t[::1]: give host:port", "I\tnil\texample.test:99999: port 99999 is not one of 1 " ..
                         "to 65535", "J\tdeny" }) do
      assert.truthy(out:find("\n" .. l, 1, true), l .. " in " .. out)
    end
    assert.is_nil(out:find("no live sandbox", 1, true), out)
  end)

  it("refuses a peer of another uid (SO_PEERCRED), answers the owner on the same socket", function()
    local pid, _, sock = background_run("--id", "repl-cred", "--", "sleep", "30")
    -- With the directory and the file modes out of the way (a hard link to the socket in
    -- a directory anyone may enter, mode 0666), SO_PEERCRED alone stands between them.
    local d = assert(core.fs.mkdtemp("/run/corral-test-cred-"))
    defer(function() os.execute("rm -rf " .. h.quote(d)) end)
    core.fs.chmod(d, tonumber("755", 8))
    h.must("ln " .. h.quote(sock) .. " " .. h.quote(d .. "/s.sock") .. " && chmod 666 " .. h.quote(d .. "/s.sock"))
    local ask = "echo '{\"op\":\"info\"}' | %s socat -t 3 - UNIX-CONNECT:" .. h.quote(d .. "/s.sock")
    local other = h.sh(string.format(ask, "setpriv --reuid=65534 --regid=65534 --clear-groups"))
    assert.matches('"ok":false', other, 1, true)
    assert.matches("refused: uid 65534 is neither this sandbox's owner", other, 1, true)
    assert.is_nil(other:find("repl-cred", 1, true))
    local owner = h.sh(string.format(ask, ""))
    assert.matches('"ok":true', owner, 1, true)
    assert.matches('"id":"repl-cred"', owner, 1, true)
    assert.matches('"pid":' .. pid .. "[,}]", owner)
  end)

  -- #alone (scripts/shard-specs): any other run's sweep would remove what the kill left
  it("leaves no registration after a run ends: normally, by error, by SIGTERM; SIGKILL's is swept #alone",
    function()
    -- normal end
    local d = tempdir()
    local out, status = h.sh(string.format("echo $$ > %s/pid; exec %s run -- true", d, h.quote(HOST)))
    assert.are.equal(0, status, out)
    local pid = tonumber(h.read(d .. "/pid"):match("%d+"))
    assert.are.same({}, registrations(pid))
    -- a command that cannot run
    out, status = h.sh(string.format("echo $$ > %s/pid; exec %s run -- /no/such/command", d, h.quote(HOST)))
    assert.are_not.equal(0, status, out)
    pid = tonumber(h.read(d .. "/pid"):match("%d+"))
    assert.are.same({}, registrations(pid))
    -- SIGTERM: forwarded, the run ends the ordinary way
    local term = background_run("--id", "repl-term", "--", "sleep", "30")
    assert.are.equal(1, #registrations(term)) -- control: registered while it runs
    os.execute("kill -TERM " .. term)
    assert(gone(term), "SIGTERM did not end the run")
    assert.are.same({}, registrations(term))
    -- SIGKILL: nothing runs in the killed process; the next run sweeps what it left
    local killed = background_run("--id", "repl-kill", "--", "sleep", "30")
    os.execute("kill -KILL " .. killed)
    assert(gone(killed), "SIGKILL did not end the run")
    assert.are.equal(1, #registrations(killed)) -- left behind
    out, status = h.corral("run", "--", "true")
    assert.are.equal(0, status, out)
    assert.are.same({}, registrations(killed))
  end)
end)

describe("conformance() in the REPL #root", function()
  it("runs the suite and returns the report, printed as a table the console reads back", function()
    local out, code = pty.repl("-i", { 'conformance("native", {only = "privilege"})\n', "os.exit(0)\n" }, nil, 60)
    assert.are.equal(0, code, out)
    -- the printed result is a Lua constructor: between the call's echo and the next prompt
    local text = out:match('corral> conformance%("native", {only = "privilege"}%)\n(.-)\ncorral> ')
    assert.truthy(text, out)
    local report = assert(load("return " .. text, "=printed", "t", {}))()
    assert.are.equal("native", report.mechanism)
    local ids = {}
    for _, c in ipairs(require("corral.conformance").checks("privilege")) do ids[#ids + 1] = c.id end
    assert.are.equal(#ids, #report.results)
    for i, r in ipairs(report.results) do
      assert.are.equal(ids[i], r.id)
      assert.are.equal("held", r.outcome, r.id .. ": " .. tostring(r.detail))
    end
    assert.are.same({ breached = 0, held = #ids, total = #ids, unavailable = 0, void = 0 },
      report.census.groups.privilege)
    assert.are.equal(#ids, report.census.held)
    assert.is_nil(report.census.groups.filesystem) -- only the group asked for ran
  end)
end)

describe("a destination asked about (why)", function()
  local control = require "corral.control"

  it("takes an allowlist entry's udp: or tcp: prefix, and nothing else for one", function()
    assert.are.same({ name = "echo.test", port = 9007, protocol = "udp" }, control.parse_dest("udp:echo.test:9007"))
    assert.are.same({ ip = "10.0.0.1", port = 53, protocol = "udp" }, control.parse_dest("udp:10.0.0.1:53"))
    assert.are.same({ ip = "::1", port = 53, protocol = "udp" }, control.parse_dest("udp:[::1]:53"))
    assert.are.same({ name = "echo.test", port = 80, protocol = "tcp" }, control.parse_dest("tcp:echo.test:80"))
    -- no destination after it: the host named udp
    assert.are.same({ name = "udp", port = 53, protocol = "tcp" }, control.parse_dest("udp:53"))
    local q, err = control.parse_dest("udp:echo.test:0")
    assert.is_nil(q)
    assert.are.equal("udp:echo.test:0: port 0 is not one of 1 to 65535", err)
    q, err = control.parse_dest("quic:echo.test:443")
    assert.is_nil(q)
    assert.matches("^quic:echo.test:443: give host:port", err)
  end)
end)
