-- UDP by policy, end to end: `--allow udp:NAME:PORT` relays datagram flows through the
-- real ruleset (TPROXY, the mark route), the relay and a socket on the host, to UDP echo
-- servers this spec starts in its own test "internet" netns, each of which also appends
-- every datagram it receives to a log. Each denial — a name not allowed, a port not
-- allowed, an IP literal, UDP to a name only a TCP entry grants, a flow past the cap —
-- runs before a control that must echo in the same run, and the servers' logs show that
-- nothing denied ever arrived.
local json = require "dkjson"
local h = require "helpers"
local internet = require "internet"

-- A tenant's UDP client (python3): each argument is one step.
--   u TAG HOST PORT [4|6] [SIZE]    a fresh socket sends TAG (padded to SIZE bytes) and
--                                   prints "TAG echo" if the same datagram comes back
--                                   within 1.5 s, else "TAG none: why"
--   k TAG SOCK HOST PORT [4|6]      the same through socket SOCK (kept between steps)
--   sleep SECONDS
local CLIENT = [==[
import socket, sys, time
socks = {}
def fam(f):
    return {"4": socket.AF_INET, "6": socket.AF_INET6}.get(f, 0)
def send(tag, s, host, port, f, size):
    try:
        ai = socket.getaddrinfo(host, int(port), fam(f), socket.SOCK_DGRAM)[0]
        if s is None:
            s = socket.socket(ai[0], socket.SOCK_DGRAM)
        s.settimeout(1.5)
        data = tag.encode()
        data = data + b"." * max(0, size - len(data))
        s.sendto(data, ai[4])
        got, src = s.recvfrom(65536)
        print(tag, "echo" if got == data else "wrong", src[0], src[1], flush=True)
    except Exception as e:
        print(tag, "none:", e, flush=True)
    return s
for step in sys.argv[1:]:
    w = step.split()
    if w[0] == "sleep":
        time.sleep(float(w[1]))
    elif w[0] == "u":
        send(w[1], None, w[2], w[3], w[4] if len(w) > 4 else "", int(w[5]) if len(w) > 5 else 0)
    elif w[0] == "k":
        socks[w[2]] = send(w[1], socks.get(w[2]), w[3], w[4], w[5] if len(w) > 5 else "", 0)
]==]

local ECHO, QUIC = 9553, 443

