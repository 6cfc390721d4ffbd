-- Egress allowlists end to end: real clients (curl, getent, nc, dig, perl) in a native
-- tenant, real servers in a test "internet" netns reached over a veth, the real
-- nftables redirect, acceptor, DNS responder and relay. Each denial runs before a control
-- that must still succeed in the same run, and a logging server shows nothing leaked out.
--
-- Run by root, the file starts the internet, runs every test, and then runs itself
-- again as an unprivileged user (helpers.TEST_UID, through setpriv) against the same
-- internet, which CORRAL_TEST_INTERNET names to that run. There the plane's netns belongs
-- to a user namespace of that user's own (docs/architecture.md, egress) and every test
-- must pass the same — the tenant's attempts to administer its netns included — except
-- the routed link, which needs root and must be refused by its flag's name.
local corral = require "corral"
local h = require "helpers"
local internet = require "internet"

local shared = os.getenv("CORRAL_TEST_INTERNET") -- set for the unprivileged re-run
local unprivileged = corral.core.proc.geteuid() ~= 0
local defined = 0 -- tests this file defines, for the re-run's count
local busted_it = it
local function it(name, fn)
  defined = defined + 1
  return busted_it(name, fn)
end

describe("egress #root #netns", function()
  local net, out_dir

  setup(function()
    net = shared and internet.decode(shared) or internet.start()
    out_dir = h.tmpdir("egress-out") -- the tests' own logs, writable by whoever runs them
  end)
  teardown(function()
    if net and not shared then internet.stop(net) end
    h.rmrf(out_dir)
  end)

  local function common()
    return { "--internal", net.cidr, "--internal", net.cidr6,
      "--resolve", "pypi.org=" .. net.ip, "--resolve", "api.example.com=" .. net.ip,
      "--resolve", "logger.test=" .. net.ip,
      "--allow", "pypi.org:8080", "--allow", "*.example.com:8080", "--allow", "logger.test:9444" }
  end

  -- Runs a tenant script under `corral run` with the common allowlist plus `extra` args.
  local function run(script, extra)
    local argv = { "run" }
    for _, a in ipairs(common()) do argv[#argv + 1] = a end
    for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
    argv[#argv + 1] = "--"
    for _, a in ipairs({ "sh", "-c", script }) do argv[#argv + 1] = a end
    return h.corral(table.unpack(argv))
  end

  local function logged() return h.read(net.dir .. "/tcp9444.log") or "" end

  -- A shell function that times a command in ms: `t curl …` prints "ms=N rc=R".
  local TIMED = 't() { s=$(date +%s%N); "$@" >/dev/null 2>&1; r=$?; ' ..
    'echo "ms=$(( ($(date +%s%N) - s) / 1000000 )) rc=$r"; }; '

  it("relays an allowed name on an allowed port byte-exact (control), and logs every decision", function()
    local log = out_dir .. "/exact.jsonl"
    local out, status = run('curl -sS --max-time 10 http://pypi.org:8080/blob | sha256sum; ' ..
      'curl -s --max-time 3 http://pypi.org:9444/ >/dev/null; exit 0', { "--log-json", log })
    assert.are.equal(0, status, out)
    assert.matches(net.blob_sha, out, 1, true)
    local json = require "dkjson"
    local closed, denied = nil, nil
    for line in (h.read(log) or ""):gmatch("[^\n]+") do
      local e = assert(json.decode(line), line)
      assert.truthy(e.verdict == "allow" or e.verdict == "deny", line)
      assert.are.equal("tenant", e.sandbox)
      if e.kind == "closed" and e.port == 8080 then closed = e end
      if e.kind == "connect" and e.port == 9444 and e.verdict == "deny" then denied = e end
    end
    assert.truthy(closed and closed.name == "pypi.org" and closed.bytes > 3000000, "no closing event with bytes")
    assert.truthy(denied and denied.reason:find("9444") and denied.ip, "no deny event with its reason")
    out = run('echo via-logger | nc -N -w 3 logger.test 9444; echo rc=$?')
    assert.matches("rc=0", out)
    assert(h.wait_for(function() return logged():find("via-logger", 1, true) end, 3), "control never arrived")
  end)

  it("refuses, fast, the same name on another port, other names, IP literals and lookalikes", function()
    local before = logged()
    local out = run(TIMED .. [[
      t curl -sS --max-time 5 http://pypi.org:9444/
      t curl -sS --max-time 5 http://evil.test:9444/
      t curl -sS --max-time 5 http://]] .. net.ip .. [[:9444/
      t curl -sS --max-time 5 'http://[]] .. net.ip6 .. [[]:9444/'
      t curl -sS --max-time 5 http://example.com.evil.test:8080/
      t curl -sS --max-time 5 http://evilexample.com:8080/
      t curl -sS --max-time 5 http://example.com:8080/
      t curl -sS --max-time 5 http://pypi.org:8080/index.html; echo control
      t curl -sS --max-time 5 http://api.example.com:8080/index.html; echo control2]])
    local lines = {}
    for ms, rc in out:gmatch("ms=(%d+) rc=(%d+)") do lines[#lines + 1] = { tonumber(ms), tonumber(rc) } end
    assert.are.equal(9, #lines, out)
    assert.are.equal(0, lines[8][2], "control, after the attempts: " .. out)
    assert.are.equal(0, lines[9][2], "control (wildcard): " .. out)
    for i = 1, 7 do
      assert.are_not.equal(0, lines[i][2], "attempt " .. i .. " succeeded: " .. out)
      assert.truthy(lines[i][1] < 2000, "attempt " .. i .. " was not refused fast: " .. out)
    end
    assert.are.equal(before, logged(), "a denied connection reached the internet")
  end)

  it("answers NXDOMAIN for names not allowed, REFUSED for their TXT/ANY/SRV/CNAME, NODATA for an allowed one's",
    function()
    local out = run([[
      dig +tries=1 +time=2 evil.test A | grep -o 'status: [A-Z]*'
      dig +tries=1 +time=2 example.com A | grep -o 'status: [A-Z]*'
      dig +notcp +tries=1 +time=2 evil.test TXT | grep -o 'status: [A-Z]*'
      dig +tries=1 +time=2 evil.test ANY | grep -o 'status: [A-Z]*'
      dig +notcp +tries=1 +time=2 pypi.org TXT | grep -o 'status: [A-Z]*\|ANSWER: [0-9]*'
      dig +tries=1 +time=2 pypi.org HTTPS | grep -o 'status: [A-Z]*\|ANSWER: [0-9]*'
      dig +tries=1 +time=2 evil.test SRV | grep -o 'status: [A-Z]*'
      dig +tries=1 +time=2 evil.test CNAME | grep -o 'status: [A-Z]*'
      dig +tries=1 +time=2 pypi.org SRV | grep -o 'status: [A-Z]*\|ANSWER: [0-9]*'
      dig +tcp +tries=1 +time=2 pypi.org CNAME | grep -o 'status: [A-Z]*\|ANSWER: [0-9]*'
      dig +short +tries=1 +time=2 pypi.org A | head -1
      dig +tcp +short +tries=1 +time=2 api.example.com A | head -1]])
    local l = {}
    for line in out:gmatch("[^\n]+") do l[#l + 1] = line end
    assert.are.equal("status: NXDOMAIN", l[1], out)
    assert.are.equal("status: NXDOMAIN", l[2], out)
    assert.are.equal("status: REFUSED", l[3], out)
    assert.are.equal("status: REFUSED", l[4], out)
    assert.are.same({ "status: NOERROR", "ANSWER: 0", "status: NOERROR", "ANSWER: 0" }, { l[5], l[6], l[7], l[8] }, out)
    assert.are.equal("status: REFUSED", l[9], out)  -- SRV and CNAME of a name not allowed
    assert.are.equal("status: REFUSED", l[10], out)
    -- SRV and CNAME of an allowed name: NODATA (no such record here), over UDP and TCP
    assert.are.same({ "status: NOERROR", "ANSWER: 0", "status: NOERROR", "ANSWER: 0" }, { l[11], l[12], l[13], l[14] },
      out)
    assert.matches("^198%.1[89]%.", l[15], nil, out) -- controls, after the attempts
    assert.matches("^198%.1[89]%.", l[16], nil, out)
  end)

  -- glibc answers an AI_ADDRCONFIG lookup for IPv4 only when some interface holds an IPv4
  -- address other than 127.0.0.1: the sandbox's lo holds 127.0.0.2 for it.
  it("answers an IPv4-only lookup with AI_ADDRCONFIG (getent ahostsv4, Python) as a plain one", function()
    local out, status = run("ip -4 addr show lo | grep -c 'inet 127.0.0.2/'; getent ahostsv4 pypi.org | head -1; " ..
      "/usr/bin/python3 -c 'import socket; print(socket.getaddrinfo(\"pypi.org\", 443, socket.AF_INET, 0, 0, " ..
      "socket.AI_ADDRCONFIG)[0][4][0])'; getent ahosts pypi.org | head -1")
    assert.are.equal(0, status, out)
    local l = {}
    for line in out:gmatch("[^\n]+") do l[#l + 1] = line end
    assert.are.equal("1", l[1], out)
    assert.matches("^198%.1[89]%.%d+%.%d+%s+STREAM pypi%.org", l[2], nil, out)
    assert.matches("^198%.1[89]%.%d+%.%d+$", l[3], nil, out)
    -- control: the lookup for either family, which never depended on it, still comes first as IPv4
    assert.matches("^198%.1[89]%.%d+%.%d+%s+STREAM pypi%.org", l[4], nil, out)
  end)

  it("names the sandbox's own responder in /etc/resolv.conf and resolves its hostname to loopback", function()
    local mechanisms = { "native" }
    if h.sh("command -v bwrap"):match("bwrap") then mechanisms[2] = "bwrap" end
    for _, m in ipairs(mechanisms) do
      local out = run(h.attempt_then_control(
        "grep -c '^nameserver' /etc/resolv.conf; grep nameserver /etc/resolv.conf; getent hosts $(hostname)",
        "getent ahosts pypi.org | head -1"), { "--mechanism", m })
      local _, control, attempt = h.after_attempt(out, "198%.1[89]%.")
      assert.matches("^1\nnameserver 127%.0%.0%.1\n", attempt, nil, m) -- the responder, never the host's resolver
      assert.matches("::1%s+corral", attempt, nil, m)
      assert.matches("^198%.1[89]%.%d+%.%d+%s+STREAM pypi%.org", control, nil, m)
    end
    -- the host's own /etc/resolv.conf is untouched
    assert.is_nil((h.read("/etc/resolv.conf") or ""):find("corral", 1, true))
  end)

  it("never asks the host's resolver about a name the tenant may not reach", function()
    local asked = {}
    local root = h.tmpdir("egress-dns")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "dns", storage_root = root, network = {
      allow = { "pypi.org:8080" }, internal = { net.cidr },
      resolve = function(name) asked[#asked + 1] = name; return { net.ip } end } }))
    assert(corral.provision("native", sb))
    local out_path = root .. "/out"
    local r = assert(corral.exec("native", sb, { "sh", "-c",
      "getent hosts secret-project.evil.test; curl -s --max-time 3 http://secret-project.evil.test:8080/; " ..
      "curl -s --max-time 5 http://pypi.org:8080/index.html" }, { output = out_path }))
    corral.destroy("native", sb)
    local out = h.read(out_path)
    h.rmrf(root)
    assert.are.equal(0, r.code, out)
    assert.matches("hello%-from%-the%-internet", out)
    assert.are.same({ "pypi.org" }, asked) -- the control name, and nothing else
  end)

  it("drops UDP (443 and other ports) and ICMP, and IPv6 literals; DNS over UDP works (control)", function()
    local out = run(TIMED .. h.attempt_then_control([[
      t sh -c 'echo x | nc -u -w 1 ]] .. net.ip .. [[ 443'
      t sh -c 'echo leaked | nc -u -w 1 ]] .. net.ip .. [[ 9443'
      busybox ping -c 1 -W 1 ]] .. net.ip .. [[ >/dev/null 2>&1 && echo PING-OK
      busybox ping -6 -c 1 -W 1 ]] .. net.ip6 .. [[ >/dev/null 2>&1 && echo PING6-OK]],
      "getent hosts pypi.org >/dev/null && echo dns-udp-ok"))
    h.after_attempt(out, "dns%-udp%-ok")
    assert.is_nil(out:find("PING", 1, true))
    for ms in out:gmatch("ms=(%d+)") do assert.truthy(tonumber(ms) < 2000, out) end
    assert.are.equal("", h.read(net.dir .. "/udp.log") or "")
  end)

  it("refuses allowed names that resolve into loopback, private, metadata or mapped ranges", function()
    local extra = { "--resolve", "loop.test=127.0.0.1", "--resolve", "private.test=10.99.0.1",
      "--resolve", "meta.test=169.254.169.254", "--resolve", "mapped.test=::ffff:169.254.169.254",
      "--allow", "loop.test", "--allow", "private.test", "--allow", "meta.test", "--allow", "mapped.test",
      "--log-json", out_dir .. "/ranges.jsonl" }
    local out = run(TIMED .. [[
      t curl -sS --max-time 5 http://loop.test:9444/
      t curl -sS --max-time 5 http://private.test:9444/
      t curl -sS --max-time 5 http://meta.test:80/
      t curl -sS --max-time 5 http://mapped.test:80/
      t curl -sS --max-time 5 http://pypi.org:8080/index.html]], extra)
    local rcs = {}
    for rc in out:gmatch(" rc=(%d+)") do rcs[#rcs + 1] = tonumber(rc) end
    for i = 1, 4 do assert.are_not.equal(0, rcs[i], out) end
    assert.are.equal(0, rcs[5], out) -- control, after the attempts
    local log = h.read(out_dir .. "/ranges.jsonl")
    for _, name in ipairs({ "loop.test", "private.test", "meta.test", "mapped.test" }) do
      assert.matches('"name":"' .. name .. '"[^\n]*"verdict":"deny"', log)
    end
  end)

  it("keeps the tenant from administering its netns: SO_MARK, nftables, port 53", function()
    local out = run([[
      perl -MSocket -e 'socket(my $s, AF_INET, SOCK_STREAM, 0) or die;
        print setsockopt($s, SOL_SOCKET, 36, pack("i", 42)) ? "MARK-SET\n" : "mark: $!\n";
        socket(my $v, AF_INET, SOCK_DGRAM, 0) or die;
        print bind($v, pack_sockaddr_in(53, INADDR_ANY)) ? "BOUND-53\n" : "bind53: $!\n";'
      nft flush ruleset 2>&1 && echo FLUSHED
      nft list ruleset >/dev/null 2>&1 && echo LISTED
      perl -MSocket -e 'socket(my $u, AF_INET, SOCK_DGRAM, 0) or die;
        print bind($u, pack_sockaddr_in(8053, INADDR_ANY)) ? "bind-8053-ok\n" : "bind8053: $!\n";'
      curl -sS --max-time 5 http://pypi.org:8080/index.html]])
    assert.matches("mark: Operation not permitted", out)
    assert.matches("bind53: Permission denied", out)
    -- controls, after every attempt: an unprivileged port binds, the ruleset still holds
    assert.is_true(h.in_order(out, { "bind53: ", "bind%-8053%-ok", "hello%-from%-the%-internet" }), out)
    assert.is_nil(out:find("FLUSHED", 1, true))
    assert.is_nil(out:find("MARK-SET", 1, true))
    assert.matches("hello%-from%-the%-internet", out) -- the ruleset still holds afterwards
  end)

  it("refuses a direct connection to the acceptor's own port, even with every address allowed", function()
    local log = out_dir .. "/direct.jsonl"
    local out = run(h.attempt_then_control([[
      for p in $(ss -Htln | awk '{print $4}' | sed 's/.*://' | sort -u); do
        [ "$p" = 53 ] && continue
        r=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 127.0.0.1 "$p" 2>/dev/null)
        [ -n "$r" ] && echo "DIRECT-$p-ANSWERED: $r"
      done]], "curl -sS --max-time 5 http://pypi.org:8080/index.html"),
      { "--allow", "0.0.0.0/0", "--log-json", log })
    h.after_attempt(out, "hello%-from%-the%-internet") -- control through the acceptor, after
    assert.is_nil(out:find("ANSWERED", 1, true), out)
    assert.matches('"reason":"direct connection to the acceptor"', h.read(log) or "")
  end)

  it("fails every connection when the acceptor is gone, and none leaks out", function()
    local root = h.tmpdir("egress-acc")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "acc", storage_root = root, network = {
      allow = { "logger.test:9444" }, internal = { net.cidr }, resolve = { ["logger.test"] = net.ip } } }))
    assert(corral.provision("native", sb))
    local out_path = root .. "/out"
    local script = "echo acceptor-test | nc -N -w 2 logger.test 9444; echo rc=$?"
    assert(corral.exec("native", sb, { "sh", "-c", script }, { output = out_path }))
    assert.matches("rc=0", h.read(out_path)) -- control, with the acceptor
    local before = logged()
    local plane = require("corral.egress.loop").planes()[1]
    plane.acceptor:close()
    plane.acceptor = nil
    local direct = "; nc -N -w 2 " .. net.ip .. " 9444 </dev/null; echo rc=$?"
    assert(corral.exec("native", sb, { "sh", "-c", script .. direct },
      { output = out_path }))
    corral.destroy("native", sb)
    local out = h.read(out_path)
    h.rmrf(root)
    assert.is_nil(out:find("rc=0", 1, true), out)
    assert.are.equal(before, logged())
  end)

  it("does not start a sandbox whose ruleset batch fails, and leaves nothing behind", function()
    local core = corral.core
    local real = core.nft.apply
    core.nft.apply = function(fd, plan)
      local p = {}
      for k, v in pairs(plan) do p[k] = v end
      p.test_bad_message = true
      return real(fd, p)
    end
    local root = h.tmpdir("egress-bad")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "bad", storage_root = root, network = { allow = { "pypi.org" } } }))
    local ok, err = corral.provision("native", sb)
    core.nft.apply = real
    assert.is_nil(ok)
    assert.are.equal("cannot_enforce", err.code)
    assert.matches("nftables", tostring(err))
    assert.are.equal("absent", corral.status("native", sb))
    -- control: the same sandbox provisions with the real batch
    assert(corral.provision("native", sb))
    corral.destroy("native", sb)
    h.rmrf(root)
  end)

  it("relays service_port from the host through address(); another sandbox cannot reach it", function()
    local root = h.tmpdir("egress-svc")
    os.execute("chmod 0711 " .. root)
    local a = assert(corral.sandbox({ id = "svc-a", storage_root = root, service_port = 8000 }))
    local b = assert(corral.sandbox({ id = "svc-b", storage_root = root, network = { allow = { "pypi.org:8080" },
      internal = { net.cidr }, resolve = { ["pypi.org"] = net.ip } } }))
    assert(corral.provision("native", a))
    assert(corral.provision("native", b))
    local ok, addr = corral.address("native", a)
    assert.is_true(ok)
    local host_port = tonumber(addr:match("^127%.0%.0%.1:(%d+)$"))
    assert.truthy(host_port, addr)
    -- A's own word that it listens (socat's notice), never a connect before B's attempt
    local a_log = root .. "/a-log"
    assert(corral.start("native", a, { "socat", "-d", "-d", "TCP-LISTEN:8000,fork,reuseaddr",
      "SYSTEM:echo service-a" }, { output = a_log }))
    local native = require "corral.mechanism.native"
    for _ = 1, 50 do
      if (h.read(a_log) or ""):find("listening on", 1, true) then break end
      native.serve(0.1)
    end
    assert.matches("listening on", h.read(a_log) or "")
    -- the attempt: B at A's published port and at A's port on its own loopback
    local out_path = root .. "/out"
    assert(corral.exec("native", b, { "sh", "-c", "nc -w 1 127.0.0.1 " .. host_port ..
      " </dev/null; echo rc1=$?; nc -w 1 127.0.0.1 8000 </dev/null; echo rc2=$?; " ..
      "curl -s --max-time 5 http://pypi.org:8080/index.html" }, { output = out_path }))
    -- the control, after the attempt: the host reaches A's service through the relay
    local got = ""
    for _ = 1, 20 do
      local c = corral.core.sock.connect("127.0.0.1", host_port, 2)
      if c then
        local deadline = corral.core.clock.monotime() + 3
        while corral.core.clock.monotime() < deadline and not got:find("\n") do
          native.serve(0.05)
          got = got .. (corral.core.io.read(c, 100) or "")
        end
        c:close()
      end
      if got:find("service%-a") then break end
      native.serve(0.1)
    end
    corral.destroy("native", a)
    corral.destroy("native", b)
    local out = h.read(out_path)
    h.rmrf(root)
    assert.is_nil(out:find("service-a", 1, true), out)
    assert.matches("service%-a", got) -- control: the host reaches the service after B's attempt
    assert.matches("hello%-from%-the%-internet", out) -- b's own egress works
  end)

  it("refuses a port no entry names at the connect itself, and follows allow/revoke", function()
    local egress = require "corral.egress"
    local root = h.tmpdir("egress-ports")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "ports", storage_root = root, network = {
      allow = { "logger.test:9444" }, internal = { net.cidr },
      resolve = { ["pypi.org"] = net.ip, ["logger.test"] = net.ip } } }))
    assert(corral.provision("native", sb))
    local out_path = root .. "/out"
    local function zscan()
      assert(corral.exec("native", sb, { "sh", "-c", "s=$(date +%s%N); nc -z -w 2 pypi.org 8080; " ..
        "echo other=$? ms=$(( ($(date +%s%N) - s) / 1000000 )); nc -z -w 2 logger.test 9444; echo allowed=$?" },
        { output = out_path }))
      return h.read(out_path)
    end
    local out = zscan()
    assert.matches("other=[1-9].*allowed=0", out) -- a port no entry names: the connect itself fails,
    -- (and the control after it, a bare connect to an allowed port, succeeds)
    assert.truthy(tonumber(out:match("ms=(%d+)")) < 1000, out) -- at once
    assert(egress.allow(sb, "pypi.org:8080"))
    assert.matches("other=0", zscan()) -- the ruleset followed the new entry
    assert.truthy(egress.revoke(sb, "pypi.org:8080") >= 1)
    out = zscan()
    assert.matches("allowed=0", out)
    assert.matches("other=[1-9]", out) -- and the revocation
    -- With every entry revoked no TCP is redirected at all: a bare connect to the
    -- address behind the allowed port of before fails at the connect itself (before,
    -- port 9444 was redirected and the acceptor accepted the literal to reset it).
    -- The acceptor's reset often reaches the client before the client reads its
    -- connect's result (`nc -v`: "Connection reset by peer", in about half the runs), so
    -- the redirect is shown by the acceptor's own decision of the literal and by a
    -- handshake that completed (success or a reset, never a refusal at the SYN).
    local events = require "corral.egress.events"
    local function literal()
      events.reset()
      assert(corral.exec("native", sb, { "sh", "-c", "nc -v -z -w 2 " .. net.ip .. " 9444 2>&1; echo literal=$?" },
        { output = out_path }))
      local decided = false
      for _, e in ipairs(events.recent()) do
        if e.kind == "connect" and e.sandbox == "ports" and e.ip == net.ip and e.port == 9444 then
          decided = e.verdict == "deny"
        end
      end
      return h.read(out_path), decided
    end
    local decided
    out, decided = literal()
    assert.is_nil(out:find("refused", 1, true), out) -- control: redirected, so the handshake completed
    assert.truthy(out:find("literal=0", 1, true) or out:find("reset by peer", 1, true), out)
    assert.truthy(decided, "the acceptor never decided the literal: " .. out) -- and was reset there
    assert.truthy(egress.revoke(sb, "logger.test:9444") >= 1)
    out, decided = literal()
    corral.destroy("native", sb)
    h.rmrf(root)
    assert.matches("literal=[1-9]", out)
    assert.matches("refused", out) -- reset at the SYN, by the ruleset
    assert.is_false(decided, out)   -- the acceptor never saw it
  end)

  it("applies allow/revoke to the next connection, and a decide hook can only narrow", function()
    local egress = require "corral.egress"
    local root = h.tmpdir("egress-live")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "live", storage_root = root, network = {
      allow = { "logger.test:9444" }, internal = { net.cidr },
      resolve = { ["pypi.org"] = net.ip, ["logger.test"] = net.ip },
      decide = function(ctx) return ctx.name ~= "logger.test" or ctx.port == 9444 end } }))
    assert(corral.provision("native", sb))
    local out_path = root .. "/out"
    local function try()
      assert(corral.exec("native", sb, { "sh", "-c",
        "curl -s --max-time 5 http://pypi.org:8080/index.html; echo rc=$?" }, { output = out_path }))
      return h.read(out_path)
    end
    assert.matches("rc=[1-9]", try())                       -- not on the list yet
    assert(egress.allow(sb, "pypi.org:8080"))
    assert.matches("hello%-from%-the%-internet", try())      -- allowed from the next connection on
    assert.truthy(egress.revoke(sb, "pypi.org:8080") >= 1)
    assert.matches("rc=[1-9]", try())                       -- revoked again
    -- the hook narrows: it refuses pypi.org even when the list allows it
    egress.registry:get("live").decide = function(ctx) return ctx.name ~= "pypi.org" end
    assert(egress.allow(sb, "pypi.org:8080"))
    local out = try()
    corral.destroy("native", sb)
    h.rmrf(root)
    assert.matches("rc=[1-9]", out)
  end)

  -- The routed link without root: the veth's far end goes into a netns the caller cannot
  -- administer. Refused before anything is made, by the flag's name; the control is the
  -- same sandbox without it, reaching the same server.
  local function link_refused_then_control(id, link)
    local root = h.tmpdir("egress-nolink")
    os.execute("chmod 0711 " .. root)
    local function network(with_link)
      return { allow = { "pypi.org:8080" }, internal = { net.cidr }, resolve = { ["pypi.org"] = net.ip },
        link = with_link }
    end
    local sb = assert(corral.sandbox({ id = id, storage_root = root, network = network(link) }))
    local ok, err = corral.provision("native", sb)
    local status = corral.status("native", sb)
    local plain = assert(corral.sandbox({ id = id .. "-plain", storage_root = root, network = network() }))
    assert(corral.provision("native", plain))
    local out_path = root .. "/out"
    local r = assert(corral.exec("native", plain,
      { "sh", "-c", "curl -sS --max-time 5 http://pypi.org:8080/index.html" }, { output = out_path }))
    corral.destroy("native", plain)
    local out = h.read(out_path)
    h.rmrf(root)
    assert.is_nil(ok)
    assert.are.equal("cannot_enforce", err.code)
    assert.matches("%-%-link: needs root", tostring(err))
    assert.are.equal("absent", status)
    assert.are.equal(0, r.code, out)
    assert.matches("hello%-from%-the%-internet", out)
  end

  if unprivileged then
    it("refuses the routed link to a caller without root, naming --link (control: no link)", function()
      local n = tonumber(net.ip:match("%.(%d+)%.2$"))
      link_refused_then_control("link", { peer_netns = "/run/netns/" .. net.ns, address = "10.80." .. n .. ".2/24",
        peer_address = "10.80." .. n .. ".1/24", gateway = "10.80." .. n .. ".1" })
    end)
  end

  if not unprivileged then it("connects upstream through the sandbox's own link with a mark-checked socket", function()
    local n = tonumber(net.ip:match("%.(%d+)%.2$"))
    local peer_ip, my_ip = "10.80." .. n .. ".1", "10.80." .. n .. ".2"
    -- The server on the link's far end answers with the address the connection came
    -- from: the sandbox's own link address, not the host's (no traffic is sent from the
    -- host to this network at all).
    os.execute(string.format("ip netns exec %s socat TCP-LISTEN:9445,fork,reuseaddr " ..
      "SYSTEM:'echo from=$SOCAT_PEERADDR' >/dev/null 2>&1 &", net.ns))
    -- A v6 listener on the far end, reached (if anything leaked) through its link-local
    -- address with the tenant's interface as scope: such a connect must be reset at once.
    os.execute(string.format("ip netns exec %s socat TCP6-LISTEN:9446,fork,reuseaddr " ..
      "SYSTEM:'echo LL-REACHED' >/dev/null 2>&1 &", net.ns))
    local root = h.tmpdir("egress-link")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "link", storage_root = root, network = {
      allow = { "pypi.org:8080", "whoami.test:9445" }, internal = { "10.80." .. n .. ".0/24" },
      resolve = { ["pypi.org"] = peer_ip, ["whoami.test"] = peer_ip },
      link = { peer_netns = "/run/netns/" .. net.ns, address = my_ip .. "/24",
               peer_address = peer_ip .. "/24", gateway = peer_ip } } }))
    assert(corral.provision("native", sb))
    local out_path = root .. "/out"
    -- From the link's far end, a client keeps trying to open a connection to the
    -- tenant's listener (and sends UDP to it) while the tenant runs: nothing may come in.
    local inbound = root .. "/inbound"
    os.execute(string.format("ip netns exec %s sh -c 'socat -T 1 - TCP:%s:9445 </dev/null | grep -q from= " ..
      "&& echo prober-works; for i in $(seq 25); do " ..
      "echo hi | socat -T 1 - TCP:%s:8000,connect-timeout=0.2 2>/dev/null && echo INBOUND-CONNECTED; " ..
      "echo hi | socat - UDP:%s:8001 2>/dev/null; sleep 0.1; done' > %s 2>&1 &",
      net.ns, peer_ip, my_ip, my_ip, inbound))
    local r = assert(corral.exec("native", sb, { "sh", "-c",
      "socat -T 3 TCP-LISTEN:8000,fork SYSTEM:'echo accepted; echo INBOUND-ACCEPTED >&2' & " ..
      "socat -T 3 -u UDP-RECV:8001 STDOUT | sed 's/^/INBOUND-UDP /' & " ..
      "curl -sS --max-time 5 http://pypi.org:8080/index.html; nc -w 2 whoami.test 9445 </dev/null; " ..
      "getent ahosts pypi.org | grep -c ':' ; " ..
      "echo x | nc -u -w 1 " .. peer_ip .. " 9443; " ..
      "curl -sS --max-time 3 http://" .. peer_ip .. ":8080/ && echo LITERAL-OK; " ..
      -- the far end's link-local address, once our own has left DAD
      "for i in $(seq 30); do ip -6 -o addr show dev corral0 | grep -q tentative || break; sleep 0.1; done; " ..
      "ll=$(ip -6 neigh show dev corral0 | awk '{print $1}' | head -1); ll=${ll:-fe80::1}; " ..
      "s=$(date +%s%N); nc -6 -w 3 \"$ll%corral0\" 9446 </dev/null; e=$(date +%s%N); " ..
      "echo ll-ms=$(( (e - s) / 1000000 )); sleep 1.5; exit 0" }, { output = out_path }))
    local inbound_log = h.read(inbound) or ""
    corral.destroy("native", sb)
    local out = h.read(out_path)
    h.rmrf(root)
    assert.are.equal(0, r.code)
    assert.matches("hello%-from%-the%-internet", out)
    assert.matches("from=" .. my_ip:gsub("%.", "%%."), out) -- it came through the link
    assert.matches("\n0\n", out) -- no IPv6 synthetic address is handed out without a route for it
    assert.is_nil(out:find("LITERAL-OK", 1, true), out) -- the tenant cannot use the link itself
    assert.is_nil(out:find("LL-REACHED", 1, true), out)
    assert.is_nil(out:find("INBOUND", 1, true), out)
    assert.matches("prober%-works", inbound_log) -- control: the far end's client does connect
    assert.is_nil(inbound_log:find("INBOUND-CONNECTED", 1, true), inbound_log)
    assert.truthy(tonumber(out:match("ll%-ms=(%d+)")) < 1000, out) -- reset, not left to time out
    assert.are.equal("", h.read(net.dir .. "/udp.log") or "")
    assert(h.wait_for(function()
      return not h.sh("ip netns exec " .. net.ns .. " ip -o link"):find("crl%x+%d+@")
    end, 3), "the link outlived its sandbox")
  end) end

  it("shows sandboxes, their ruleset and recent decisions in the REPL helpers", function()
    local root = h.tmpdir("egress-repl")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "repl", storage_root = root, network = { allow = { "pypi.org:8080" },
      internal = { net.cidr }, resolve = { ["pypi.org"] = net.ip } } }))
    assert(corral.provision("native", sb))
    assert(corral.exec("native", sb, { "sh", "-c", "curl -s --max-time 5 http://pypi.org:8080/ >/dev/null" }))
    local listed
    for _, s in ipairs(corral.sandboxes()) do listed = listed or s.id == "repl" end
    local rules = corral.ruleset("repl")
    local recent = corral.decisions(50)
    corral.destroy("native", sb)
    h.rmrf(root)
    assert.is_true(listed)
    assert.matches("table inet corral", rules)
    assert.matches("redirect to :53", rules)
    local seen
    for _, e in ipairs(recent) do seen = seen or (e.sandbox == "repl" and e.verdict == "allow") end
    assert.is_true(seen)
    assert.is_nil(corral.ruleset("repl")) -- gone with the sandbox
  end)

  it("enforces the same allowlist under bwrap (a name and an IP not allowed, then the control)", function()
    local out, status = run(TIMED .. [[
      t curl -sS --max-time 5 http://evil.test:9444/
      t curl -sS --max-time 5 http://]] .. net.ip .. [[:9444/
      nft flush ruleset 2>/dev/null && echo FLUSHED
      t curl -sS --max-time 5 http://pypi.org:8080/index.html]], { "--mechanism", "bwrap" })
    assert.are.equal(0, status, out)
    local rcs = {}
    for rc in out:gmatch(" rc=(%d+)") do rcs[#rcs + 1] = tonumber(rc) end
    assert.are_not.equal(0, rcs[1], out)
    assert.are_not.equal(0, rcs[2], out)
    assert.are.same(0, rcs[3], out) -- control, after the attempts
    assert.is_nil(out:find("FLUSHED", 1, true))
  end)

  it("bounds DNS-over-TCP connections a tenant holds open; answers keep flowing", function()
    local root = h.tmpdir("egress-flood")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "flood", storage_root = root, network = { allow = { "pypi.org:8080" } } }))
    assert(corral.provision("native", sb))
    assert(corral.start("native", sb, { "sh", "-c",
      "for i in $(seq 1 120); do sleep 30 | nc 127.0.0.1 53 >/dev/null 2>&1 & done; sleep 30" }))
    local native = require "corral.mechanism.native"
    native.serve(2)
    local plane
    for _, p in ipairs(require("corral.egress.loop").planes()) do if p.id == "flood" then plane = p end end
    local held = plane.responder:tcp_count()
    -- control: the responder still answers over UDP while the connections are held
    local client = assert(corral.core.listen.in_netns(plane.netns, "udp", "127.0.0.1", 0))
    local q = string.char(0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4) .. "pypi" .. string.char(3) .. "org" ..
      string.char(0, 0, 1, 0, 1)
    corral.core.udp.send(client, q, "127.0.0.1", 53)
    native.serve(0.2)
    local answer = corral.core.udp.recv(client)
    client:close()
    corral.destroy("native", sb)
    h.rmrf(root)
    assert.truthy(held <= require("corral.egress.responder").TCP_DNS_MAX, held)
    assert.truthy(held > 0, "control: the tenant's connections never arrived")
    assert.truthy(answer and #answer > 12, "the responder stopped answering")
  end)

  it("takes the routed link from the command line as well (without root: refused, naming --link)", function()
    local n = tonumber(net.ip:match("%.(%d+)%.2$"))
    local peer_ip = "10.81." .. n .. ".1"
    local out, status = h.corral("run", "--allow", "pypi.org:8080", "--resolve", "pypi.org=" .. peer_ip,
      "--internal", "10.81." .. n .. ".0/24",
      "--link", net.ns .. ",10.81." .. n .. ".2/24," .. peer_ip .. "," .. peer_ip .. "/24",
      "--", "curl", "-sS", "--max-time", "5", "http://pypi.org:8080/index.html")
    if unprivileged then
      assert.are.equal(3, status, out)
      assert.matches("cannot_enforce: network_restriction: %-%-link: needs root", out)
      assert.is_nil(out:find("hello-from-the-internet", 1, true), out)
      -- control: the same run without the link
      out, status = h.corral("run", "--allow", "pypi.org:8080", "--resolve", "pypi.org=" .. net.ip,
        "--internal", net.cidr, "--", "curl", "-sS", "--max-time", "5", "http://pypi.org:8080/index.html")
    end
    assert.are.equal(0, status, out)
    assert.matches("hello%-from%-the%-internet", out)
    local bad
    out, bad = h.corral("run", "--link", "only-a-name", "--", "true")
    assert.are.equal(2, bad)
    assert.matches("%-%-link", out)
  end)

  it("1,000 plane create/destroy cycles leave no fd, netns or table behind", function()
    -- In a process of its own: what earlier tests left in this one (to the collector, to
    -- the loop) settles at any moment, and moved the count by one either way in two of
    -- seven full runs. One warm-up cycle first, so a lazily made singleton is not counted
    -- as a leak; then 1,000 cycles must not add a single fd, netns fd or named netns.
    local dir = h.tmpdir("cycles")
    h.write(dir .. "/cycles.lua", [=[
local core = require "corral.core"
local plane = require "corral.egress.plane"
local function counts()
  local all, netns = 0, 0
  for _, fd in ipairs(core.fs.listdir("/proc/self/fd") or {}) do
    all = all + 1
    if (core.fs.readlink("/proc/self/fd/" .. fd) or ""):match("^net:%[") then netns = netns + 1 end
  end
  return all, netns
end
assert(plane.new("cycle-0", { allow = { "pypi.org:443" } })):close()
collectgarbage()
local f0, n0 = counts()
for i = 1, 1000 do
  assert(plane.new("cycle-" .. i, { allow = { "pypi.org:443" } })):close()
end
collectgarbage()
local f1, n1 = counts()
local left = 0
for _, id in ipairs(require("corral.egress").list()) do
  if tostring(type(id) == "table" and id.id or id):match("^cycle%-") then left = left + 1 end
end
local open = assert(plane.new("cycle-open", { allow = { "pypi.org:443" } }))
local _, n_open = counts()
open:close()
print(string.format("fds %d %d netns %d %d open %d registry %d", f0, f1, n0, n1, n_open, left))
]=])
    local named0 = h.sh("ip netns list")
    local out, status = h.capture({ h.host, dir .. "/cycles.lua" })
    local named1 = h.sh("ip netns list")
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    local f0, f1, n0, n1, n_open, left = out:match("fds (%d+) (%d+) netns (%d+) (%d+) open (%d+) registry (%d+)")
    assert.truthy(f0, out)
    assert.are.equal(f0, f1)
    assert.are.equal(n0, n1)
    -- control: the count sees a live plane's netns fd
    assert.are.equal(tonumber(n0) + 1, tonumber(n_open), out)
    assert.are.equal(named0, named1)
    assert.are.equal("0", left, "registry entries left: " .. out)
  end)
  if not shared then
    it("passes every test above as an unprivileged caller, against the same internet", function()
      local missing, kind = h.test_user_missing()
      if kind == "kernel" then return pending(missing) end
      assert.is_nil(missing, missing)
      local expected = defined - 1 -- all but this one
      local busted = h.sh("command -v busted"):match("%S+") or "/usr/bin/busted"
      -- the interpreter this suite runs under: lua5.4, or the host itself (`make asan`)
      local lua = package.preload["corral.core"] and h.host or "lua5.4"
      local out, status = h.capture(h.as_test_user({ "env", "CORRAL_TEST_INTERNET=" .. internet.encode(net),
        lua, busted, "tests/egress_spec.lua" }))
      assert.are.equal(0, status, out)
      local n = out:match("(%d+) successes? / 0 failures? / 0 errors? / 0 pending")
      assert.are.equal(expected, tonumber(n), out)
    end)
  end
end)
