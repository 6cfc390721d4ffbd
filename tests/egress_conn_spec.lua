-- Egress connections as real programs hold them, end to end under `corral run`: every
-- address a name resolves to is tried (RFC 8305), --idle and --max-connections, and the
-- summary on stderr of what was denied or failed. Real clients (curl, nc) in a native
-- tenant, real servers in a test "internet" netns; each attempt runs first, its control
-- after it.
local h = require "helpers"
local internet = require "internet"

describe("egress connection options and the summary's words", function()
  local network_spec = require "corral.egress.network_spec"
  local run_options = require "corral.egress.run_options"
  local summary = require "corral.egress.summary"
  local acceptor = require "corral.egress.acceptor"
  local sni_hold = require "corral.egress.sni_hold"

  it("refuses a bad idle or connect_timeout; none and hours are accepted", function()
    for _, bad in ipairs({ -1, "10m", 0 / 0, 86400 * 366 }) do
      local ok, err = network_spec.check({ allow = { "a.test:443" }, idle = bad })
      assert.is_nil(ok, tostring(bad))
      assert.matches("idle must be a number of seconds", err.detail)
    end
    assert.is_nil(network_spec.check({ connect_timeout = -2 }))
    for _, good in ipairs({ 0, 0.5, 7200 }) do -- controls
      assert.is_table(network_spec.check({ allow = { "a.test:443" }, idle = good, connect_timeout = 5 }))
    end
    assert.are.equal(0, network_spec.DEFAULTS.idle)              -- no idle limit unless asked
    assert.is_true(network_spec.DEFAULTS.max_connections >= 2000) -- a build's downloads fit
  end)

  it("reads --idle durations and refuses what is not one", function()
    for _, bad in ipairs({ "soon", "-1", "1x", "2 h", "400d" }) do assert.is_nil(run_options.duration(bad), bad) end
    assert.are.same({ 0, 0, 90, 90, 600, 7200, 86400, 1.5 }, { run_options.duration("none"), run_options.duration("0"),
      run_options.duration("90"), run_options.duration("90s"), run_options.duration("10m"),
      run_options.duration("2h"), run_options.duration("1d"), run_options.duration("1.5") })
  end)

  it("orders a name's addresses IPv6 first, the families alternating", function()
    assert.are.same({ "2001:db8::1", "192.0.2.1", "2001:db8::2", "192.0.2.2", "192.0.2.3" },
      acceptor.eyeballs_order({ "192.0.2.1", "192.0.2.2", "2001:db8::1", "192.0.2.3", "2001:db8::2" }))
    assert.are.same({ "192.0.2.1" }, acceptor.eyeballs_order({ "192.0.2.1" }))
    assert.are.equal(12, #acceptor.eyeballs_order((function()
      local t = {}
      for i = 1, 20 do t[i] = "192.0.2." .. i end
      return t
    end)()))
  end)

  it("judges a first flight by the name it carries, under match and require", function()
    local f = io.open("tests/fuzz/corpus/sni/tls-openssl-sni", "rb") -- openssl s_client -servername api.test
    local hello = f:read("a")
    f:close()
    local v = sni_hold.sni_verdict
    assert.are.equal("SNI api.test on a connection to evil.test", v(hello, "evil.test", "match"))
    assert.is_true(v(hello, "api.test", "match"))                                  -- control
    assert.is_nil(v(hello:sub(1, 100), "api.test", "match"))                        -- wait for the rest
    assert.matches("incomplete", v(hello:sub(1, 100), "api.test", "match", true))
    local get = "GET / HTTP/1.1\r\nHost: evil.test:8080\r\n\r\n"
    assert.are.equal("Host evil.test on a connection to api.test", v(get, "api.test", "match"))
    assert.is_true(v((get:gsub("evil", "api")), "api.test", "match"))             -- control
    assert.matches("does not follow its grammar",
      v("GET / HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\n\r\n", "api.test", "match"))
    assert.matches("does not follow its grammar",
      v("GET http://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", "api.test", "match"))
    -- a Host that is the address the client dialled names that same destination, in
    -- any spelling; another address is refused (the attempt), both before their controls
    local v4 = "GET / HTTP/1.1\r\nHost: 198.18.95.150:18083\r\n\r\n"
    local v6 = "GET / HTTP/1.1\r\nHost: [64:FF9B:1:0::c612:5f96]:18083\r\n\r\n"
    assert.are.equal("Host 198.18.95.151 on a connection to api.test",
      v((v4:gsub("150", "151")), "api.test", "match", false, "198.18.95.150"))
    assert.are.equal("Host 64:ff9b:1::c612:5f97 on a connection to api.test",
      v("GET / HTTP/1.1\r\nHost: [64:ff9b:1::c612:5f97]\r\n\r\n", "api.test", "match", false,
        "64:ff9b:1::c612:5f96"))
    assert.matches("does not follow its grammar", v("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", "api.test", "match"))
    assert.is_true(v(v4, "api.test", "match", false, "198.18.95.150"))
    assert.is_true(v(v6, "api.test", "match", false, "64:ff9b:1::c612:5f96"))
    -- no name: through under match, refused under require
    assert.is_true(v("SSH-2.0-OpenSSH_9.2\r\n", "api.test", "match"))
    assert.matches("neither TLS nor HTTP", v("SSH-2.0-OpenSSH_9.2\r\n", "api.test", "require"))
    assert.is_true(v("", "api.test", "match", true))                                -- a server-first protocol
    assert.matches("nothing sent", v("", "api.test", "require", true))
    assert.is_true(v(hello, "api.test", "require"))                                -- control
    assert.is_nil(network_spec.check({ sni = "maybe" }))
    assert.is_table(network_spec.check({ sni = "require" }))
  end)

  it("writes the --learn file mode 0600 whatever the umask, never through a link", function()
    local learn = require "corral.egress.learn"
    local core = require "corral.core"
    local dir = h.tmpdir("learn")
    h.must("ln -s learned " .. dir .. "/link")
    local ok, err = learn.start(dir .. "/link").finish()
    assert.is_nil(ok)
    assert.matches("a symbolic link", err, nil, true)
    assert.is_nil(core.fs.lstat(dir .. "/learned"), "written through the link")
    h.write(dir .. "/plain", "") -- the control for the mode: the umask's choice
    local plain = core.fs.lstat(dir .. "/plain").mode
    ok = learn.start(dir .. "/learned").finish()
    assert.is_true(ok)
    assert.are.equal(tonumber("600", 8), core.fs.lstat(dir .. "/learned").mode)
    assert.are_not.equal(tonumber("600", 8), plain)
    assert.matches("^# corral run %-%-learn", h.read(dir .. "/learned"))
    h.rmrf(dir)
  end)

  it("words each denial and failure with the option that changes it; allowed ones are not listed", function()
    assert.are.equal("denied api.test:9443 (port not allowed for api.test; --allow api.test:9443 would)",
      summary.line({ kind = "connect", verdict = "deny", name = "api.test", port = 9443,
        reason = "sb: api.test is allowed only on ports 443" }))
    assert.are.equal("denied evil.test (no entry names it; --allow evil.test:PORT would)",
      summary.line({ kind = "dns", verdict = "deny", name = "evil.test",
        reason = "sb: evil.test is not in the allowlist" }))
    assert.are.equal("denied [2001:db8::9]:22 (no entry names it; --allow [2001:db8::9]:22 would)",
      summary.line({ kind = "connect", verdict = "deny", ip = "2001:db8::9", port = 22,
        reason = "sb: 2001:db8::9 is not in the allowlist" }))
    assert.are.equal("failed api.test:8443 (upstream refused 10.1.2.3)",
      summary.line({ kind = "failed", verdict = "allow", name = "api.test", port = 8443,
        reason = "upstream: Connection refused (10.1.2.3)" }))
    assert.matches("%-%-internal", summary.line({ kind = "connect", verdict = "deny", name = "db.test", port = 5432,
      reason = "resolved into a refused range (10.0.0.5: private; list it in network.internal)" }))
    -- the policy's own field names never reach the summary: the flags that set them do
    local host_line = summary.line({ kind = "connect", verdict = "deny", name = "v6.test", port = 18082,
      reason = "::1 is an address of this host; only network.internal listing ::1 allows it" })
    assert.matches("only %-%-internal listing ::1 allows it", host_line)
    assert.is_nil(host_line:find("network.", 1, true))
    local sni_line = summary.line({ kind = "connect", verdict = "deny", name = "api.test", port = 443,
      reason = "TLS ClientHello on a connection to api.test names no host (network.sni = \"require\")" })
    assert.matches("(--sni require)", sni_line, nil, true)
    assert.is_nil(sni_line:find("network.", 1, true))
    -- this host out of fds is said as such, never as the upstream refusing
    local relays = require "corral.egress.relays"
    local errno = require("corral.core").errno
    local emfile = relays.failure({ kind = "failed", err = errno.EMFILE, msg = "Too many open files" },
      { upstreams = { "10.1.2.3", "10.1.2.4" } })
    assert.matches("^corral is out of file descriptors %(connecting to 10%.1%.2%.3, 10%.1%.2%.4: Too many open files%)",
      emfile)
    assert.are.equal("failed api.test:443 (" .. emfile .. ")",
      summary.line({ kind = "failed", verdict = "allow", name = "api.test", port = 443, reason = emfile }))
    assert.is_nil(summary.line({ kind = "failed", verdict = "allow", name = "api.test", port = 443, reason = emfile })
      :find("refused", 1, true))
    assert.are.equal("upstream: Connection refused (10.1.2.3)", relays.failure({ kind = "failed",
      err = errno.ECONNREFUSED, msg = "Connection refused" }, { upstream = "10.1.2.3" })) -- control
    assert.matches("--max-connections sets the cap", summary.line({ kind = "connect", verdict = "deny",
      name = "api.test", port = 443, reason = "connection cap reached (2)" }), nil, true)
    -- controls: what went as asked is not a line
    assert.is_nil(summary.line({ kind = "connect", verdict = "allow", name = "api.test", port = 443 }))
    assert.is_nil(summary.line({ kind = "closed", verdict = "allow", name = "api.test", port = 443 }))
    assert.is_nil(summary.line({ kind = "dns", verdict = "allow", name = "api.test" }))
  end)