describe("egress udp: the summary's words and the learned lines", function()
  local summary = require "corral.egress.summary"
  local learn = require "corral.egress.learn"

  it("names a UDP denial as its udp: entry, with the flag that would change it", function()
    assert.are.equal("denied udp:api.test:443 (api.test is allowed for TCP only; --allow udp:api.test:443 would)",
      summary.line({ kind = "udp", protocol = "udp", verdict = "deny", name = "api.test", port = 443,
        reason = "udp to api.test port 443: api.test is allowed only for TCP (ports 443), not UDP" }))
    assert.are.equal("denied udp:evil.test:123 (no entry names it; --allow udp:evil.test:123 would)",
      summary.line({ kind = "udp", protocol = "udp", verdict = "deny", name = "evil.test", port = 123,
        reason = "udp to evil.test port 123: evil.test is not in the allowlist" }))
    assert.are.equal("denied udp:ntp.test:124 (port not allowed for ntp.test; --allow udp:ntp.test:124 would)",
      summary.line({ kind = "udp", protocol = "udp", verdict = "deny", name = "ntp.test", port = 124, by = "ruleset",
        reason = "udp to ntp.test port 124: ntp.test is allowed only on ports 123 (refused by the ruleset)" }))
    assert.are.equal("failed udp:ntp.test:123 (upstream refused 10.1.2.3)",
      summary.line({ kind = "udp_closed", protocol = "udp", verdict = "allow", name = "ntp.test", port = 123,
        upstream = "10.1.2.3", bytes_down = 0, reason = "idle for 120 s; upstream: Connection refused" }))
    -- no entry can open multicast: no option is offered for it (an address that is not
    -- special is offered its entry: the evil.test line above, and this control)
    assert.are.equal("denied udp:224.0.0.251:9553 (multicast, 224.0.0.0/4: never a destination)",
      summary.line({ kind = "udp", protocol = "udp", verdict = "deny", ip = "224.0.0.251", port = 9553, by = "ruleset",
        reason = "udp to 224.0.0.251 port 9553: 224.0.0.251 is not in the allowlist (refused by the ruleset)" }))
    assert.are.equal("denied udp:203.0.113.9:9553 (no entry names it; --allow udp:203.0.113.9:9553 would)",
      summary.line({ kind = "udp", protocol = "udp", verdict = "deny", ip = "203.0.113.9", port = 9553,
        reason = "udp to 203.0.113.9 port 9553: 203.0.113.9 is not in the allowlist" }))
    -- controls: a flow that went as asked is not a line, nor one that was answered
    assert.is_nil(summary.line({ kind = "udp", protocol = "udp", verdict = "allow", name = "ntp.test", port = 123 }))
    assert.is_nil(summary.line({ kind = "udp_closed", protocol = "udp", verdict = "allow", name = "ntp.test",
      port = 123, bytes_down = 48, reason = "idle for 120 s; upstream: Connection refused" }))
  end)

  it("keeps each protocol's ports apart in the ruleset's plan", function()
    local ruleset = require "corral.egress.ruleset"
    local allowlist = require "corral.egress.allowlist"
    local function policy(list, extra)
      local p = { allowlist = list and assert(allowlist.parse(list)) }
      for k, v in pairs(extra or {}) do p[k] = v end
      return p
    end
    local p = policy({ "api.test:443", "udp:ntp.test:123", "udp:api.test:443,8443", "udp:x.test:5000-5010" })
    assert.are.same({ { 443, 443 } }, ruleset.tcp_ports(p))
    assert.are.same({ { 123, 123 }, { 443, 443 }, { 5000, 5010 }, { 8443, 8443 } }, ruleset.udp_ports(p))
    assert.is_false(ruleset.tcp_ports(policy({ "udp:ntp.test:123" }))) -- UDP entries alone: no TCP at all
    assert.is_false(ruleset.udp_ports(policy({ "api.test" })))            -- and TCP alone: no relay
    assert.is_false(ruleset.udp_ports(policy(nil, { decide = function() return true end }))) -- a hook opens no UDP
    local many = {}
    for i = 1, 17 do many[i] = "udp:ntp.test:" .. (1000 + 2 * i) end
    assert.is_nil(ruleset.udp_ports(policy(many))) -- past the ruleset's 16 ranges: every port, each decided
    -- the plan: the plane's own UDP ports unless given, an explicit nil (every port) included
    local pl = { dns_port = 1, acceptor_port = 2, udp = { port = 9 }, udp_ports = { { 123, 123 } } }
    assert.are.same({ { 123, 123 } }, ruleset.plan(pl, false).udp_ports)
    local every = ruleset.plan(pl, false, nil)
    assert.are.equal(9, every.udp_port)
    assert.is_nil(every.udp_ports)
    assert.is_nil(ruleset.plan(pl, false, false).udp_port) -- no UDP: no relay in the plan
  end)

  it("learns a denied UDP flow as udp:NAME:PORT, with its count, next to the TCP lines", function()
    local text = learn.render({ order = { "api.test:443", "udp:ntp.test:123" },
      wanted = { ["api.test:443"] = 2, ["udp:ntp.test:123"] = 1 }, names = {}, connected = {} })
    assert.matches("\napi%.test:443  # tcp, 2 connections\nudp:ntp%.test:123  # udp, 1 flow\n", text)
  end)

  it("lists only what --allow-file takes back: a name or port it would refuse is a comment saying why", function()
    -- found by the learn fuzz target (tests/fuzz/corpus/learn): in learn mode every
    -- hostname is answered, a single-label one too, and one refused line refused the file
    local seen = { order = { "api.test:443", "db:5432", "udp:dns.test:53" },
      wanted = { ["api.test:443"] = 1, ["db:5432"] = 3, ["udp:dns.test:53"] = 1 }, names = {}, connected = {} }
    local text, listed = learn.render(seen)
    assert.are.equal(1, listed)
    assert.matches("\n# db:5432  # tcp, 3 connections; not an entry %-%-allow%-file takes: .*single%-label", text)
    assert.matches("\n# udp:dns%.test:53  # udp, 1 flow; not an entry %-%-allow%-file takes: .*port 53", text)
    local path = os.tmpname()
    h.write(path, text)
    local network, err = require("corral.egress.run_options").network({ ["allow-file"] = path })
    os.remove(path)
    assert.is_nil(err)
    assert.are.same({ "api.test:443" }, network.allow)
    -- the control: the same refused entry as a line of its own refuses the whole file
    local bare = os.tmpname()
    h.write(bare, "api.test:443\ndb:5432\n")
    local none, why = require("corral.egress.run_options").network({ ["allow-file"] = bare })
    os.remove(bare)
    assert.is_nil(none)
    assert.matches("single%-label", tostring(why))
  end)
end)

