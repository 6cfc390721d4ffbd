-- corral.tier: tiers earned by probe and sealed in a receipt, against the real kernel.
-- Every denial is followed, in the same child, by a control that succeeds (DESIGN
-- invariant 2). CORRAL_EXPECT_S1=1 (CI, and the default when running as root here)
-- makes the S1 probe's failure a test failure instead of the S0 branch.
local core = require "corral.core"
local json = require "dkjson"
local h = require "helpers"
local join = require("corral.shell").join
local policy = require "corral.tier.policy"
local probe = require "corral.tier.probe"
local receipt = require "corral.tier.receipt"
local tier = require "corral.tier"

-- Unset, it defaults to 1 for root, which this machine's CI is.
local expect_s1 = os.getenv("CORRAL_EXPECT_S1") or ((h.sh("id -u")):match("^0\n") and "1" or "0")
expect_s1 = expect_s1 == "1"

-- the host program itself: the front `corral` would exec it, a second exec a step may deny
local HOST = assert(core.path.resolve_file(h.host_program))
local earned = probe.check()

local function s1_or_pending()
  if earned.tier == "S1" then return true end
  assert.is_false(expect_s1, "CORRAL_EXPECT_S1 is set and the probe did not hold: " .. tostring(earned.detail))
  pending("S1 is not earned here: " .. tostring(earned.detail))
  return false
end

-- Runs a step with its stdout and stderr captured; returns result, receipt and output.
local function captured_step(spec)
  local out = io.tmpfile()
  spec.stdout, spec.stderr = out, out
  local result, rec = tier.step(spec)
  out:seek("set")
  local text = out:read("a")
  out:close()
  return result, rec, text
end