end)

describe("egress connections #root #netns", function()
  local net, v4_server, tls_server, banner_server
  local V4_PORT, TLS_PORT, BANNER_PORT = 9555, 9556, 9557

  setup(function()
    net = internet.start()
    -- a TLS server of the test's own (openssl s_server, a throwaway self-signed key)
    assert(h.sh("command -v openssl"):match("openssl"), "openssl is needed for the SNI tests")
    h.must(string.format("openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=api.test -days 1 " ..
      "-keyout %s/key.pem -out %s/cert.pem >/dev/null 2>&1", net.dir, net.dir))
    local tls = h.sh(string.format("ip netns exec %s openssl s_server -quiet -www -accept %d -cert %s/cert.pem " ..
      "-key %s/key.pem >/dev/null 2>&1 </dev/null & echo pid=$!", net.ns, TLS_PORT, net.dir, net.dir))
    tls_server = tls:match("pid=(%d+)")
    assert(h.wait_for(function()
      return h.sh(string.format("ip netns exec %s ss -ltn | grep -c ':%d '", net.ns, TLS_PORT)):match("^1")
    end, 5), "openssl s_server did not start")
    -- a server on the internet's IPv4 address only: its IPv6 address refuses this port
    local out = h.sh(string.format("ip netns exec %s socat TCP4-LISTEN:%d,bind=%s,fork,reuseaddr " ..
      "SYSTEM:'echo dual-ok' >/dev/null 2>&1 & echo pid=$!", net.ns, V4_PORT, net.ip))
    v4_server = out:match("pid=(%d+)")
    assert(h.wait_for(function()
      return h.sh(string.format("ip netns exec %s ss -ltn | grep -c ':%d '", net.ns, V4_PORT)):match("^1")
    end, 5), "the IPv4-only server did not start")
    -- a server that speaks first (as SMTP does) and then answers the client's line
    out = h.sh(string.format("ip netns exec %s socat TCP4-LISTEN:%d,bind=%s,fork,reuseaddr " ..
      "SYSTEM:'echo banner-first; read l; echo got-$l' >/dev/null 2>&1 & echo pid=$!", net.ns, BANNER_PORT, net.ip))
    banner_server = out:match("pid=(%d+)")
    assert(h.wait_for(function()
      return h.sh(string.format("ip netns exec %s ss -ltn | grep -c ':%d '", net.ns, BANNER_PORT)):match("^1")
    end, 5), "the banner server did not start")
  end)

  teardown(function()
    if v4_server then os.execute("kill " .. v4_server .. " 2>/dev/null") end
    if tls_server then os.execute("kill " .. tls_server .. " 2>/dev/null") end
    if banner_server then os.execute("kill " .. banner_server .. " 2>/dev/null") end
    if net then internet.stop(net) end
  end)

  local function run(args, script)
    local argv = { "run", "--internal", net.cidr, "--internal", net.cidr6 }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    for _, a in ipairs({ "--", "sh", "-c", script }) do argv[#argv + 1] = a end
    return h.corral(table.unpack(argv))
  end

  it("tries every address of a name: a refusing IPv6 address falls back to IPv4", function()
    local log = net.dir .. "/dual.jsonl"
    local out, status = run({ "--allow", "only6.test:" .. V4_PORT, "--allow", "dual.test:" .. V4_PORT,
      "--resolve", "only6.test=" .. net.ip6,
      "--resolve", "dual.test=" .. net.ip6, "--resolve", "dual.test=" .. net.ip, "--log-json", log },
      h.attempt_then_control("nc -w 3 only6.test " .. V4_PORT .. " </dev/null",
        "nc -w 3 dual.test " .. V4_PORT .. " </dev/null"))
    assert.are.equal(0, status, out)
    local _, control, attempt = h.after_attempt(out, "dual%-ok")
    assert.is_nil(attempt:find("dual-ok", 1, true), out) -- the only address refused: nothing
    assert.matches("dual%-ok", control)
    -- the summary names the failure and the address that refused
    assert.matches("failed only6.test:" .. V4_PORT .. " (upstream refused " .. net.ip6 .. ")", out, nil, true)
    local json = require "dkjson"
    local closed
    for line in (h.read(log) or ""):gmatch("[^\n]+") do
      local e = assert(json.decode(line), line)
      if e.kind == "closed" and e.name == "dual.test" then closed = e end
    end
    assert.truthy(closed, "no closed record for dual.test")
    assert.are.equal(net.ip, closed.upstream) -- the IPv4 address won the race
  end)

  it("Happy Eyeballs with curl: a blackholed IPv6 address loses to IPv4 after its head start", function()
    -- an HTTP server on both families; SYNs to the internet's IPv6 address on its port are
    -- dropped (a table of the test netns's own, gone with it): that address never answers
    local port, log = 9559, net.dir .. "/he.jsonl"
    h.must(string.format("ip netns exec %s busybox httpd -p %d -h %s", net.ns, port, net.dir))
    h.must(string.format("ip netns exec %s nft add table inet corral_t_he && ip netns exec %s nft add chain inet " ..
      "corral_t_he in '{ type filter hook input priority 0; }' && ip netns exec %s nft add rule inet corral_t_he in " ..
      "ip6 daddr %s tcp dport %d drop", net.ns, net.ns, net.ns, net.ip6, port))
    local curl = "curl -sS --max-time %d -w ' time=%%{time_total}\\n' http://%s:" .. port .. "/index.html"
    local out, status = run({ "--allow", "he.test:" .. port, "--allow", "v6hole.test:" .. port,
      "--resolve", "v6hole.test=" .. net.ip6, "--resolve", "he.test=" .. net.ip6, "--resolve", "he.test=" .. net.ip,
      "--log-json", log },
      h.attempt_then_control(string.format(curl, 2, "v6hole.test"), string.format(curl, 5, "he.test")))
    os.execute(string.format("ip netns exec %s nft delete table inet corral_t_he; " ..
      "ip netns exec %s pkill -f 'busybox httpd -p %d'", net.ns, net.ns, port))
    assert.are.equal(0, status, out)
    local rc, control, attempt = h.after_attempt(out, "hello%-from%-the%-internet")
    assert.are_not.equal(0, rc, out) -- the attempt: the IPv6 address alone never answers
    assert.is_nil(attempt:find("hello-from-the-internet", 1, true), attempt)
    assert.matches("failed v6hole.test:" .. port .. " (no answer before the sandbox ended " .. net.ip6 .. ")", out,
      nil, true)
    -- the control: the same IPv6 address first, then IPv4 after the 250 ms head start
    local t = tonumber(control:match("hello%-from%-the%-internet\n time=([%d.]+)"))
    assert.truthy(t, control)
    assert.is_true(t >= 0.25, "IPv4 was tried before IPv6's head start ran out: " .. control)
    local won
    for line in (h.read(log) or ""):gmatch("[^\n]+") do
      local e = require("dkjson").decode(line)
      if e and e.kind == "closed" and e.name == "he.test" then won = e.upstream end
    end
    assert.are.equal(net.ip, won) -- IPv4 won the race
  end)

  it("--idle cuts a connection silent for longer; without it, or longer, it is kept", function()
    local echo = "(echo first; sleep 2.5; echo second) | nc -N -w 5 echo.test " .. net.echo_port .. "; echo nc-done"
    local common = { "--allow", "echo.test:" .. net.echo_port, "--resolve", "echo.test=" .. net.ip }
    local function with(extra)
      local args = {}
      for _, a in ipairs(common) do args[#args + 1] = a end
      for _, a in ipairs(extra) do args[#args + 1] = a end
      return run(args, echo)
    end
    -- the log says why each connection closed: the idle timer, or its ends
    local log = net.dir .. "/idle.jsonl"
    local function closed_reason()
      local reason
      for line in (h.read(log) or ""):gmatch("[^\n]+") do
        local e = require("dkjson").decode(line)
        if e and e.kind == "closed" and e.name == "echo.test" then reason = e.reason end
      end
      os.remove(log)
      return reason
    end
    os.remove(log)
    local cut = with({ "--idle", "1s", "--log-json", log })
    assert.matches("first", cut)
    assert.matches("nc%-done", cut)
    assert.is_nil(cut:find("second", 1, true), cut) -- cut after a second of silence
    assert.are.equal("idle for 1 s", closed_reason())
    local kept = with({ "--idle", "10s", "--log-json", log }) -- controls: a longer limit, and none
    assert.is_true(h.in_order(kept, { "first", "second", "nc%-done" }), kept)
    assert.matches("allowed by echo%.test", closed_reason())
    local default = with({})
    assert.is_true(h.in_order(default, { "first", "second", "nc%-done" }), default)
  end)

  it("--max-connections refuses the connection over it; one under it still connects", function()
    local hold = "sleep 3 | nc -N -w 4 echo.test " .. net.echo_port .. " >/dev/null 2>&1 & "
    local script = h.attempt_then_control(hold .. hold .. "sleep 0.5; echo x | nc -w 2 echo.test " ..
      net.echo_port .. "; r=$?; wait; (exit $r)",
      "echo after-the-cap | nc -N -w 2 echo.test " .. net.echo_port)
    local out, status = run({ "--allow", "echo.test:" .. net.echo_port, "--resolve", "echo.test=" .. net.ip,
      "--max-connections", "2" }, script)
    assert.are.equal(0, status, out)
    local _, _, attempt = h.after_attempt(out, "after%-the%-cap")
    assert.is_nil(attempt:match("^x\n"), out) -- the third connection echoed nothing
    assert.matches("connection cap reached %(2%)", out)
  end)

  it("2,000 concurrent connections through one sandbox, corral started at a soft fd limit of 1024", function()
    -- corral needs ~6 fds a connection (12,000 + its own) and the server 8,192: a hard
    -- limit below that cannot hold 2,000, whatever corral does
    local hard = tonumber(h.sh("ulimit -Hn"):match("%d+")) or math.huge
    if hard < 13000 then
      return pending("the hard fd limit here is " .. hard .. ", below the 13,000 that 2,000 need")
    end
    -- an echo server of the test's own in the internet netns, counting connections open at once
    local port, peak = 9558, net.dir .. "/peak"
    h.write(net.dir .. "/echo2k.py", table.concat({
      "import asyncio, sys",
      "live = top = 0",
      "async def serve(r, w):",
      "    global live, top",
      "    live += 1; top = max(top, live)",
      "    open(sys.argv[2], 'w').write(str(top))",
      "    try:",
      "        while d := await r.read(4096):",
      "            w.write(d); await w.drain()",
      "    except OSError: pass",
      "    live -= 1; w.close()",
      "async def main():",
      "    srv = await asyncio.start_server(serve, sys.argv[3], int(sys.argv[1]), backlog=4096)",
      "    async with srv: await srv.serve_forever()",
      "asyncio.run(main())", "" }, "\n"))
    local srv = h.sh(string.format("ip netns exec %s sh -c " ..
      "'ulimit -n 8192; exec /usr/bin/python3 %s/echo2k.py %d %s %s' " ..
      ">/dev/null 2>&1 & echo pid=$!", net.ns, net.dir, port, peak, net.ip)):match("pid=(%d+)")
    assert(h.wait_for(function()
      return h.sh(string.format("ip netns exec %s ss -ltn | grep -c ':%d '", net.ns, port)):match("^1")
    end, 5), "the echo server did not start")
    -- the tenant's client: opens N connections one after another, each echoing once, keeps
    -- them all open, then has each echo again
    local client = "/usr/bin/python3 - echo2k.test " .. port .. " $N <<'PY'\n" ..
      "import socket, sys\n" ..
      "host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n" ..
      "socks = []\n" ..
      "try:\n" ..
      "    for i in range(n):\n" ..
      "        s = socket.create_connection((host, port), timeout=10)\n" ..
      "        s.sendall(b'a%d;' % i)\n" ..
      "        assert s.recv(64) == b'a%d;' % i\n" ..
      "        socks.append(s)\n" ..
      "except (OSError, AssertionError) as e:\n" ..
      "    print('stopped at', len(socks), repr(e))\n" ..
      "echoed = 0\n" ..
      "for i, s in enumerate(socks):\n" ..
      "    s.sendall(b'b%d;' % i)\n" ..
      "    echoed += s.recv(64) == b'b%d;' % i\n" ..
      "print('open', len(socks), 'echoed', echoed)\n" ..
      "PY\n"
    local function corral_at_1024(n, extra, nofile)
      local argv = { h.host, "run", "--internal", net.cidr, "--allow", "echo2k.test:" .. port,
        "--resolve", "echo2k.test=" .. net.ip }
      if nofile ~= false then argv[#argv + 1] = "--nofile=4096" end
      for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
      for _, a in ipairs({ "--", "sh", "-c", "echo tenant-soft=$(ulimit -Sn); N=" .. n .. "; " .. client }) do
        argv[#argv + 1] = a
      end
      local words = {}
      for i, a in ipairs(argv) do words[i] = h.quote(a) end
      return h.sh("ulimit -Sn 1024 && exec " .. table.concat(words, " ") .. " 2>&1")
    end
    local ok, err = pcall(function()
      local out, status = corral_at_1024(2000)
      assert.are.equal(0, status, out)
      assert.matches("open 2000 echoed 2000\n", out, nil, true)
      assert.is_nil(out:find("stopped at", 1, true), out)
      assert.are.equal("2000", h.read(peak)) -- the server had all 2,000 open at once
      assert.is_nil(out:find("corral run:", 1, true), out) -- nothing denied, nothing lowered
      -- corral raised its own fd limit, not the tenant's (--nofile aside, it starts as corral did)
      assert.matches("tenant-soft=1024\n", (corral_at_1024(1, {}, false)), nil, true)
      -- control: the cap counts connections held this way; the one past it is refused
      out, status = corral_at_1024(501, { "--max-connections", "500" })
      assert.are.equal(0, status, out)
      assert.matches("stopped at 500", out, nil, true)
      assert.matches("open 500 echoed 500\n", out, nil, true)
      assert.matches("connection cap reached (500)", out, nil, true)
    end)
    if srv then os.execute("kill " .. srv .. " 2>/dev/null") end
    assert(ok, err)
  end)

  it("summarises what it denied on stderr, naming the option; --verbose prints it at once", function()
    local script = h.attempt_then_control(
      "curl -sS --max-time 3 http://evil.test:8080/; curl -sS --max-time 3 http://pypi.org:9444/",
      "curl -sS --max-time 5 http://pypi.org:8080/index.html")
    local args = { "--allow", "pypi.org:8080", "--allow", "logger.test:9444", "--resolve", "pypi.org=" .. net.ip,
      "--resolve", "logger.test=" .. net.ip }
    local out, status = run(args, script)
    assert.are.equal(0, status, out)
    h.after_attempt(out, "hello%-from%-the%-internet")
    local summary = out:match("corral run: egress: .*$") or ""
    assert.matches("denied evil.test (no entry names it; --allow evil.test:PORT would)", summary, nil, true)
    assert.matches("denied pypi.org:9444 (port not allowed for pypi.org; --allow pypi.org:9444 would)",
      summary, nil, true)
    assert.is_nil(summary:find("8080", 1, true), summary) -- the allowed connection is not in it
    -- --verbose: the same line as it happens, before the control's output
    args[#args + 1] = "--verbose"
    out = run(args, script)
    assert.is_true(h.in_order(out, { "corral run: denied evil.test", "hello%-from%-the%-internet",
      "corral run: egress: " }), out)
  end)

  it("logs every connection the ruleset refused at its SYN, by name and port; the allowed port's too", function()
    local log = net.dir .. "/syn.jsonl"
    local script = h.attempt_then_control(
      "nc -z -w 2 pypi.org 9444; nc -z -w 2 pypi.org 9444; nc -z -w 2 " .. net.ip .. " 22",
      "curl -sS --max-time 5 http://pypi.org:8080/index.html")
    local out, status = run({ "--allow", "pypi.org:8080", "--resolve", "pypi.org=" .. net.ip, "--log-json", log },
      script)
    assert.are.equal(0, status, out)
    local rc = h.after_attempt(out, "hello%-from%-the%-internet")
    assert.are.equal(1, rc, out) -- the attempt's last nc was refused
    local json = require "dkjson"
    local syn, ip_syn, allowed, closed = 0, 0, nil, nil
    for line in (h.read(log) or ""):gmatch("[^\n]+") do
      local e = assert(json.decode(line), line)
      if e.by == "ruleset" then
        assert.are.equal("deny", e.verdict)
        assert.are.equal("connect", e.kind)
        assert.matches("refused at the SYN by the ruleset", e.reason, nil, true)
        if e.name == "pypi.org" and e.port == 9444 then
          syn = syn + e.count
          assert.matches("allowed only on ports 8080", e.reason, nil, true)
        elseif e.ip == net.ip and e.port == 22 then
          ip_syn = ip_syn + e.count
          assert.matches("not in the allowlist", e.reason, nil, true)
        end
      elseif e.kind == "connect" and e.verdict == "allow" then
        allowed = e
      elseif e.kind == "closed" then
        closed = e
      end
    end
    assert.is_true(syn >= 2, "the two refused SYNs to pypi.org:9444 were not logged: " .. tostring(h.read(log)))
    assert.is_true(ip_syn >= 1, h.read(log))
    -- control: the allowed port went through the acceptor and is logged as relayed
    assert.are.equal("pypi.org", allowed and allowed.name)
    assert.are.equal(8080, allowed.port)
    assert.is_true(closed and closed.bytes > 0, h.read(log))
    assert.is_true(allowed.time ~= math.floor(allowed.time) or closed.time ~= math.floor(closed.time))
  end)

  it("--allow: the tenant's own loopback and a single label are refused saying why; URL forms work", function()
    for _, bad in ipairs({ { "127.0.0.1:8080", "own loopback" }, { "localhost:8080", "own loopback" },
      { "garbage", "single%-label name" },
      { "https://pypi.org/simple/", "a path is enforced only where TLS is terminated: bind a secret to " ..
        "pypi%.org:443 with %-%-secret" } }) do
      local out, status = h.corral("run", "--allow", bad[1], "--", "true")
      assert.are.equal(2, status, out)
      assert.matches("--allow", out, nil, true)
      assert.matches(bad[2], out)
    end
    -- controls: a URL's scheme gives the port; the path "/" is no path
    local out, status = run({ "--allow", "http://pypi.org:8080/", "--resolve", "pypi.org=" .. net.ip },
      "curl -sS --max-time 5 http://pypi.org:8080/index.html")
    assert.are.equal(0, status, out)
    assert.matches("hello%-from%-the%-internet", out)
    out, status = run({ "--allow", "http://pypi.org", "--resolve", "pypi.org=" .. net.ip },
      h.attempt_then_control("curl -sS --max-time 3 http://pypi.org:8080/", "echo port-80-only"))
    assert.are.equal(0, status, out)
    local rc = h.after_attempt(out, "port%-80%-only")
    assert.are_not.equal(0, rc, out) -- http:// is port 80, not 8080
  end)

  it("resets a TLS connection whose SNI names another host, and an HTTP request whose Host does", function()
    local log = net.dir .. "/sni.jsonl"
    local tls = "api.test:" .. TLS_PORT
    local script = h.attempt_then_control(
      "openssl s_client -connect " .. tls .. " -servername evil.test </dev/null 2>&1 | grep -c 'BEGIN CERTIFICATE'; " ..
      "curl -sk --max-time 3 --connect-to evil.test:" .. TLS_PORT .. ":" .. tls .. " https://evil.test:" ..
      TLS_PORT .. "/ | grep -c s_server; " ..
      "curl -sS --max-time 3 -H 'Host: evil.test' http://pypi.org:8080/index.html",
      "openssl s_client -connect " .. tls .. " -servername api.test </dev/null 2>&1 | grep -c 'BEGIN CERTIFICATE'; " ..
      "curl -sk --max-time 5 https://" .. tls .. "/ | grep -o 's_server' | head -1; " ..
      "curl -sS --max-time 5 http://pypi.org:8080/index.html")
    local out, status = run({ "--allow", tls, "--allow", "pypi.org:8080", "--resolve", "api.test=" .. net.ip,
      "--resolve", "pypi.org=" .. net.ip, "--log-json", log }, script)
    assert.are.equal(0, status, out)
    local _, control, attempt = h.after_attempt(out, "hello%-from%-the%-internet")
    assert.matches("^0\n0\n", attempt)                       -- no certificate, no page: reset before any
    assert.is_nil(attempt:find("hello-from-the-internet", 1, true), attempt)
    assert.matches("^1\ns_server\n", control)                 -- controls: the right names get through
    local raw = h.read(log) or ""
    assert.matches('"reason":"SNI evil.test on a connection to api.test"', raw, nil, true)
    assert.matches('"reason":"Host evil.test on a connection to pypi.org"', raw, nil, true)
    assert.matches("denied api.test:" .. TLS_PORT .. " (SNI evil.test on a connection to api.test)", out, nil, true)
    -- --sni off: the same mismatch is relayed (the check is the only thing that stopped it)
    out = run({ "--allow", tls, "--resolve", "api.test=" .. net.ip, "--sni", "off" },
      "openssl s_client -connect " .. tls .. " -servername evil.test </dev/null 2>&1 | grep -c 'BEGIN CERTIFICATE'")
    assert.matches("^1\n", out)
  end)

  it("a client silent past the wait still has its first request checked: a late wrong Host never arrives", function()
    local log = net.dir .. "/late.jsonl"
    local function late(host, path)
      return string.format("(sleep 1; printf 'GET /%s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n'; sleep 1) " ..
        "| nc -N -w 3 logger.test 9444; echo nc-rc=$?", path, host)
    end
    local out, status = run({ "--allow", "logger.test:9444", "--resolve", "logger.test=" .. net.ip,
      "--log-json", log }, h.attempt_then_control(late("evil.test", "late-evil"),
      late("logger.test", "late-good") .. "; sleep 0.5; echo control-done"))
    assert.are.equal(0, status, out)
    h.after_attempt(out, "control%-done")
    assert.is_true(h.wait_for(function()
      return (h.read(net.dir .. "/tcp9444.log") or ""):find("late-good", 1, true)
    end, 3),
      "the control's request never reached the server: " .. tostring(h.read(net.dir .. "/tcp9444.log")))
    local seen = h.read(net.dir .. "/tcp9444.log")
    assert.is_nil(seen:find("late-evil", 1, true), seen) -- the server never saw the late wrong Host
    assert.is_nil(seen:find("evil.test", 1, true), seen)
    assert.matches("Host: logger.test", seen, nil, true)  -- control: the late right one went through
    local raw = h.read(log) or ""
    assert.matches('"kind":"cut"', raw, nil, true)
    assert.matches('"reason":"Host evil.test on a connection to logger.test"', raw, nil, true)
    assert.matches("cut logger.test:9444 (Host evil.test on a connection to logger.test)", out, nil, true)
  end)

  it("a protocol whose server speaks first still works under --sni match, and its answer is checked", function()
    -- The client sends nothing until it has the server's banner (past SNI_WAIT): its
    -- upstream must be connected while its own bytes are held, then checked.
    local function client(answer)
      return "/usr/bin/python3 - '" .. answer .. "' <<'PY'\n" ..
        "import socket, sys\n" ..
        "s = socket.create_connection(('banner.test', " .. BANNER_PORT .. "), timeout=5)\n" ..
        "f = s.makefile('rb')\n" ..
        "banner = f.readline().decode().strip()\n" ..
        "s.sendall(sys.argv[1].encode().decode('unicode_escape').encode())\n" ..
        "try:\n    print(banner, f.readline().decode().strip() or 'no-answer')\n" ..
        "except OSError as e:\n    print(banner, 'reset')\n" ..
        "PY\n"
    end
    local log = net.dir .. "/banner.jsonl"
    local out, status = run({ "--allow", "banner.test:" .. BANNER_PORT, "--resolve", "banner.test=" .. net.ip,
      "--log-json", log },
      h.attempt_then_control(client("GET / HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n"),
        client("hello-after-banner\\n")))
    assert.are.equal(0, status, out)
    local _, control, attempt = h.after_attempt(out, "banner%-first got%-hello%-after%-banner")
    -- the attempt had the banner, then named another host: cut before the server had it
    assert.matches("^banner%-first ", attempt)
    assert.is_nil(attempt:find("got-", 1, true), attempt)
    assert.matches('"reason":"Host evil.test on a connection to banner.test"', h.read(log) or "", nil, true)
    assert.matches("^banner%-first got%-hello%-after%-banner\n", control) -- control: the same, answered plainly
  end)

  it("--sni require refuses a connection that names no host; match lets it through", function()
    local tls = "api.test:" .. TLS_PORT
    local cmd = "openssl s_client -connect " .. tls .. " -noservername </dev/null 2>&1 | grep -c 'BEGIN CERTIFICATE'"
    local out = run({ "--allow", tls, "--resolve", "api.test=" .. net.ip, "--sni", "require" },
      h.attempt_then_control(cmd, "openssl s_client -connect " .. tls .. " -servername api.test </dev/null 2>&1 " ..
        "| grep -c 'BEGIN CERTIFICATE'"))
    local _, control, attempt = h.after_attempt(out, "^1\n")
    assert.matches("^0\n", attempt)
    assert.matches("^1\n", control)
    assert.matches("TLS without SNI on a connection to api.test", out, nil, true)
    out = run({ "--allow", tls, "--resolve", "api.test=" .. net.ip }, cmd) -- the default, match
    assert.matches("^1\n", out)
    local bad, st = h.corral("run", "--allow", tls, "--sni", "maybe", "--", "true")
    assert.are.equal(2, st, bad)
    assert.matches("--sni", bad, nil, true)
  end)

  it("--learn records what a job wanted from three names; the list it writes then lets the job run", function()
    local file = net.dir .. "/learned.allow"
    local job = "for n in a.test b.test c.test; do curl -sS --max-time 3 http://$n:" .. net.http_port ..
      "/index.html; done; getent hosts never.test >/dev/null; true"
    local names = { "--resolve", "a.test=" .. net.ip, "--resolve", "b.test=" .. net.ip,
      "--resolve", "c.test=" .. net.ip }
    local args = { "--learn", file }
    for _, a in ipairs(names) do args[#args + 1] = a end
    local out, status = run(args, job)
    assert.are.equal(0, status, out)
    assert.is_nil(out:find("hello-from-the-internet", 1, true), out) -- learning relays nothing
    assert.matches("--learn: 3 entries written to " .. file, out, nil, true)
    local text = h.read(file) or ""
    for _, n in ipairs({ "a", "b", "c" }) do
      assert.matches("\n" .. n .. "%.test:" .. net.http_port .. "  # tcp, %d+ connections?\n", text)
    end
    assert.matches("# never.test: resolved", text, nil, true)
    -- control: the learned list, as written, lets the same job fetch all three
    local again = { "--allow-file", file }
    for _, a in ipairs(names) do again[#again + 1] = a end
    out, status = run(again, job)
    assert.are.equal(0, status, out)
    local _, fetched = out:gsub("hello%-from%-the%-internet", "")
    assert.are.equal(3, fetched, out)
    local bad, st = h.corral("run", "--learn", net.dir .. "/no/such/file", "--", "true")
    assert.are.equal(2, st, bad)
    assert.matches("--learn", bad, nil, true)
  end)

  it("refuses a bad --idle or --max-connections, or one without --allow, before starting", function()
    for _, bad in ipairs({ { "--idle", "soon" }, { "--idle", "-1" }, { "--max-connections", "0" } }) do
      local out, status = h.corral("run", "--allow", "pypi.org:443", bad[1], bad[2], "--", "true")
      assert.are.equal(2, status, out)
      assert.matches(bad[1], out, nil, true)
    end
    local out, status = h.corral("run", "--idle", "2h", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("give --allow too", out, nil, true)
    out, status = h.corral("run", "--allow", "pypi.org:443", "--idle", "2h", "--max-connections", "8000",
      "--", "true") -- control
    assert.are.equal(0, status, out)
  end)
end)