describe("egress udp #root #netns", function()
  local net

  -- An echo server on port in the internet's netns that logs each datagram it receives.
  local function echo_server(port)
    local cmd = string.format("ip netns exec %s socat UDP6-RECVFROM:%d,ipv6only=0,fork " ..
      "SYSTEM:'tee -a %s/udp%d.log' >/dev/null 2>&1 &", net.ns, port, net.dir, port)
    h.must(cmd)
  end

  setup(function()
    net = internet.start()
    echo_server(ECHO)
    echo_server(QUIC)
    assert(h.wait_for(function()
      return select(2, h.sh(string.format("ip netns exec %s ss -lun | grep -q ':%d ' && ip netns exec %s " ..
        "ss -lun | grep -q ':%d '", net.ns, ECHO, net.ns, QUIC))) == 0
    end, 5), "echo servers did not start")
  end)
  teardown(function() if net then internet.stop(net) end end)

  local function server_log(port) return h.read(string.format("%s/udp%d.log", net.dir, port)) or "" end

  local function common()
    return { "--internal", net.cidr, "--internal", net.cidr6,
      "--resolve", "echo.test=" .. net.ip, "--resolve", "echo.test=" .. net.ip6,
      "--resolve", "tcponly.test=" .. net.ip, "--resolve", "quic.test=" .. net.ip,
      "--allow", "udp:echo.test:" .. ECHO, "--allow", "udp:[" .. net.ip6 .. "]:" .. ECHO,
      "--allow", "tcponly.test:" .. ECHO, "--allow", "udp:quic.test:" .. QUIC }
  end

  -- Runs the client's steps in a tenant under `corral run` with the common allowlist and
  -- `extra` arguments; answers its output, its status and the decisions logged.
  local function run(steps, extra, base)
    local log = net.dir .. "/decisions-" .. tostring(math.random(1e9)) .. ".jsonl"
    local argv = { "run", "--log-json", log }
    for _, a in ipairs(base or common()) do argv[#argv + 1] = a end
    for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
    for _, a in ipairs({ "--", "python3", "-c", CLIENT }) do argv[#argv + 1] = a end
    for _, s in ipairs(steps) do argv[#argv + 1] = s end
    local out, status = h.corral(table.unpack(argv))
    local evs = {}
    for line in (h.read(log) or ""):gmatch("[^\n]+") do evs[#evs + 1] = assert(json.decode(line), line) end
    os.remove(log)
    return out, status, evs
  end

  -- What the client printed for step TAG (the rest of its line).
  local function line_of(out, tag)
    for line in out:gmatch("[^\n]+") do
      if line:sub(1, #tag + 1) == tag .. " " then return line:sub(#tag + 2) end
    end
  end

  local function find(evs, pred)
    for i, e in ipairs(evs) do
      if pred(e) then return e, i end
    end
  end

  it("drops a name not allowed, a port not allowed, an IP literal, a TCP-only name; then echoes (control)", function()
    local before = server_log(ECHO)
    local out, status, evs = run({
      "u a-evil evil.test " .. ECHO,
      "u a-port echo.test " .. (ECHO + 1) .. " 4",
      "u a-literal " .. net.ip .. " " .. ECHO,
      "u a-tcponly tcponly.test " .. ECHO,
      "u c-v4 echo.test " .. ECHO .. " 4",
      "u c-v6 echo.test " .. ECHO .. " 6",
      "u c-literal6 " .. net.ip6 .. " " .. ECHO,
    })
    assert.are.equal(0, status, out)
    for _, tag in ipairs({ "a-evil", "a-port", "a-literal", "a-tcponly" }) do
      assert.matches("^none", line_of(out, tag) or "", nil, tag .. ": " .. out)
    end
    -- controls, after the attempts: each echoed from the address it was sent to
    assert.matches("^echo 198%.1[89]%.%d+%.%d+ " .. ECHO, line_of(out, "c-v4") or "", nil, out)
    assert.matches("^echo 64:ff9b:1::", line_of(out, "c-v6") or "", nil, out)
    assert.are.equal("echo " .. net.ip6 .. " " .. ECHO, line_of(out, "c-literal6"), out)
    local got = server_log(ECHO):sub(#before + 1)
    for _, tag in ipairs({ "a-evil", "a-port", "a-literal", "a-tcponly" }) do
      assert.is_nil(got:find(tag, 1, true), tag .. " reached the server: " .. got)
    end
    assert.truthy(got:find("c-v4", 1, true) and got:find("c-v6", 1, true), got)

    -- each decision is logged: the denials with their reasons, the flows with their bytes
    local tcponly = find(evs, function(e) return e.kind == "udp" and e.name == "tcponly.test" end)
    assert.truthy(tcponly and tcponly.verdict == "deny" and tcponly.reason:find("allowed only for TCP", 1, true),
      json.encode(evs))
    local literal = find(evs, function(e) return e.kind == "udp" and e.ip == net.ip end)
    assert.truthy(literal and literal.verdict == "deny" and literal.reason:find("not in the allowlist", 1, true),
      json.encode(evs))
    local port = find(evs, function(e) return e.kind == "udp" and e.port == ECHO + 1 end)
    assert.truthy(port and port.verdict == "deny" and port.by == "ruleset" and port.count >= 1
      and port.name == "echo.test" and port.reason:find("allowed only on ports " .. ECHO, 1, true), json.encode(evs))
    local evil = find(evs, function(e) return e.kind == "dns" and e.name == "evil.test" end)
    assert.truthy(evil and evil.verdict == "deny", json.encode(evs))
    local allowed = 0
    for _, e in ipairs(evs) do
      assert.are_not.equal("evil.test", e.kind ~= "dns" and e.name or nil)
      if e.kind == "udp" and e.verdict == "allow" then
        allowed = allowed + 1
        assert.truthy(e.protocol == "udp" and e.upstream and e.entry, json.encode(e))
      end
      if e.kind == "udp_closed" then
        assert.are.equal("allow", e.verdict)
        assert.truthy(e.bytes > 0 and e.bytes == e.bytes_up + e.bytes_down and e.bytes_up == e.bytes_down,
          json.encode(e))
        assert.are.equal("the sandbox ended", e.reason)
      end
    end
    assert.are.equal(3, allowed, json.encode(evs))
    -- the stderr summary names each denial in words, with the flag that would change it
    assert.truthy(out:find("denied udp:echo.test:" .. (ECHO + 1) .. " (port not allowed for echo.test; --allow "
      .. "udp:echo.test:" .. (ECHO + 1) .. " would)", 1, true), out)
    assert.truthy(out:find("denied udp:tcponly.test:" .. ECHO .. " (tcponly.test is allowed for TCP only; --allow "
      .. "udp:tcponly.test:" .. ECHO .. " would)", 1, true), out)
  end)

  it("refuses multicast at the ruleset and logs each; then echoes (control)", function()
    -- marked for the relay, a multicast datagram was dropped by the kernel on its way
    -- back in through lo, before the relay saw it: refused, but never logged
    local before = server_log(ECHO)
    local out, status, evs = run({
      "u a-mcast4 224.0.0.251 " .. ECHO .. " 4",
      "u a-mcast6 ff05::1 " .. ECHO .. " 6",
      "u c-after echo.test " .. ECHO .. " 4",
    })
    assert.are.equal(0, status, out)
    assert.matches("^none", line_of(out, "a-mcast4") or "", nil, out)
    assert.matches("^none", line_of(out, "a-mcast6") or "", nil, out)
    assert.matches("^echo", line_of(out, "c-after") or "", nil, out)
    for _, ip in ipairs({ "224.0.0.251", "ff05::1" }) do
      local e = find(evs, function(x) return x.kind == "udp" and x.ip == ip end)
      assert.truthy(e and e.verdict == "deny" and e.by == "ruleset" and e.port == ECHO and e.count == 1,
        ip .. ": " .. json.encode(evs))
    end
    assert.is_nil(server_log(ECHO):sub(#before + 1):find("a-mcast", 1, true))
  end)

  it("relays a QUIC-sized datagram to port 443 and never the same name's TCP (a udp: entry is UDP only)", function()
    local before = server_log(QUIC)
    local out, status = run({ "u q-initial quic.test " .. QUIC .. " 4 1200" },
      { "--resolve", "tcp.test=" .. net.ip, "--allow", "tcp.test:" .. net.http_port })
    assert.are.equal(0, status, out)
    assert.matches("^echo ", line_of(out, "q-initial") or "", nil, out)
    assert.truthy(server_log(QUIC):sub(#before + 1):find("q-initial", 1, true))
    -- attempt: TCP to the name the udp: entry names; control: a TCP entry's name
    local argv = { "run" }
    for _, a in ipairs(common()) do argv[#argv + 1] = a end
    for _, a in ipairs({ "--resolve", "tcp.test=" .. net.ip, "--allow", "tcp.test:" .. net.http_port, "--", "sh",
      "-c", h.attempt_then_control("curl -sS --max-time 3 http://quic.test:" .. QUIC .. "/",
        "curl -sS --max-time 5 http://tcp.test:" .. net.http_port .. "/index.html") }) do
      argv[#argv + 1] = a
    end
    out = h.corral(table.unpack(argv))
    local rc = h.after_attempt(out, "hello%-from%-the%-internet")
    h.assert_refused(rc, out)
  end)

  it("ends a flow after --udp-idle of silence, logged with its bytes; its next datagram is a new flow", function()
    local out, status, evs = run({
      "k i-first s echo.test " .. ECHO .. " 4", "sleep 2.5", "k i-second s echo.test " .. ECHO .. " 4",
    }, { "--udp-idle", "1" })
    assert.are.equal(0, status, out)
    assert.matches("^echo", line_of(out, "i-first") or "", nil, out)
    assert.matches("^echo", line_of(out, "i-second") or "", nil, out)
    local first, i = find(evs, function(e) return e.kind == "udp" and e.verdict == "allow" end)
    local closed, j = find(evs, function(e) return e.kind == "udp_closed" end)
    assert.truthy(first and closed, json.encode(evs))
    assert.are.equal("idle for 1 s", closed.reason)
    assert.are.equal(#"i-first" * 2, closed.bytes)
    assert.are.equal(2, closed.count)
    local second = find(evs, function(e) return e.kind == "udp" and e.verdict == "allow" and e ~= first end)
    assert.truthy(second, json.encode(evs))
    assert.truthy(i < j and j < select(2, find(evs, function(e) return e == second end)), json.encode(evs))
  end)

  it("refuses a flow past --max-udp-flows while the first is open; the first still echoes (control)", function()
    local before = server_log(ECHO)
    local out, status, evs = run({
      "k m-one one echo.test " .. ECHO .. " 4",
      "k m-two two echo.test " .. ECHO .. " 4",
      "k m-one-again one echo.test " .. ECHO .. " 4",
    }, { "--max-udp-flows", "1" })
    assert.are.equal(0, status, out)
    assert.matches("^echo", line_of(out, "m-one") or "", nil, out)
    assert.matches("^none", line_of(out, "m-two") or "", nil, out)
    assert.matches("^echo", line_of(out, "m-one-again") or "", nil, out)
    local got = server_log(ECHO):sub(#before + 1)
    assert.is_nil(got:find("m-two", 1, true), got)
    local cap = find(evs, function(e) return e.kind == "udp" and e.verdict == "deny" end)
    assert.truthy(cap and cap.reason:find("UDP flow cap reached (1", 1, true), json.encode(evs))
  end)

  it("learns udp:NAME:PORT from what a program sent, and the learned file then lets it run", function()
    local file = net.dir .. "/learned.txt"
    local base = { "--internal", net.cidr, "--resolve", "echo.test=" .. net.ip }
    local out, status = run({ "u l-learn echo.test " .. ECHO .. " 4" }, { "--learn", file }, base)
    assert.are.equal(0, status, out)
    assert.matches("^none", line_of(out, "l-learn") or "", nil, out)
    local learned = h.read(file) or ""
    assert.matches("\nudp:echo%.test:" .. ECHO .. "  # udp, 1 flow\n", learned)
    -- control: the suggested list, as written, lets the same program through
    out, status = run({ "u l-control echo.test " .. ECHO .. " 4" }, { "--allow-file", file }, base)
    assert.are.equal(0, status, out)
    assert.matches("^echo", line_of(out, "l-control") or "", nil, out)
  end)
end)

-- The plane itself, driven from Lua: a tenant's socket made in the sandbox's netns, an
-- echo socket of this test on the host's loopback, the live policy changed under them.
describe("egress udp: the plane under policy changes #root #netns", function()
  local core = require "corral.core"
  local egress = require "corral.egress"
  local events = require "corral.egress.events"
  local loop = require "corral.egress.loop"
  local plane = require "corral.egress.plane"

  local host_ns, echo, echo_port, got
  setup(function()
    host_ns = assert(core.rtnl.netns_open("/proc/self/ns/net"))
    echo, echo_port = assert(core.listen.in_netns(host_ns, "udp", "127.0.0.1", 0))
  end)
  teardown(function()
    if echo then echo:close() end
    if host_ns then host_ns:close() end
  end)

  -- The echo server's turn: each datagram is recorded and sent back.
  local function serve()
    while true do
      local data, addr, port = core.udp.recv(echo)
      if not data then return end
      got[#got + 1] = data
      core.udp.send(echo, data, addr, port)
    end
  end

  local function pump(cond, seconds)
    local deadline = core.clock.monotime() + (seconds or 2)
    repeat
      loop.step(0.01)
      serve()
      if cond() then return true end
    until core.clock.monotime() > deadline
    return false
  end

  -- Sends msg from the tenant's socket s to ip:port (the echo server's unless given);
  -- answers whether it came back.
  local function echoes(s, ip, msg, port)
    local sent = core.udp.send(s, msg, ip, port or echo_port)
    if not sent then return false end
    local back
    pump(function() back = core.udp.recv(s); return back ~= nil end, 1.5)
    return back == msg
  end

  -- The far end of a sandbox's link: a netns of its own, corral-t-NAME-N on
  -- 10.SUBNET.N.0/24 (gw .1, the sandbox .2), a socat on each of ports appending every
  -- datagram it receives to one log.
  local function link_peer(name, subnet, ports)
    local n = h.own_pid() % 200 + 20
    local prefix = "10." .. subnet .. "." .. n
    local peer = { ns = "corral-t-" .. name .. "-" .. n, gw = prefix .. ".1", mine = prefix .. ".2",
      cidr = prefix .. ".0/24", ports = ports, log = os.tmpname() }
    h.sh("ip netns del " .. peer.ns .. " 2>/dev/null")
    h.must("ip netns add " .. peer.ns .. " && ip netns exec " .. peer.ns .. " ip link set lo up")
    for _, port in ipairs(ports) do
      h.must(string.format("ip netns exec %s socat UDP4-RECVFROM:%d,fork SYSTEM:'tee -a %s' >/dev/null 2>&1 &",
        peer.ns, port, peer.log))
    end
    return peer
  end

  -- A network allowing allow, linked to peer.
  local function linked(peer, allow)
    return { allow = allow, internal = { peer.cidr }, link = { peer_netns = "/run/netns/" .. peer.ns,
      address = peer.mine .. "/24", gateway = peer.gw, peer_address = peer.gw .. "/24" } }
  end

  local function peer_listening(peer)
    assert(h.wait_for(function()
      for _, port in ipairs(peer.ports) do
        if select(2, h.sh("ip netns exec " .. peer.ns .. " ss -lun | grep -q ':" .. port .. " '")) ~= 0 then
          return false
        end
      end
      return true
    end, 5), "the link peer's servers did not start")
  end

  -- Ends peer (its servers, its netns); answers what its servers received.
  local function peer_stop(peer)
    h.sh("ip netns pids " .. peer.ns .. " | xargs -r kill; ip netns del " .. peer.ns)
    local received = h.read(peer.log) or ""
    os.remove(peer.log)
    return received
  end

  local function network(allow)
    return { allow = allow, internal = { "127.0.0.0/8" },
      resolve = { ["a.test"] = "127.0.0.1", ["b.test"] = "127.0.0.1" } }
  end

  it("starts the relay when a udp: entry is allowed live, and revoke {cut = true} ends the flow", function()
    got = {}
    local seen = {}
    local function collect(ev) if ev.sandbox == "udp-live" then seen[#seen + 1] = ev end end
    events.subscribe(collect)
    local p = assert(plane.new("udp-live", network({ "a.test:443", "udp:b.test:" .. echo_port })))
    loop.add(p)
    local ok, err = pcall(function()
      local a = assert(egress.address("udp-live", "a.test"))
      local b = assert(egress.address("udp-live", "b.test"))
      local s = assert(core.listen.in_netns(p.netns, "udp", "127.0.0.1", 0))
      local s2 = assert(core.listen.in_netns(p.netns, "udp", "127.0.0.1", 0))
      -- attempt: a.test has a TCP entry only
      assert.is_false(echoes(s, a, "a-before"))
      assert.is_true(echoes(s2, b, "b-1")) -- control
      assert(egress.allow("udp-live", "udp:a.test:" .. echo_port))
      assert.is_true(echoes(s, a, "a-after")) -- the next flow is decided with the new entry
      assert.is_true(echoes(s, a, "a-again"))
      assert.are.equal(2, p.udp:count())
      -- cut: a's flow ends at once, logged as a UDP cut with its bytes; b's carries on
      local n, cut = egress.revoke("udp-live", "udp:a.test:" .. echo_port, { cut = true })
      assert.are.equal(1, n)
      assert.are.equal(1, cut)
      assert.is_false(echoes(s, a, "a-cut"))
      assert.is_true(echoes(s2, b, "b-2")) -- control, after it
      s:close(); s2:close()
    end)
    loop.remove(p)
    p:close()
    events.unsubscribe(collect)
    assert(ok, err)
    local text = table.concat(got, " ")
    for _, never in ipairs({ "a-before", "a-cut" }) do assert.is_nil(text:find(never, 1, true), text) end
    local cut = false
    for _, e in ipairs(seen) do
      if e.kind == "cut" and e.protocol == "udp" and e.name == "a.test" then
        cut = e.bytes == #"a-after" * 2 + #"a-again" * 2 and e.reason:find("allowed only for TCP", 1, true) ~= nil
      end
    end
    assert.is_true(cut, require("dkjson").encode(seen))
  end)

  it("with a link, relays from it on a marked socket; a datagram whose mark route is gone never leaves", function()
    local peer = link_peer("udplink", 81, { 9557 })
    local p
    local ok, err = pcall(function()
      p = assert(plane.new("udp-link", linked(peer, { "udp:" .. peer.gw .. ":9557" })))
      loop.add(p)
      peer_listening(peer)
      local s = assert(core.listen.in_netns(p.netns, "udp", "0.0.0.0", 0))
      -- attempt: the mark's route gone, the marked datagram would take the link's route
      local nsx = "nsenter --net=/proc/" .. core.proc.getpid() .. "/fd/" .. p.netns:fileno() .. " "
      h.must(nsx .. "ip rule del fwmark 43 lookup 43")
      assert.is_false(echoes(s, peer.gw, "link-unrouted", 9557))
      h.must(nsx .. "ip rule add fwmark 43 lookup 43 pref 100")
      assert.is_true(echoes(s, peer.gw, "link-control", 9557)) -- control: through the relay, out of the link
      s:close()
    end)
    if p then loop.remove(p); p:close() end
    local seen = peer_stop(peer)
    assert(ok, err)
    assert.is_nil(seen:find("link-unrouted", 1, true), seen)
    assert.truthy(seen:find("link-control", 1, true), seen)
  end)

  it("with a link, a cut flow's next datagram never takes the link's route; another entry's flow does (control)",
    function()
    -- The cut flow's conntrack entry stays established after the relay lets it go and the
    -- ruleset stops marking its port; accepted as such, its datagrams would leave through
    -- the link straight to the destination, past the relay and the log.
    local peer = link_peer("udpcut", 82, { 9557, 9558 })
    local gw = peer.gw
    local seen = {}
    local function collect(ev) if ev.sandbox == "udp-cut" then seen[#seen + 1] = ev end end
    events.subscribe(collect)
    local p
    local ok, err = pcall(function()
      p = assert(plane.new("udp-cut", linked(peer, { "udp:" .. gw .. ":9557", "udp:" .. gw .. ":9558" })))
      loop.add(p)
      peer_listening(peer)
      local s = assert(core.listen.in_netns(p.netns, "udp", "0.0.0.0", 0))
      assert.is_true(echoes(s, gw, "cut-first", 9557))
      local revoked, cut = egress.revoke("udp-cut", "udp:" .. gw .. ":9557", { cut = true })
      assert.are.same({ 1, 1 }, { revoked, cut })
      assert.is_false(echoes(s, gw, "cut-after", 9557)) -- attempt: the same socket, the same destination
      assert.is_true(echoes(s, gw, "cut-control", 9558)) -- control, after it: the link and the relay still carry
      p:read_refused()
      s:close()
    end)
    if p then loop.remove(p); p:close() end
    events.unsubscribe(collect)
    local logged = peer_stop(peer)
    assert(ok, err)
    assert.is_nil(logged:find("cut-after", 1, true), logged)
    assert.truthy(logged:find("cut-control", 1, true), logged)
    local refused = false
    for _, e in ipairs(seen) do
      if e.kind == "udp" and e.by == "ruleset" and e.port == 9557 and e.verdict == "deny" then refused = true end
    end
    assert.is_true(refused, require("dkjson").encode(seen))
  end)

  it("200 plane create/destroy cycles with a UDP relay leave no fd, netns or table behind", function()
    local pid = core.proc.getpid()
    local function fds() return #h.sh("ls /proc/" .. pid .. "/fd"):gsub("[^\n]", "") end
    assert(plane.new("udp-cycle-0", network({ "udp:b.test:123" }))):close()
    collectgarbage()
    local f0 = fds()
    for i = 1, 200 do
      local p = assert(plane.new("udp-cycle-" .. i, network({ "udp:b.test:123" })))
      assert.is_table(p.udp) -- control: each made its relay
      p:close()
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(f0, fds())
  end)
end)