-- Runs Lua code in the corral host as a step; returns result, receipt and output.
local function host_step(code, grants)
  grants = grants or {}
  grants.exec = grants.exec or {}
  grants.exec[#grants.exec + 1] = HOST
  return captured_step({ cmd = { HOST, "-e", code }, grants = grants })
end

describe("core.digest", function()
  it("hashes the FIPS 180-2 vector and agrees with sha256sum", function()
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", core.digest.sha256("abc"))
    local text = policy.canonical({ tier = "S0" }, assert(policy.check({})))
    local dir = h.tmpdir("digest")
    h.write(dir .. "/c", text)
    local out = h.capture({ "sha256sum", dir .. "/c" })
    h.rmrf(dir)
    assert.are.equal(out:match("^(%x+)"), (core.digest.sha256(text)))
    -- The comparison distinguishes: another text, another digest.
    assert.are_not.equal(out:match("^(%x+)"), (core.digest.sha256(text .. "x")))
  end)
end)

describe("tier grants and commitment", function()
  it("denies by default: no paths, no network, no subprocess, no environment", function()
    local g = assert(policy.check({}))
    assert.are.same({}, g.read)
    assert.are.same({}, g.write)
    assert.are.same({}, g.exec)
    assert.are.same({}, g.env)
    assert.is_false(g.net)
    assert.is_false(g.subprocess)
  end)

  it("resolves and sorts paths, so the same policy has one serialisation", function()
    local a = assert(policy.check({ read = { "/usr/share", "/bin" } }))
    local b = assert(policy.check({ read = { "/usr/bin", "/usr/share", "/usr/bin" } }))
    assert.are.same({ "/usr/bin", "/usr/share" }, a.read)
    local pol = { tier = "S1", mechanism = "landlock/7+seccomp" }
    assert.are.equal(policy.commitment(pol, a), policy.commitment(pol, b))
  end)

  it("is stable across runs and changed by any grant or the mechanism", function()
    local base = { read = { "/usr/share" }, write = { "/tmp" }, env = { "HOME" } }
    local pol = { tier = "S1", mechanism = "landlock/7+seccomp" }
    local c = assert(policy.commitment(pol, assert(policy.check(base))))
    assert.matches("^sha256:%x+$", c)
    -- Another process computes the same commitment.
    local out, status = h.corral("-e", [[
      package.path = "lua/?.lua;" .. package.path
      local p = require "corral.tier.policy"
      io.write(p.commitment({ tier = "S1", mechanism = "landlock/7+seccomp" },
        assert(p.check({ read = { "/usr/share" }, write = { "/tmp" }, env = { "HOME" } }))))]])
    assert.are.equal(0, status, out)
    assert.are.equal(c, out)
    local changes = {
      { read = { "/usr/share", "/etc" } }, { write = { "/tmp", "/var/tmp" } }, { exec = { "/usr/bin" } },
      { net = true }, { subprocess = true }, { env = { "HOME", "LANG" } }, { net = { "pypi.org:443" } },
      { net = { "pypi.org:443", "files.pythonhosted.org:443" } },
    }
    local seen = { [c] = true }
    for _, change in ipairs(changes) do
      local g = {}
      for k, v in pairs(base) do g[k] = v end
      for k, v in pairs(change) do g[k] = v end
      local d = assert(policy.commitment(pol, assert(policy.check(g))))
      assert.is_nil(seen[d], "a changed grant kept the commitment: " .. json.encode(change))
      seen[d] = true
    end
    local other = assert(policy.commitment({ tier = "S1", mechanism = "landlock/6+seccomp" },
      assert(policy.check(base))))
    assert.is_nil(seen[other])
  end)

  it("commits to an allowlist by its canonical entries, sorted, whatever their spelling", function()
    local pol = { tier = "S1", mechanism = "landlock/7+seccomp+egress" }
    local a = assert(policy.check({ net = { "PyPI.org.:443", "api.test:80,443" } }))
    local b = assert(policy.check({ net = { "api.test:443,80", "pypi.org:443", "pypi.org:443" } }))
    assert.are.same({ "api.test:80,443", "pypi.org:443" }, a.net)
    assert.are.equal(policy.commitment(pol, a), policy.commitment(pol, b))
    local text = policy.canonical(pol, a)
    assert.matches("grant net allow api.test:80,443\ngrant net allow pypi.org:443\n", text)
    -- The operator's internal ranges are part of what was enforced.
    local with_internal = setmetatable({ internal = { "127.0.0.1/32" } }, { __index = pol })
    assert.are_not.equal(policy.commitment(pol, a), policy.commitment(with_internal, a))
    local derived = policy.derive(a, { name = "landlock/7+seccomp" })
    assert.are.equal("landlock/7+seccomp+egress", derived.mechanism)
    -- Sockets are the plane's to decide: no nonet filter, and the resolver's files are read.
    assert.is_nil(policy.canonical(derived, a):find("seccomp nonet", 1, true))
    assert.matches("landlock r /etc/hosts\n", policy.canonical(derived, a))
  end)

  it("covers the exact seccomp programs and the Landlock rules applied", function()
    local g = assert(policy.check({ read = { "/usr/share" } }))
    local pol = policy.derive(g, { name = "landlock/7+seccomp" })
    local text = policy.canonical(pol, g)
    assert.matches("seccomp nonet %x+\n", text)
    assert.matches("seccomp nosubprocess %(supervised%) %x+\n", text)
    assert.matches("landlock r /usr/share\n", text)
    assert.matches("landlock rx /usr\n", text)
    -- /etc is granted file by file, never whole.
    assert.is_nil(text:find("landlock r /etc\n", 1, true))
  end)

  local refusals = {
    { { clock = false }, "cannot_enforce", "grants.clock" },
    { { random = false }, "cannot_enforce", "grants.random" },
    { { net = { "*.com:443" } }, "invalid_argument", "grants.net" },
    { { network = false }, "invalid_argument", "grants.network" },
    { { read = { "relative" } }, "invalid_argument", "grants.read" },
  }
  for _, r in ipairs(refusals) do
    it("refuses " .. json.encode(r[1]) .. " naming " .. r[3] .. ", and never runs the step", function()
      local dir = h.tmpdir("refuse")
      local grants = { write = { dir } }
      for k, v in pairs(r[1]) do grants[k] = v end
      local result, err = tier.step({ "/bin/sh", "-c", "echo ran > " .. dir .. "/marker", grants = grants })
      assert.is_nil(result)
      assert.are.equal(r[2], err.code)
      assert.are.equal(r[3], err.capability or err.argument)
      assert.is_nil(h.read(dir .. "/marker"))
      -- The control: the same step without the refused grant runs.
      local ok = assert(tier.step({ "/bin/sh", "-c", "echo ran > " .. dir .. "/marker",
        grants = { write = { dir } } }))
      assert.are.equal(0, ok.exit)
      assert.are.equal("ran\n", h.read(dir .. "/marker"))
      h.rmrf(dir)
    end)
  end
end)

describe("the seatbelt path (macOS)", function()
  local sbpl = require "corral.sbpl"
  local pol_of = function(grants)
    return assert(policy.derive_seatbelt(assert(policy.check(grants)), { name = "seatbelt/15.1" }, "/bin/sh"))
  end

  it("renders grants to a deny-default SBPL profile: the runtime, then each grant", function()
    local g = assert(policy.check({ read = { "/usr/share" }, write = { "/tmp" } }))
    local text = assert(sbpl.tier_profile(g, "/bin/sh"))
    assert.matches("^%(version 1%)\n%(deny default%)\n", text)
    assert.truthy(text:find('(allow file-read* (subpath "/usr/share"))\n', 1, true))
    assert.truthy(text:find('(allow file-read* file-write* (subpath "/tmp"))\n', 1, true))
    assert.truthy(text:find('(allow process-exec (literal "/bin/sh"))\n', 1, true))
    -- subprocess = false and net = false: no fork, no network operation at all.
    assert.is_nil(text:find("process-fork", 1, true))
    assert.is_nil(text:find("network", 1, true))
    -- The runtime's mach services are the control-plane profile's own.
    assert.truthy(text:find('(global-name "com.apple.system.logger")', 1, true))
    local open = assert(sbpl.tier_profile(assert(policy.check({ net = true, subprocess = true })), "/bin/sh"))
    assert.truthy(open:find("(allow network*)\n", 1, true))
    assert.truthy(open:find("(allow process-fork)\n", 1, true))
  end)

  it("commits to the exact profile: stable, and changed by any grant or the macOS version", function()
    local base = { read = { "/usr/share" } }
    local c = assert(policy.commitment(pol_of(base), assert(policy.check(base))))
    assert.are.equal(c, assert(policy.commitment(pol_of(base), assert(policy.check(base)))))
    assert.matches("\nsbpl %x+\n", policy.canonical(pol_of(base), assert(policy.check(base))))
    local seen = { [c] = true }
    for _, grants in ipairs({ { read = { "/usr/share", "/usr/bin" } }, { read = { "/usr/share" }, net = true },
      { read = { "/usr/share" }, subprocess = true }, { read = { "/usr/share" }, write = { "/tmp" } } }) do
      local d = assert(policy.commitment(pol_of(grants), assert(policy.check(grants))))
      assert.is_nil(seen[d], json.encode(grants))
      seen[d] = true
    end
    local g = assert(policy.check(base))
    local other = assert(policy.derive_seatbelt(g, { name = "seatbelt/14.0" }, "/bin/sh"))
    assert.is_nil(seen[assert(policy.commitment(other, g))])
  end)

  it("refuses an allowlist (no egress plane there) naming grants.net, and renders net = false", function()
    local r, err = sbpl.tier_profile(assert(policy.check({ net = { "api.test:443" } })), "/bin/sh")
    assert.is_nil(r)
    assert.are.equal("grants.net", err.capability)
    assert.truthy(sbpl.tier_profile(assert(policy.check({ net = false })), "/bin/sh"))
  end)

  it("is never taken on Linux: no sandbox-exec, and the earned mechanism is Landlock's", function()
    local sb, why = probe.seatbelt()
    if core.path.resolve_file("/usr/bin/sandbox-exec") then
      assert.matches("^seatbelt/", sb.mechanism)
      return
    end
    assert.is_nil(sb)
    assert.matches("sandbox%-exec is not on this host", why)
    if earned.tier == "S1" then assert.matches("^landlock/", earned.mechanism) end
  end)
end)

describe("the S1 probe #root", function()
  it("holds here and seals landlock/<abi>+seccomp", function()
    if not s1_or_pending() then return end
    assert.are.equal("S1", earned.tier)
    assert.matches("^landlock/%d+%+seccomp$", earned.mechanism)
    assert.is_true(earned.probe.control)
    -- read, fork, connect, exec; and capabilities where this process holds some.
    local holds_caps = core.tier.attempt("capabilities") and true or false
    assert.are.equal(holds_caps and 5 or 4, #earned.probe.attempts)
    for _, a in ipairs(earned.probe.attempts) do
      assert.is_true(a.denied, a.attempt)
      assert.is_true(a.control_after, a.attempt)
    end
  end)

  it("is cached: a second check is the same result", function()
    assert.are.equal(earned, probe.check())
  end)

  local mutations = { "no-landlock", "no-seccomp", "no-net-filter", "no-subprocess-filter", "control-fails",
    "bare-control-fails" }
  if core.tier.attempt("capabilities") then mutations[#mutations + 1] = "keep-capabilities" end
  for _, mutation in ipairs(mutations) do
    it("gives S0, never S1, when weakened: " .. mutation, function()
      if not s1_or_pending() then return end
      local r = probe.check(mutation)
      assert.are.equal("S0", r.tier, r.detail)
      assert.is_nil(r.mechanism)
      -- The unweakened probe, run again now, still holds (the mutation made the difference).
      assert.are.equal("S1", probe.check("").tier)
    end)
  end
end)

describe("a step at S1 #root", function()
  local dir, lfd, port
  before_each(function()
    dir = h.tmpdir("tier")
    assert(core.fs.mkdir(dir .. "/granted", tonumber("755", 8)))
    assert(core.fs.mkdir(dir .. "/outside", tonumber("755", 8)))
    h.write(dir .. "/granted/f", "granted\n")
    h.write(dir .. "/outside/f", "outside\n")
    lfd, port = assert(core.sock.listen("127.0.0.1", 0))
  end)
  after_each(function()
    lfd:close()
    h.rmrf(dir)
  end)

  it("denies a read outside its grants, then reads a granted file", function()
    if not s1_or_pending() then return end
    local result, rec, out = host_step(string.format([[
      local f = io.open(%q) print("outside", f and "READ" or "denied")
      local g = io.open(%q) print("control", g and g:read("l"))]], dir .. "/outside/f", dir .. "/granted/f"),
      { read = { dir .. "/granted" } })
    assert.are.equal(0, result.exit, out)
    assert.matches("outside\tdenied", out)
    assert.matches("control\tgranted", out)
    assert.are.equal("S1", rec.tier)
  end)

  it("denies a write outside its write grant, then writes inside it", function()
    if not s1_or_pending() then return end
    local result, _, out = host_step(string.format([[
      print("outside", io.open(%q, "w") and "WROTE" or "denied")
      local g = io.open(%q, "w") g:write("x") g:close() print("control ok")]],
      dir .. "/outside/new", dir .. "/granted/new"), { write = { dir .. "/granted" } })
    assert.are.equal(0, result.exit, out)
    assert.matches("outside\tdenied", out)
    assert.matches("control ok", out)
    assert.is_nil(h.read(dir .. "/outside/new"))
    assert.are.equal("x", h.read(dir .. "/granted/new"))
  end)

  it("holds no capability, where a bare child of this process holds some", function()
    if not s1_or_pending() then return end
    local code = [[print("caps", require("corral.core").tier.attempt("capabilities") and "HELD" or "none")
      print("control ok")]]
    -- The control: the same program as a bare child (S0).
    local out0 = io.tmpfile()
    local r0 = assert(core.tier.run({ path = HOST, argv = { HOST, "-e", code }, env = {}, stdout = out0 }))
    out0:seek("set")
    local text0 = out0:read("a")
    out0:close()
    assert.are.equal(0, r0.status, text0)
    local result, _, out = host_step(code)
    assert.are.equal(0, result.exit, out)
    assert.matches("caps\tnone", out)
    assert.matches("control ok", out)
    if not text0:find("caps\tHELD") then pending("this process holds no capability to drop") end
  end)

  it("with subprocess = false denies fork and exec, then makes a thread and carries on", function()
    if not s1_or_pending() then return end
    local result, rec, out = host_step([[
      local core = require "corral.core"
      print("fork", select(3, core.tier.attempt("fork")) == core.errno.EPERM and "denied" or "FORKED")
      print("thread", core.tier.attempt("thread") and "ok" or "failed")
      print("exec", select(3, core.proc.execve("/bin/true", { "true" }, {}, "/")) == core.errno.EPERM and "denied")
      print("control ok")]])
    assert.are.equal(0, result.exit, out)
    assert.matches("fork\tdenied", out)
    assert.matches("thread\tok", out)
    assert.matches("exec\tdenied", out)
    assert.matches("control ok", out)
    assert.are.equal(1, rec.execs_denied)
  end)

  it("with subprocess = true lets the same fork and exec through", function()
    if not s1_or_pending() then return end
    local result, _, out = host_step([[
      local core = require "corral.core"
      print("fork", core.tier.attempt("fork") and "ok")
      core.proc.execve("/bin/sh", { "sh", "-c", "echo exec ok" }, {}, "/")]], { subprocess = true })
    assert.are.equal(0, result.exit, out)
    assert.matches("fork\tok", out)
    assert.matches("exec ok", out)
  end)

  it("with net = false denies a connect to loopback, then passes a byte through a unix pair", function()
    if not s1_or_pending() then return end
    local result, _, out = host_step(string.format([[
      local core = require "corral.core"
      local ok, _, code = core.tier.attempt("connect", %d)
      print("connect", ok and "CONNECTED" or (code == core.errno.EPERM and "denied"))
      print("socketpair", core.tier.attempt("socketpair") and "ok")]], port))
    assert.are.equal(0, result.exit, out)
    assert.matches("connect\tdenied", out)
    assert.matches("socketpair\tok", out)
  end)

  it("with net = true connects to the same listener", function()
    if not s1_or_pending() then return end
    local result, _, out = host_step(string.format([[
      print("connect", require("corral.core").tier.attempt("connect", %d) and "ok")]], port), { net = true })
    assert.are.equal(0, result.exit, out)
    assert.matches("connect\tok", out)
  end)

  it("passes only the environment names granted", function()
    if not s1_or_pending() then return end
    local code = 'print("HOME", os.getenv("HOME") or "absent") print("PATH", os.getenv("PATH") or "absent")'
    local result, _, out = host_step(code)
    assert.are.equal(0, result.exit, out)
    assert.matches("HOME\tabsent", out)
    result, _, out = host_step(code, { env = { "HOME" } })
    assert.are.equal(0, result.exit, out)
    assert.matches("HOME\t" .. os.getenv("HOME"):gsub("%p", "%%%0"), out)
    assert.matches("PATH\tabsent", out)
  end)

  it("refuses a program that is neither in the runtime nor granted exec", function()
    if not s1_or_pending() then return end
    local result, err = tier.step({ HOST, "-e", "", grants = {} })
    assert.is_nil(result)
    assert.are.equal("grants.exec", err.argument)
    -- The control: granted, it runs.
    local ok = assert(tier.step({ HOST, "-e", "", grants = { exec = { HOST } } }))
    assert.are.equal(0, ok.exit)
  end)

  it("returns a full receipt and appends it as one JSON line", function()
    if not s1_or_pending() then return end
    local file = dir .. "/receipts.jsonl"
    local result, rec = tier.step({ "/bin/sh", "-c", "exit 7", grants = {}, receipts = file })
    assert.are.equal(7, result.exit)
    assert(tier.step({ "/bin/true", grants = {}, receipts = file }))
    for _, k in ipairs({ "tier", "mechanism", "commitment", "grants", "exit", "wall_s", "cpu_s", "max_rss",
      "energy", "probe", "residue" }) do
      assert.is_not_nil(rec[k], k)
    end
    assert.are.equal(7, rec.exit)
    assert.is_true(rec.cpu_s >= 0 and rec.wall_s > 0 and rec.max_rss > 0)
    local rapl = h.sh("ls /sys/class/powercap/intel-rapl:0/energy_uj 2>/dev/null") ~= ""
    assert.are.equal(rapl and "ModelBased" or "Estimator", rec.energy.method)
    if not rapl then assert.are.equal(rec.cpu_s * receipt.CORE_WATTS, rec.energy.joules) end
    local lines = {}
    for line in io.lines(file) do lines[#lines + 1] = json.decode(line) end
    assert.are.equal(2, #lines)
    assert.are.equal(rec.commitment, lines[1].commitment)
    assert.are.equal(7, lines[1].exit)
    assert.are.equal(0, lines[2].exit)
    assert.are.equal("S1", lines[2].tier)
  end)
end)

describe("a step with net = an allowlist #root #netns", function()
  -- A server of the test's own on the host, on every address: reached by name through
  -- the egress plane (api.test resolves to 127.0.0.1 from the operator's table), and
  -- by the host's own non-loopback address from here, which the step's bare IP uses.
  local port, server, host_ip, www
  setup(function()
    port = h.free_port()
    www = h.tmpdir("tier-www")
    h.write(www .. "/index.html", "hello-tier\n")
    server = h.sh(string.format("busybox httpd -f -p %d -h %s >/dev/null 2>&1 & echo $!", port, h.quote(www)))
      :match("%d+")
    host_ip = h.sh("ip -4 route get 192.0.2.1 2>/dev/null"):match("src (%d+%.%d+%.%d+%.%d+)") or "127.0.0.1"
    assert(h.wait_for(function()
      return h.sh(string.format("curl -s --max-time 1 http://127.0.0.1:%d/", port)):find("hello-tier", 1, true)
    end, 5), "the test server never answered")
  end)
  teardown(function()
    if server then os.execute("kill " .. server) end
    if www then h.rmrf(www) end
  end)

  local function allowlisted(script, grants)
    return captured_step({ cmd = { "/bin/sh", "-c", script }, timeout = 30,
      grants = grants or { net = { "api.test:" .. port }, subprocess = true },
      network = { internal = { "127.0.0.1/32" }, resolve = { ["api.test"] = "127.0.0.1" } } })
  end

  it("answers NXDOMAIN for a name not allowed, then reaches the allowed one, in the same child", function()
    if not s1_or_pending() then return end
    local result, rec, out = allowlisted(string.format([[
      dig +tries=1 +time=2 denied.test A | grep -o 'status: [A-Z]*'
      curl -sS --max-time 10 http://api.test:%d/; echo "control rc=$?"]], port))
    assert.are.equal(0, result.exit, out)
    assert.are.equal("S1", rec.tier)
    assert.matches("^landlock/%d+%+seccomp%+egress$", rec.mechanism)
    assert.are.same({ "api.test:" .. port }, rec.grants.net)
    assert.truthy(h.in_order(out, { "status: NXDOMAIN", "hello-tier", "control rc=0" }, true), out)
  end)

  it("resets a bare IP that the host itself reaches, then reaches the allowed name", function()
    if not s1_or_pending() then return end
    -- The host reaches that address (so the step's failure is the plane's refusal).
    assert.matches("hello%-tier", h.sh(string.format("curl -s --max-time 5 http://%s:%d/", host_ip, port)))
    local result, _, out = allowlisted(string.format([[
      curl -sS --max-time 5 http://%s:%d/; echo "bare rc=$?"
      curl -sS --max-time 10 http://api.test:%d/; echo "control rc=$?"]], host_ip, port, port))
    assert.are.equal(0, result.exit, out)
    local bare = out:match("bare rc=(%d+)")
    assert.truthy(bare and bare ~= "0", out)
    local before = out:sub(1, out:find("bare rc=", 1, true))
    assert.is_nil(before:find("hello-tier", 1, true), "the bare IP was reached: " .. out)
    assert.truthy(h.in_order(out, { "bare rc=", "hello-tier", "control rc=0" }, true), out)
  end)

  it("holds no capability over the namespace it runs in: nft is refused, then a granted read succeeds", function()
    if not s1_or_pending() then return end
    local result, _, out = allowlisted([[
      nft flush ruleset 2>&1; echo "nft rc=$?"
      cat /etc/hosts >/dev/null && echo "control ok"]])
    assert.are.equal(0, result.exit, out)
    local rc = out:match("nft rc=(%d+)")
    assert.truthy(rc and rc ~= "0", out)
    assert.truthy(h.in_order(out, { "nft rc=", "control ok" }, true), out)
  end)

  it("runs for a non-root caller too: its plane in a user namespace of its own, nft refused, then the control",
    function()
    if not s1_or_pending() then return end
    local missing, kind = h.test_user_missing()
    if kind == "kernel" then return pending(missing) end
    assert.is_nil(missing, missing)
    local dir = h.tmpdir("tier-nonroot")
    local script = dir .. "/t.lua"
    h.write(script, string.format([[
      local tier = require "corral.tier"
      local r, rec = tier.step({ cmd = { "/bin/sh", "-c", %q }, grants = { net = { "api.test:%d" }, subprocess = true },
        network = { internal = { "127.0.0.1/32" }, resolve = { ["api.test"] = "127.0.0.1" } } })
      print("allowlist", r and r.exit, rec and rec.tier, rec and rec.mechanism, r == nil and tostring(rec) or "")]],
      "nft flush ruleset 2>&1; echo \"nft rc=$?\"; curl -sS --max-time 5 http://denied.test:" .. port ..
      "/; echo \"denied rc=$?\"; curl -sS --max-time 10 http://api.test:" .. port .. "/; echo \"control rc=$?\"",
      port))
    os.execute("chmod -R a+rX " .. h.quote(dir))
    local out = h.sh(string.format("cd / && TMPDIR=/tmp %s env LUA_PATH=%s %s %s 2>&1",
      table.concat(h.as_test_user({}), " "), h.quote(os.getenv("PWD") .. "/lua/?.lua;" .. os.getenv("PWD") ..
      "/lua/?/init.lua;;"), h.quote(HOST), h.quote(script)))
    h.rmrf(dir)
    local nft_rc, denied_rc = out:match("nft rc=(%d+)"), out:match("denied rc=(%d+)")
    assert.truthy(nft_rc and nft_rc ~= "0", out)
    assert.truthy(denied_rc and denied_rc ~= "0", out)
    assert.truthy(h.in_order(out, { "nft rc=", "denied rc=", "hello-tier", "control rc=0",
      "allowlist\t0\tS1\tlandlock/" }, true), out)
  end)
end)

describe("S2: Lua in a fresh state (core.vm)", function()
  local function eval(code, opts) return core.vm.eval(code, opts) end

  -- After each stop, the host itself still allocates and runs.
  local function host_unaffected()
    local t = {}
    for i = 1, 1000 do t[i] = string.rep("y", 100) end
    assert.are.equal(1000, #t)
    local ok, r = eval("return 1 + 1")
    assert.is_true(ok)
    assert.are.equal(2, r[1])
  end

  it("returns values: scalars and flat tables", function()
    local ok, r = eval("return 1, 'two', true, nil, {a = 1, 2}")
    assert.is_true(ok)
    assert.are.equal(5, r.n)
    assert.are.same({ 1, "two", true, nil, { a = 1, 2 } }, { r[1], r[2], r[3], r[4], r[5] })
  end)

  it("stops on fuel exhaustion inside a coroutine", function()
    local ok, f = eval("coroutine.wrap(function() while true do end end)()", { fuel = 100000 })
    assert.is_false(ok)
    assert.are.equal("fuel", f.kind)
    -- The control: the same coroutine with an end returns.
    local cok, r = eval("return coroutine.wrap(function() for _ = 1, 10 do end return 'done' end)()",
      { fuel = 100000 })
    assert.is_true(cok)
    assert.are.equal("done", r[1])
  end)

  it("stops on fuel exhaustion, even inside pcall", function()
    local ok, f, st = eval("while true do pcall(function() while true do end end) end", { fuel = 100000 })
    assert.is_false(ok)
    assert.are.equal("fuel", f.kind)
    assert.are.equal(100000, st.fuel_used)
    host_unaffected()
  end)

  it("counts fuel exactly: fuel_used instructions run, one fewer stops at that count", function()
    for _, code in ipairs({ "return 1", "local x = 0 for i = 1, 5003 do x = x + i end return x",
      "local s = 0 for i = 1, 700 do s = s + #tostring(i) end return s" }) do
      local ok, _, st = eval(code)
      assert.is_true(ok, code)
      local used = st.fuel_used
      assert.is_true(used > 0, code)
      local eok, _, est = eval(code, { fuel = used })
      assert.is_true(eok, code)
      assert.are.equal(used, est.fuel_used, code)
      local sok, f, sst = eval(code, { fuel = used - 1 })
      assert.is_false(sok, code)
      assert.are.equal("fuel", f.kind, code)
      assert.are.equal(used - 1, sst.fuel_used, code)
    end
    -- each iteration of the same loop costs the same: nothing is charged by the thousand
    local function loop(n)
      local _, _, st = eval("local x = 0 for i = 1, " .. n .. " do x = x + i end")
      return st.fuel_used
    end
    assert.are.equal(loop(11) - loop(10), loop(1001) - loop(1000))
    assert.is_true(loop(11) > loop(10))
  end)

  it("charges what coroutines run, however short each one is", function()
    local body = "for i = 1, 500 do end"
    local _, _, plain = eval("for j = 1, 100 do (function() " .. body .. " end)() end")
    local _, _, co = eval("for j = 1, 100 do coroutine.wrap(function() " .. body .. " end)() end")
    local _, _, created = eval("for j = 1, 100 do coroutine.resume(coroutine.create(function() " .. body ..
      " end)) end")
    assert.is_true(plain.fuel_used > 100 * 500, plain.fuel_used)
    assert.is_true(co.fuel_used >= plain.fuel_used, co.fuel_used .. " < " .. plain.fuel_used)
    assert.is_true(created.fuel_used >= plain.fuel_used, created.fuel_used .. " < " .. plain.fuel_used)
    -- and the fuel those instructions need stops them
    local ok, f = eval("for j = 1, 100 do coroutine.wrap(function() " .. body .. " end)() end",
      { fuel = plain.fuel_used // 2 })
    assert.is_false(ok)
    assert.are.equal("fuel", f.kind)
  end)

  it("fails an allocation past the memory cap inside the state, not the host", function()
    local ok, f, st = eval("local t = {} for i = 1, 1e8 do t[i] = i end", { memory = 8 << 20 })
    assert.is_false(ok)
    assert.are.equal("memory", f.kind)
    assert.is_true(st.memory_peak <= 8 << 20)
    host_unaffected()
  end)

  it("stops a runaway string.rep", function()
    local ok, f = eval("return #string.rep('x', 1 << 30)", { memory = 16 << 20 })
    assert.is_false(ok)
    assert.are.equal("memory", f.kind)
    host_unaffected()
  end)

  it("stops a deep recursion", function()
    for _, code in ipairs({ "local function f() return 1 + f() end return f()",
      "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x" }) do
      local ok, f = eval(code, { memory = 256 << 20 })
      assert.is_false(ok)
      assert.truthy(f.kind == "stack" or f.kind == "memory" or f.kind == "error", f.kind)
      assert.matches("overflow", f.message)
    end
    host_unaffected()
  end)

  it("has no io, os, package, debug, require, dofile, loadfile or string.dump", function()
    local ok, r = eval("return io, os, package, debug, require, dofile, loadfile, string.dump, collectgarbage, " ..
      "type(string.format), type(math.floor), type(table.concat), type(coroutine.wrap), type(utf8.char)")
    assert.is_true(ok)
    for i = 1, 9 do assert.is_nil(r[i], i) end
    for i = 10, 14 do assert.are.equal("function", r[i]) end -- the control: the safe libraries are there
  end)

  it("refuses binary chunks, then loads text", function()
    local ok, r = eval([[
      local f, err = load("\27Lua\84\0\25\147\13\10\26\10")
      local g = load("return 40 + 2")
      return f == nil, err, g()]])
    assert.is_true(ok)
    assert.is_true(r[1])
    assert.matches("binary", r[2])
    assert.are.equal(42, r[3])
    local sok, sf = eval("\27Lua")
    assert.is_false(sok)
    assert.are.equal("syntax", sf.kind)
  end)

  it("reads only beneath a read grant, through read_file", function()
    local dir = h.tmpdir("vm")
    h.write(dir .. "/in", "granted")
    h.write(dir .. "/../corral-vm-outside-" .. core.proc.getpid(), "outside")
    local ok, r = eval(string.format("local a, e = read_file(%q) return a, e, read_file(%q)",
      dir .. "/../corral-vm-outside-" .. core.proc.getpid(), dir .. "/in"), { read = { dir } })
    os.remove(dir .. "/../corral-vm-outside-" .. core.proc.getpid())
    h.rmrf(dir)
    assert.is_true(ok)
    assert.is_nil(r[1])
    assert.matches("not within a read grant", r[2])
    assert.are.equal("granted", r[3])
    local nok, nr = eval("return read_file")
    assert.is_true(nok)
    assert.is_nil(nr[1]) -- no read grant: no function at all
  end)

  it("captures print, long lines included", function()
    local ok, _, st = eval("print('a', 1) print(string.rep('x', 20000)) print(string.rep('y', 20000))")
    assert.is_true(ok)
    assert.are.equal("a\t1\n" .. string.rep("x", 20000) .. "\n" .. string.rep("y", 20000) .. "\n", st.output)
  end)

  it("refuses a function as a result", function()
    local ok, f = eval("return function() end")
    assert.is_false(ok)
    assert.are.equal("unserialisable", f.kind)
  end)
end)

describe("S2 through a confined child #root", function()
  it("returns values and seals tier S2 over the S1 mechanism", function()
    if not s1_or_pending() then return end
    local result, rec = assert(tier.s2({ code = "print('hi') return 6 * 7, {k = 'v'}" }))
    assert.is_true(result.ok)
    assert.are.equal(42, result.values[1])
    assert.are.same({ k = "v" }, result.values[2])
    assert.are.equal("S2", rec.tier)
    assert.matches("^lua/5%.4%+landlock/%d+%+seccomp$", rec.mechanism)
    assert.are.equal("hi\n", rec.s2.output)
  end)

  it("reports fuel and memory stops from the child", function()
    if not s1_or_pending() then return end
    local r1 = assert(tier.s2({ code = "while true do end", fuel = 1000000 }))
    assert.is_false(r1.ok)
    assert.are.equal("fuel", r1.failure.kind)
    local r2 = assert(tier.s2({ code = "return #string.rep('x', 1 << 30)", memory = 16 << 20 }))
    assert.are.equal("memory", r2.failure.kind)
    -- The control: within its limits the same child returns.
    local r3 = assert(tier.s2({ code = "return #string.rep('x', 1 << 20)", memory = 16 << 20 }))
    assert.are.equal(1 << 20, r3.values[1])
  end)

  it("gives the child's Lua a read grant and nothing beyond it", function()
    if not s1_or_pending() then return end
    local dir = h.tmpdir("s2")
    h.write(dir .. "/f", "data")
    local r = assert(tier.s2({ code = string.format("return read_file(%q), read_file('/etc/hostname')", dir .. "/f"),
      grants = { read = { dir } } }))
    h.rmrf(dir)
    assert.is_true(r.ok)
    assert.are.equal("data", r.values[1])
    assert.is_nil(r.values[2])
  end)

  it("is what the REPL's corral.step runs", function()
    if not s1_or_pending() then return end
    local corral = require "corral"
    local rec = assert(corral.step({ s2 = "return 6 * 7" }))
    assert.are.equal("S2", rec.tier)
    assert.are.equal(42, rec.result.values[1])
    rec = assert(corral.step({ "/bin/true", grants = {} }))
    assert.are.equal("S1", rec.tier)
    assert.are.equal(0, rec.result.exit)
  end)

  it("is bare step{...} in the REPL on a terminal: a denied read, then the granted one", function()
    if not s1_or_pending() then return end
    local dir = h.tmpdir("tier-repl")
    assert(core.fs.mkdir(dir .. "/granted", tonumber("755", 8)))
    h.write(dir .. "/outside", "outside-secret\n")
    h.write(dir .. "/granted/f", "granted-data\n")
    local typed = string.format('r = step{"/bin/sh", "-c", "cat %s/outside; echo rc=$?; cat %s/granted/f", ' ..
      'grants = {read = {"%s/granted"}, subprocess = true}}\nprint("step", r.tier, r.mechanism, r.result.exit)\n' ..
      'print("s2", step{s2 = "return 6 * 7"}.result.values[1])\nos.exit(0)\n', dir, dir, dir)
    -- util-linux script gives the host a pseudo-terminal, so it opens its REPL.
    local out = h.sh("printf '%s' " .. h.quote(typed) .. " | env CORRAL_HISTORY= TERM=dumb timeout 20 script -qfec " ..
      h.quote("exec " .. HOST .. " -i") .. " /dev/null")
    h.rmrf(dir)
    out = out:gsub("\r", "")
    assert.is_nil(out:find("outside-secret", 1, true), out)
    assert.truthy(h.in_order(out, { "Permission denied", "rc=1", "granted-data", "step\tS1\tlandlock/" }, true), out)
    assert.truthy(out:find("s2\t42", 1, true), out)
  end)

  it("withholds the clock from Lua when clock = false, and offers it otherwise", function()
    if not s1_or_pending() then return end
    local denied = assert(tier.s2({ code = "return clock == nil and time == nil", grants = { clock = false } }))
    local granted, rec = assert(tier.s2({ code = "return type(clock()), type(time())" }))
    assert.is_true(denied.ok)
    assert.is_true(denied.values[1])
    assert.are.same({ "number", "number", n = 2 }, granted.values)
    assert.is_true(rec.grants.clock)
  end)

  it("refuses random = false at S2 too, saying where Lua sees randomness", function()
    local r, err = tier.s2({ code = "return 1", grants = { random = false } })
    assert.is_nil(r)
    assert.are.equal("grants.random", err.capability)
    assert.matches("pairs", err.detail)
  end)

  it("shows its child confined before it evaluates: a read and a fork denied, then a granted read", function()
    if not s1_or_pending() then return end
    local _, rec = assert(tier.s2({ code = "return 1" }))
    assert.matches("read of /etc: denied %(errno 13%), its fork: denied %(errno 1%), a granted read after " ..
      "them: ok", rec.s2.confined)
  end)

  it("refuses its result where the child's own check finds it unconfined (the runner run bare)", function()
    local host = core.path.resolve_file(core.proc.host_executable())
    local input, output = io.tmpfile(), io.tmpfile()
    input:write(json.encode({ code = "return 1", fuel = 1000000, memory = 16 << 20, granted = host,
      denied = "/etc" }))
    input:seek("set")
    local res = assert(core.tier.run({ path = host, argv = { host, "-e", tier.S2_RUNNER }, env = {}, cwd = "/",
      timeout = 10, stdin = input, stdout = output, stderr = output }))
    output:seek("set")
    local out = json.decode(output:read("a"))
    input:close()
    output:close()
    assert.are.equal(0, res.status)
    local confined, seen = tier.s2_confined(out.attested, "/etc")
    assert.is_false(confined)
    assert.matches("read of /etc: allowed", seen)
    -- the control: the same runner's result came back, so only its check told the two apart
    assert.is_true(out.ok)
  end)

  it("refuses grants S2 has no checked function for", function()
    local r, err = tier.s2({ code = "return 1", grants = { subprocess = true } })
    assert.is_nil(r)
    assert.are.equal("grants.subprocess", err.argument)
  end)
end)

describe("corral step #root", function()
  local dir
  before_each(function() dir = h.tmpdir("step") end)
  after_each(function() h.rmrf(dir) end)

  it("runs a command, passes its status through and prints a JSON receipt alone on stdout", function()
    if not s1_or_pending() then return end
    h.write(dir .. "/grants.lua", "return { read = { '/usr/share' } }")
    local step = { h.host, "step", "--grants", dir .. "/grants.lua", "--json", "--receipts", dir .. "/r", "--",
      "/bin/sh", "-c", "echo hello; exit 5" }
    local out, status = h.sh(join(step) .. " 2>" .. h.quote(dir .. "/err"))
    assert.are.equal(5, status, out)
    -- stdout is one JSON document, what `| jq` reads; the command's stdout went to stderr
    local rec, pos = json.decode(out)
    assert.is_table(rec, out)
    assert.are.equal("\n", out:sub(pos), out)
    assert.are.equal("hello\n", h.read(dir .. "/err"))
    assert.are.equal("S1", rec.tier)
    assert.are.equal(5, rec.exit)
    assert.are.same({ "/usr/share" }, rec.grants.read)
    assert.are.equal(rec.commitment, json.decode(h.read(dir .. "/r")).commitment)
    -- without --json the command's stdout stays on stdout, the receipt after it
    out, status = h.sh(join({ h.host, "step", "--grants", dir .. "/grants.lua", "--", "/bin/sh", "-c",
      "echo hello; exit 5" }) .. " 2>/dev/null")
    assert.are.equal(5, status, out)
    assert.truthy(h.in_order(out, { "hello\n", "tier ", "exit        5" }, true), out)
  end)

  it("runs --s2 under the README's grants, read = {\"/etc\"}: the child shows a directory outside them denied",
    function()
      if not s1_or_pending() then return end
      h.write(dir .. "/grants.lua", 'return { read = { "/etc" } }')
      h.write(dir .. "/code.lua", 'return #read_file("/etc/hostname") > 0, 6 * 7')
      local out, status = h.corral("step", "--s2", dir .. "/code.lua", "--grants", dir .. "/grants.lua", "--json")
      assert.are.equal(0, status, out)
      local rec = assert(json.decode(out), out)
      assert.are.same({ true, 42 }, rec.result)
      assert.matches("read of /: denied %(errno 13%), its fork: denied %(errno 1%), a granted read after them: ok",
        rec.s2.confined)
      -- without the grant, /etc is still the directory shown denied
      out, status = h.corral("step", "--s2", dir .. "/code.lua", "--json")
      assert.are.equal(1, status, out)
      rec = assert(json.decode(out), out)
      assert.matches("read of /etc: denied %(errno 13%)", rec.s2.confined)
      -- everything granted would leave no directory to show denied; / also holds the host
      -- key, which no grant may (corral.state_dir): refused first for that, never run
      h.write(dir .. "/all.lua", 'return { read = { "/" } }')
      out, status = h.corral("step", "--s2", dir .. "/code.lua", "--grants", dir .. "/all.lua")
      assert.are.equal(2, status, out)
      assert.matches("grants%.read: / holds corral's host key", out)
    end)

  it("seals the status it exits with in the S2 receipt: 1 when the code is stopped, 0 when it returns", function()
    if not s1_or_pending() then return end
    h.write(dir .. "/bad.lua", 'error("stop here")')
    local out, status = h.corral("step", "--s2", dir .. "/bad.lua", "--json", "--receipts", dir .. "/r")
    assert.are.equal(1, status, out)
    local rec = assert(json.decode(out), out)
    assert.are.equal(1, rec.exit)
    assert.are.equal("error", rec.failure.kind)
    assert.are.equal(1, json.decode(h.read(dir .. "/r")).exit)
    -- the control: the code that returns exits 0 and says so
    h.write(dir .. "/ok.lua", "return 1")
    out, status = h.corral("step", "--s2", dir .. "/ok.lua")
    assert.are.equal(0, status, out)
    assert.matches("\nexit +0\n", out)
  end)

  it("runs at S0 with no mechanism when the probe is weakened, and --tier S1 refuses", function()
    h.write(dir .. "/grants.lua", "return {}")
    local out, status = h.capture({ "env", "CORRAL_TIER_PROBE_MUTATE=no-landlock", h.host, "step", "--grants",
      dir .. "/grants.lua", "--json", "--", "/bin/true" })
    assert.are.equal(0, status, out)
    local rec = json.decode(out)
    assert.are.equal("S0", rec.tier)
    assert.are.equal("none", rec.mechanism)
    out, status = h.capture({ "env", "CORRAL_TIER_PROBE_MUTATE=no-seccomp", h.host, "step", "--grants",
      dir .. "/grants.lua", "--tier", "S1", "--", "/bin/true" })
    assert.are.equal(3, status, out)
    assert.matches("%-%-tier", out)
    out, status = h.capture({ "env", "CORRAL_TIER_PROBE_MUTATE=control-fails", h.host, "step", "--s2",
      dir .. "/grants.lua" })
    assert.are.equal(3, status, out)
    assert.matches("%-%-s2", out)
  end)

  it("is reported by corral probe: S1 with its mechanism here, S0 with the reason when weakened", function()
    if not s1_or_pending() then return end
    local out, status = h.corral("probe")
    assert.are.equal(0, status, out)
    assert.matches("\ntier +holds +S1: landlock/%d+%+seccomp: read, ", "\n" .. out)
    out, status = h.sh("CORRAL_TIER_PROBE_MUTATE=no-landlock " .. h.quote(HOST) .. " probe --json")
    assert.are.equal(0, status, out)
    local found
    for _, r in ipairs(assert(json.decode(out))) do
      if r.name == "tier" then found = r end
    end
    assert.is_false(found.holds)
    assert.matches("^S0: the confined probe exited", found.detail)
    assert.are.equal("S0", found.extra.tier)
  end)

  it("names the flag in its refusals", function()
    h.write(dir .. "/clock.lua", "return { clock = false }")
    local out, status = h.corral("step", "--grants", dir .. "/clock.lua", "--", "/bin/true")
    assert.are.equal(3, status)
    assert.matches("%-%-grants grants%.clock", out)
    out, status = h.corral("step", "--", "/bin/true")
    assert.are.equal(2, status)
    assert.matches("%-%-grants", out)
    out, status = h.corral("step", "--grants", dir .. "/missing.lua", "--", "/bin/true")
    assert.are.equal(2, status)
    assert.matches("%-%-grants", out)
    h.write(dir .. "/s2.lua", "return 1")
    out, status = h.corral("step", "--s2", dir .. "/s2.lua", "--fuel", "lots")
    assert.are.equal(2, status)
    assert.matches("%-%-fuel", out)
  end)

  it("runs Lua at S2 and exits 1 when it is stopped", function()
    if not s1_or_pending() then return end
    h.write(dir .. "/ok.lua", "return 2 + 3")
    local out, status = h.corral("step", "--s2", dir .. "/ok.lua", "--json")
    assert.are.equal(0, status, out)
    local rec = json.decode(out)
    assert.are.equal("S2", rec.tier)
    assert.are.same({ 5 }, { rec.result[1] })
    -- a small program's fuel is counted by the instruction, not charged by the thousand
    assert.is_true(rec.s2.fuel_used > 0 and rec.s2.fuel_used < 1000, tostring(rec.s2.fuel_used))
    h.write(dir .. "/loop.lua", "while true do end")
    out, status = h.corral("step", "--s2", dir .. "/loop.lua", "--fuel", "100000")
    assert.are.equal(1, status, out)
    assert.matches("stopped%s+fuel", out)
  end)
end)
