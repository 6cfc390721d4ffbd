-- corral.egress.decision and corral.egress.synthetic: verdicts, the decide hook under
-- its instruction budget, and the synthetic address map. Each deny is paired with an
-- allow from the same policy in the same test.
local core = require "corral.core"
local allowlist = require "corral.egress.allowlist"
local decision = require "corral.egress.decision"
local synthetic = require "corral.egress.synthetic"

local inet = core.inet

local function policy(list, extra)
  local p = { allowlist = list and assert(allowlist.parse(list)) }
  for k, v in pairs(extra or {}) do p[k] = v end
  return p
end

local function decide(ctx, p)
  ctx.sandbox = ctx.sandbox or "sb"
  return decision.decide(ctx, p)
end

describe("decision: allowlist", function()
  local p = policy({ "pypi.org:443", "*.example.com:443", "192.0.2.10:22", "[2001:db8::]/32:443" })

  it("allows a listed name on its port and denies it on another, naming the ports", function()
    local v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("allow", v.verdict)
    assert.are.equal("pypi.org:443", v.entry)
    assert.are.equal("allowlist", v.by)
    v = decide({ name = "pypi.org", port = 80 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("pypi%.org is allowed only on ports 443", v.reason)
  end)

  it("denies names outside the list, suffix tricks included", function()
    assert.are.equal("allow", decide({ name = "api.example.com", port = 443 }, p).verdict)
    for _, name in ipairs({ "evil.test", "example.com.evil.test", "evilexample.com", "example.com" }) do
      local v = decide({ name = name, port = 443 }, p)
      assert.are.equal("deny", v.verdict, name)
      assert.matches("not in the allowlist", v.reason, nil, false, name)
    end
  end)

  it("decides IP literals by IP entries only", function()
    assert.are.equal("allow", decide({ ip = "192.0.2.10", port = 22 }, p).verdict)
    assert.are.equal("allow", decide({ ip = "::ffff:192.0.2.10", port = 22 }, p).verdict)
    assert.are.equal("allow", decide({ ip = "2001:db8:5::1", port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ ip = "192.0.2.11", port = 22 }, p).verdict)
    assert.are.equal("deny", decide({ ip = "2001:db9::1", port = 443 }, p).verdict)
    -- a name entry never grants an address, nor an address entry a name
    assert.are.equal("deny", decide({ name = "192.0.2.10", port = 22 }, p).verdict)
  end)

  it("denies an unallocated synthetic address even when its range is listed", function()
    local wide = policy({ "198.18.0.0/15", "[64:ff9b:1::]/48", "192.0.2.0/24" })
    local v = decide({ ip = "198.18.0.1", port = 443 }, wide)
    assert.are.equal("deny", v.verdict)
    assert.matches("synthetic address that no name maps to", v.reason)
    assert.are.equal("deny", decide({ ip = "64:ff9b:1::c612:1", port = 443 }, wide).verdict)
    assert.are.equal("allow", decide({ ip = "192.0.2.1", port = 443 }, wide).verdict)
  end)

  it("denies malformed contexts and missing policies", function()
    assert.are.equal("allow", decide({ name = "pypi.org", port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ name = "pypi.org", port = 0 }, p).verdict)
    assert.are.equal("deny", decide({ name = "pypi.org", port = "443" }, p).verdict)
    assert.are.equal("deny", decide({ name = "pypi.org" }, p).verdict)
    assert.are.equal("deny", decide({ port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ name = "pypi_org", port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ ip = "not-an-ip", port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ name = "pypi.org", port = 443 }, nil).verdict)
    assert.are.equal("deny", decide({ name = "pypi.org", port = 443 }, {}).verdict)
  end)

  it("accepts a plain list of strings as the allowlist", function()
    assert.are.equal("allow", decide({ name = "pypi.org", port = 443 }, { allowlist = { "pypi.org" } }).verdict)
    local v = decide({ name = "pypi.org", port = 443 }, { allowlist = { "*.com" } })
    assert.are.equal("deny", v.verdict)
    assert.matches("invalid", v.reason)
  end)
end)

describe("decision: UDP", function()
  local p = policy({ "api.example.com:443", "udp:api.example.com:8443", "udp:ntp.example.com:123",
    "udp:192.0.2.0/24:5000" })

  it("allows a udp: entry's destination over UDP only, and says which protocol a name has", function()
    local v = decide({ name = "ntp.example.com", port = 123, protocol = "udp" }, p)
    assert.are.equal("allow", v.verdict)
    assert.are.equal("udp:ntp.example.com:123", v.entry)
    v = decide({ name = "ntp.example.com", port = 123 }, p) -- TCP, the default
    assert.are.equal("deny", v.verdict)
    assert.matches("ntp%.example%.com is allowed only for UDP %(ports 123%), not TCP", v.reason)
    v = decide({ name = "api.example.com", port = 443, protocol = "udp" }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("^udp to api%.example%.com port 443: api%.example%.com is allowed only on ports 8443", v.reason)
    assert.are.equal("allow", decide({ name = "api.example.com", port = 443, protocol = "tcp" }, p).verdict)
    assert.are.equal("allow", decide({ ip = "192.0.2.9", port = 5000, protocol = "udp" }, p).verdict)
    v = decide({ ip = "192.0.2.9", port = 5000 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("allowed only for UDP", v.reason)
    v = decide({ name = "evil.test", port = 123, protocol = "udp" }, p)
    assert.matches("evil%.test is not in the allowlist", v.reason)
    assert.are.equal("deny", decide({ name = "ntp.example.com", port = 123, protocol = "sctp" }, p).verdict)
  end)

  it("never lets a hook alone open UDP; with a list it narrows UDP too", function()
    local open = function() return true end
    local v = decide({ name = "any.example.com", port = 123, protocol = "udp" }, policy(nil, { decide = open }))
    assert.are.equal("deny", v.verdict)
    assert.matches("UDP is relayed only for udp: allowlist entries", v.reason)
    -- control: the same hook is the authority for TCP
    assert.are.equal("allow", decide({ name = "any.example.com", port = 443 }, policy(nil, { decide = open })).verdict)
    local seen
    local narrow = policy({ "udp:ntp.example.com:123" }, { decide = function(ctx)
      seen = ctx.protocol
      return false, "not today"
    end })
    v = decide({ name = "ntp.example.com", port = 123, protocol = "udp" }, narrow)
    assert.are.equal("deny", v.verdict)
    assert.are.equal("not today", v.reason)
    assert.are.equal("udp", seen)
  end)
end)

describe("decision: decide hook", function()
  it("can only narrow what the list allows", function()
    local calls = 0
    local p = policy({ "pypi.org:443", "files.example.com:443" }, {
      decide = function(ctx)
        calls = calls + 1
        if ctx.name == "files.example.com" then return false, "files are off today" end
        return true
      end,
    })
    local v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("allow", v.verdict)
    assert.are.equal("hook", v.by)
    v = decide({ name = "files.example.com", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.are.equal("files are off today", v.reason)
    assert.are.equal(2, calls)
    -- the list denies: the hook (which would say yes) is not asked
    assert.are.equal("deny", decide({ name = "other.example", port = 443 }, p).verdict)
    assert.are.equal(2, calls)
  end)

  it("is the sole authority without a list, but cannot open special ranges by IP", function()
    local p = policy(nil, {
      decide = function(ctx) return ctx.port == 443 end,
      internal = { "10.9.0.0/16" },
    })
    assert.are.equal("allow", decide({ name = "anything.example", port = 443 }, p).verdict)
    assert.are.equal("deny", decide({ name = "anything.example", port = 80 }, p).verdict)
    assert.are.equal("allow", decide({ ip = "192.0.2.1", port = 443 }, p).verdict)
    local v = decide({ ip = "169.254.169.254", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("metadata", v.reason)
    assert.are.equal("deny", decide({ ip = "10.1.2.3", port = 443 }, p).verdict)
    assert.are.equal("allow", decide({ ip = "10.9.2.3", port = 443 }, p).verdict)
    -- neither list nor hook: nothing
    v = decide({ name = "anything.example", port = 443 }, {})
    assert.are.equal("deny", v.verdict)
    assert.matches("no allowlist and no decide hook", v.reason)
  end)

  it("denies an infinite loop promptly, with the budget in the reason", function()
    local p = policy({ "pypi.org:443" }, { decide = function() while true do end end })
    local t0 = os.clock()
    local v = decide({ name = "pypi.org", port = 443 }, p)
    assert.is_true(os.clock() - t0 < 1)
    assert.are.equal("deny", v.verdict)
    assert.matches("exceeded its budget of 100000 instructions", v.reason)
    -- control: a hook doing bounded work under the same budget allows
    p.decide = function() local n = 0; for i = 1, 1000 do n = n + i end; return n > 0 end
    assert.are.equal("allow", decide({ name = "pypi.org", port = 443 }, p).verdict)
  end)

  it("denies a loop that catches the budget error, and honours a smaller budget", function()
    -- once exhausted, the very next instruction raises: the caught inner loop is
    -- entered once, not once per outer iteration (checked first: without that, the
    -- unbounded loop below would never end)
    local entered = 0
    local p = policy({ "pypi.org:443" }, {
      budget = 1000,
      decide = function()
        for _ = 1, 10000 do pcall(function() entered = entered + 1; while true do end end) end
        return true
      end,
    })
    local v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.are.equal(1, entered)
    p.budget = nil
    p.decide = function()
      while true do pcall(function() while true do end end) end
    end
    local t0 = os.clock()
    v = decide({ name = "pypi.org", port = 443 }, p)
    assert.is_true(os.clock() - t0 < 1)
    assert.are.equal("deny", v.verdict)
    assert.matches("budget", v.reason)
    -- 1000 loop iterations cost more than 100 instructions, and fewer than 100000
    local work = function() local n = 0; for i = 1, 1000 do n = n + i end; return true end
    p.decide, p.budget = work, 100
    assert.matches("budget of 100 instructions", decide({ name = "pypi.org", port = 443 }, p).reason)
    p.budget = nil
    assert.are.equal("allow", decide({ name = "pypi.org", port = 443 }, p).verdict)
    p.budget = 0
    assert.are.equal("deny", decide({ name = "pypi.org", port = 443 }, p).verdict)
  end)

  it("denies an erroring, recursing or yielding hook, saying which", function()
    local p = policy({ "pypi.org:443" })
    p.decide = function() error("boom") end
    local v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("decide hook failed: .*boom", v.reason)
    local function rec(n) return rec(n + 1) + 1 end
    p.decide, p.budget = function() return rec(1) end, 10000000
    v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("decide hook failed: .*stack overflow", v.reason)
    p.decide, p.budget = function() coroutine.yield(true) end, nil
    v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("deny", v.verdict)
    assert.matches("yielded", v.reason)
    p.decide = function() return "allow", "ok by me" end
    v = decide({ name = "pypi.org", port = 443 }, p)
    assert.are.equal("allow", v.verdict)
    assert.are.equal("ok by me", v.reason)
  end)

  it("denies any answer other than a boolean or allow/deny", function()
    local p = policy({ "pypi.org:443" })
    for _, answer in ipairs({ "yes", 1, 0, {}, "ALLOW", function() end }) do
      p.decide = function() return answer end
      local v = decide({ name = "pypi.org", port = 443 }, p)
      assert.are.equal("deny", v.verdict, tostring(answer))
      assert.matches("must return true/false or \"allow\"/\"deny\"", v.reason)
    end
    p.decide = function() end
    assert.matches("returned nil", decide({ name = "pypi.org", port = 443 }, p).reason)
    p.decide = function() return "deny" end
    assert.are.equal("denied by the decide hook", decide({ name = "pypi.org", port = 443 }, p).reason)
    p.decide = function() return true end
    assert.are.equal("allow", decide({ name = "pypi.org", port = 443 }, p).verdict)
    p.decide = "not a function"
    assert.are.equal("deny", decide({ name = "pypi.org", port = 443 }, p).verdict)
  end)

  it("runs on a copy of the context, with the matching entry", function()
    local seen
    local ctx = { sandbox = { id = "sb", tags = { "a" } }, name = "pypi.org", port = 443 }
    local p = policy({ "pypi.org:443" }, {
      decide = function(c)
        seen = c.entry
        c.name, c.port, c.sandbox.tags[1] = "evil.test", 1, "changed"
        return true
      end,
    })
    assert.are.equal("allow", decision.decide(ctx, p).verdict)
    assert.are.equal("pypi.org:443", seen)
    assert.are.equal("pypi.org", ctx.name)
    assert.are.equal(443, ctx.port)
    assert.are.equal("a", ctx.sandbox.tags[1])
    assert.is_nil(ctx.entry)
  end)
end)

describe("decision: resolvable", function()
  it("answers names on the list; with a hook alone every valid name, the hook never asked", function()
    local p = policy({ "pypi.org:443", "*.example.com" })
    assert.is_true(decision.resolvable("PyPI.org.", p))
    assert.is_true(decision.resolvable("a.example.com", p))
    assert.is_nil(decision.resolvable("example.com", p))
    assert.is_nil(decision.resolvable("evil.test", p))
    -- hook-only: the hook decides connections (with their port), never names at DNS time
    local seen = {}
    local hook = { sandbox = "s", decide = function(ctx)
      seen[#seen + 1] = ctx
      return ctx.name == "pypi.org" and ctx.port == 443, "pypi on 443"
    end }
    assert.is_true(decision.resolvable("evil.test", hook))
    assert.is_true(decision.resolvable("PyPI.org", hook))
    assert.are.same({}, seen)
    -- an invalid name is still refused, and so is everything without a policy
    assert.is_nil(decision.resolvable("evil_test", { decide = function() return true end }))
    assert.is_nil(decision.resolvable("pypi.org", {}))
    assert.is_nil(decision.resolvable("pypi.org", nil))
    -- the connection is where the hook answers: refused first, then its control
    assert.are.equal("deny", decision.decide({ sandbox = "s", name = "evil.test", port = 443 }, hook).verdict)
    assert.are.equal("deny", decision.decide({ sandbox = "s", name = "pypi.org", port = 80 }, hook).verdict)
    local v = decision.decide({ sandbox = "s", name = "pypi.org", port = 443 }, hook)
    assert.are.same({ "allow", "hook", "pypi on 443" }, { v.verdict, v.by, v.reason })
    assert.are.equal(3, #seen)
    for _, ctx in ipairs(seen) do assert.is_number(ctx.port) end
  end)
end)

describe("synthetic addresses", function()
  it("are stable per name, distinct across names, and map back", function()
    local s = synthetic.new("sb-1")
    local a1, b1 = s:address("pypi.org")
    local a2 = s:address("files.pythonhosted.org")
    assert.are.equal(a1, (s:address("PyPI.org.")))
    assert.are_not.equal(a1, a2)
    assert.are.equal(4, #b1)
    assert.are.equal(a1, inet.format(b1))
    assert.is_true(synthetic.is_synthetic(a1))
    assert.are.equal("pypi.org", s:lookup(a1))
    assert.is_nil(s:lookup(b1)) -- lookups take text: packed bytes are not an address there
    assert.are.equal("pypi.org", s:lookup("::ffff:" .. a1))
    assert.are.equal("files.pythonhosted.org", s:lookup(a2))
    -- an address in the range that was never given out, and one outside it
    assert.is_nil(s:lookup("198.18.0.0"))
    assert.is_nil(s:lookup("192.0.2.1"))
    assert.are.equal(2, s:count())
  end)

  it("gives IPv6 addresses in 64:ff9b:1::/96 sharing the name's slot", function()
    local s = synthetic.new("sb-1")
    local v4 = s:address("pypi.org")
    local v6, b6 = s:address("pypi.org", "inet6")
    assert.are.equal(16, #b6)
    assert.is_true(inet.in_cidr(b6, select(2, inet.parse("64:ff9b:1::")), 96))
    assert.are.equal(select(2, inet.parse(v4)), b6:sub(13))
    assert.are.equal("pypi.org", s:lookup(v6))
    assert.is_nil(s:lookup("64:ff9b:1:1::" .. v4)) -- inside the /48, outside the /96
    assert.is_true(synthetic.is_synthetic(v6))
    assert.is_false(synthetic.is_synthetic("64:ff9b:2::1"))
    assert.has_error(function() s:address("pypi.org", "inet7") end)
  end)

  it("never collide, stay in 198.18.0.0/15 and avoid .0 and .255", function()
    local s = synthetic.new("sb-many")
    local net = select(2, inet.parse("198.18.0.0"))
    local seen = {}
    for i = 1, 5000 do
      local name = "host" .. i .. ".example"
      local text, b = s:address(name)
      assert.is_nil(seen[text], name)
      seen[text] = name
      assert.is_true(inet.in_cidr(b, net, 15))
      local last = b:byte(4)
      assert.is_true(last ~= 0 and last ~= 255, text)
      assert.are.equal(name, s:lookup(text))
    end
    assert.are.equal(5000, s:count())
  end)

  it("depend on the seed, and are reproducible for one seed", function()
    local a, b, c = synthetic.new("sb-a"), synthetic.new("sb-a"), synthetic.new("sb-b")
    local differ = 0
    for i = 1, 20 do
      local n = "n" .. i .. ".example"
      assert.are.equal(a:address(n), b:address(n))
      if a:address(n) ~= c:address(n) then differ = differ + 1 end
    end
    assert.is_true(differ > 10)
  end)

  it("refuse past the limit, naming it, and keep serving the names they have", function()
    local s = synthetic.new("sb", { limit = 3 })
    for i = 1, 3 do assert.is_string((s:address("n" .. i .. ".example"))) end
    local a, err = s:address("n4.example")
    assert.is_nil(a)
    assert.are.equal("cannot_enforce", err.code)
    assert.matches("3 names", err.detail)
    assert.is_string((s:address("n2.example"))) -- control: an existing name still answers
    local bad, berr = s:address("bad_name.example")
    assert.is_nil(bad)
    assert.are.equal("invalid_argument", berr.code)
    assert.has_error(function() synthetic.new("sb", { limit = 0 }) end)
    assert.has_error(function() synthetic.new("sb", { limit = synthetic.CAPACITY + 1 }) end)
    assert.has_no.errors(function() synthetic.new("sb", { limit = synthetic.CAPACITY }) end)
  end)
end)
