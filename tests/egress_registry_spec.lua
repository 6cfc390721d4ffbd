-- corral.egress.registry, the corral.egress facade and corral.egress.events: live
-- allow/revoke, events to subscribers, the ring and the JSON-lines log.
local json = require "dkjson"
local egress = require "corral.egress"
local events = require "corral.egress.events"
local registry = require "corral.egress.registry"
local helpers = require "helpers"

local function connect(reg, id, name, port)
  return reg:decide({ sandbox = id, name = name, port = port }).verdict
end

describe("registry", function()
  it("allow and revoke take effect on the next decision", function()
    local reg = registry.new()
    assert.are.equal("deny", connect(reg, "t1", "pypi.org", 443)) -- no policy yet
    assert.is_table(reg:allow("t1", "pypi.org:443"))
    assert.are.equal("allow", connect(reg, "t1", "pypi.org", 443))
    assert.are.equal("deny", connect(reg, "t1", "pypi.org", 80))
    assert.are.equal(1, reg:revoke("t1", "PyPI.org.:443"))
    assert.are.equal("deny", connect(reg, "t1", "pypi.org", 443))
    assert.are.equal(0, reg:revoke("t1", "pypi.org:443"))
    assert.is_table(reg:allow("t1", "pypi.org:443"))
    assert.are.equal("allow", connect(reg, "t1", "pypi.org", 443))
  end)

  it("bumps the epoch at every change that took effect, and only then", function()
    local reg = registry.new()
    assert.are.equal(0, reg:epoch("e1"))
    reg:set("e1", { "pypi.org:443" })
    assert.are.equal(1, reg:epoch("e1"))
    reg:allow("e1", "example.com:443")
    assert.are.equal(2, reg:epoch("e1"))
    reg:allow("e1", "example.com:443") -- already there: nothing changed
    assert.are.equal(2, reg:epoch("e1"))
    reg:revoke("e1", "nothere.example:443") -- nothing removed
    assert.are.equal(2, reg:epoch("e1"))
    assert.is_nil(reg:allow("e1", "*.com")) -- refused entry
    assert.are.equal(2, reg:epoch("e1"))
    reg:revoke("e1", "pypi.org:443")
    assert.are.equal(3, reg:epoch("e1"))
    reg:set("e1", { "pypi.org:443" })
    assert.are.equal(4, reg:epoch("e1"))
    assert.are.equal(0, reg:epoch("e2")) -- control: another sandbox has its own
  end)

  it("undoes a set or allow a subscriber could not follow, saying why; a revocation stands", function()
    local reg = registry.new()
    reg:set("u1", { "pypi.org:443" })
    local refuse = false
    reg:subscribe(function(_, p)
      if refuse then return nil, "ruleset: injected failure" end
      return p
    end)
    refuse = true
    local e, err = reg:allow("u1", "evil.test:443")
    assert.is_nil(e)
    assert.matches("injected failure", tostring(err))
    assert.are.equal("deny", connect(reg, "u1", "evil.test", 443)) -- not added
    assert.are.equal(1, reg:epoch("u1"))
    local p, serr = reg:set("u1", { "pypi.org:443", "evil.test:443" })
    assert.is_nil(p)
    assert.matches("injected failure", tostring(serr))
    assert.are.equal("deny", connect(reg, "u1", "evil.test", 443)) -- the previous policy stays
    assert.are.equal("allow", connect(reg, "u1", "pypi.org", 443))
    assert.are.equal(1, reg:epoch("u1"))
    assert.are.equal(1, reg:revoke("u1", "pypi.org:443"))    -- narrowing is never undone
    assert.are.equal("deny", connect(reg, "u1", "pypi.org", 443))
    refuse = false -- control: the same change, followed, takes effect
    assert.is_table(reg:allow("u1", "evil.test:443"))
    assert.are.equal("allow", connect(reg, "u1", "evil.test", 443))
    assert.are.equal(3, reg:epoch("u1"))
  end)

  it("keeps sandboxes apart", function()
    local reg = registry.new()
    reg:allow("t1", "pypi.org:443")
    reg:allow("t2", "example.com:443")
    assert.are.equal("allow", connect(reg, "t1", "pypi.org", 443))
    assert.are.equal("deny", connect(reg, "t2", "pypi.org", 443))
    assert.are.equal("allow", connect(reg, "t2", "example.com", 443))
    assert.are.equal("deny", connect(reg, "t3", "example.com", 443))
  end)

  it("refuses a bad entry naming it, and changes nothing", function()
    local reg = registry.new()
    reg:allow("t1", "pypi.org:443")
    local e, err = reg:allow("t1", "*.com:443")
    assert.is_nil(e)
    assert.are.equal("network.allow", err.argument)
    assert.matches('^"%*%.com:443": ', err.detail)
    local n, rerr = reg:revoke("t1", "pypi.org:0")
    assert.is_nil(n)
    assert.matches('^"pypi%.org:0": ', rerr.detail)
    assert.same({ "pypi.org:443" }, reg:get("t1").allowlist:texts())
    assert.are.equal("allow", connect(reg, "t1", "pypi.org", 443))
  end)

  it("set, get, list, remove", function()
    local reg = registry.new()
    local p, err = reg:set("t1", { "pypi.org:443", "10.0.0.0/8:22" }, { internal = { "10.1.0.0/16" } })
    assert.is_nil(err)
    assert.are.equal(p, reg:get("t1"))
    local text = p.synthetic:address("pypi.org")
    local _, serr = reg:set("t1", { "pypi.org:443", "x.y:0" })
    assert.matches('"x%.y:0"', serr.detail)
    local _, ierr = reg:set("t1", { "pypi.org" }, { internal = { "10.1.2.0/8" } })
    assert.are.equal("network.internal", ierr.argument)
    local _, derr = reg:set("t1", { "pypi.org" }, { decide = "yes" })
    assert.are.equal("network.decide", derr.argument)
    assert.are.equal(p, reg:get("t1")) -- failed sets left the policy alone
    -- a new set keeps the synthetic addresses already given out
    local p2 = assert(reg:set("t1", { "pypi.org:443" }))
    assert.are.equal(text, (p2.synthetic:address("pypi.org")))
    reg:allow("t2", "example.com")
    local l = reg:list()
    assert.are.equal(2, #l)
    assert.are.equal("t1", l[1].sandbox)
    assert.same({ "pypi.org:443" }, l[1].entries)
    assert.are.equal(1, l[1].names)
    assert.same({ "example.com" }, l[2].entries)
    assert.is_true(reg:remove("t1"))
    assert.is_false(reg:remove("t1"))
    assert.is_nil(reg:get("t1"))
    assert.are.equal("deny", connect(reg, "t1", "pypi.org", 443))
    assert.are.equal("allow", connect(reg, "t2", "example.com", 443))
    assert.has_error(function() reg:get(nil) end)
  end)

  it("tells its subscribers of every change, each protected, until they unsubscribe", function()
    local reg = registry.new()
    local seen = {}
    local function raises() error("boom") end
    local fn = reg:subscribe(function(id, p) seen[#seen + 1] = id .. ":" .. (p.allowlist and #p.allowlist or 0) end)
    assert.are.equal(raises, reg:subscribe(raises))   -- one that raises does not stop the next
    reg:subscribe(fn)                                  -- twice: still called once
    reg:set("t1", { "pypi.org:443" })
    reg:allow("t1", "example.com:443")
    reg:revoke("t1", "pypi.org:443")
    reg:revoke("t1", "nothing.test:443")              -- control: no change, no call
    reg:allow("t2", "pypi.org:443")                   -- a new sandbox: its policy made, then the entry
    assert.same({ "t1:1", "t1:2", "t1:1", "t2:0", "t2:1" }, seen)
    assert.same({ "example.com:443" }, reg:get("t1").allowlist:texts()) -- the raise undid nothing
    assert.is_true(reg:unsubscribe(fn))
    assert.is_false(reg:unsubscribe(fn))
    reg:allow("t1", "pypi.org:443")
    assert.are.equal(5, #seen)
    assert.has_error(function() reg:subscribe("not a function") end)
  end)

  it("turns a hook-only policy into a list one on the first allow", function()
    local reg = registry.new()
    reg:set("t1", nil, { decide = function() return true end })
    assert.are.equal("allow", connect(reg, "t1", "anything.example", 443))
    reg:allow("t1", "pypi.org:443")
    assert.are.equal("deny", connect(reg, "t1", "anything.example", 443))
    assert.are.equal("allow", connect(reg, "t1", "pypi.org", 443))
  end)
end)

describe("corral.egress facade and events", function()
  local sb = { id = "facade-sb" }
  before_each(function()
    events.reset()
    egress.remove(sb)
  end)

  it("allow/revoke on a sandbox table, decide emits one event per decision", function()
    local got = {}
    local fn = egress.subscribe(function(ev) got[#got + 1] = ev end)
    assert.is_table(egress.allow(sb, "pypi.org:443"))
    local v = egress.decide({ sandbox = sb, name = "pypi.org", port = 443 })
    assert.are.equal("allow", v.verdict)
    assert.are.equal(1, egress.revoke(sb, "pypi.org:443"))
    v = egress.decide({ sandbox = sb, name = "pypi.org", port = 443 })
    assert.are.equal("deny", v.verdict)
    assert.is_true(egress.unsubscribe(fn))
    assert.is_false(egress.unsubscribe(fn))
    egress.decide({ sandbox = sb, name = "pypi.org", port = 443 })
    assert.are.equal(2, #got)
    assert.are.equal("facade-sb", got[1].sandbox)
    assert.are.equal("pypi.org", got[1].name)
    assert.are.equal(443, got[1].port)
    assert.are.equal("allow", got[1].verdict)
    assert.are.equal("pypi.org:443", got[1].entry)
    assert.are.equal(0, got[1].bytes_up)
    assert.is_number(got[1].time)
    assert.are.equal("deny", got[2].verdict)
    assert.matches("not in the allowlist", got[2].reason)
    assert.are.equal(3, #egress.recent())
  end)

  it("a failing subscriber is counted and breaks neither emission nor the decision", function()
    local after = 0
    local bad = egress.subscribe(function() error("subscriber bug") end)
    local good = egress.subscribe(function() after = after + 1 end)
    egress.allow(sb, "pypi.org:443")
    local v = egress.decide({ sandbox = sb, name = "pypi.org", port = 443 })
    assert.are.equal("allow", v.verdict)
    assert.are.equal(1, after)
    local n, last = events.failures()
    assert.are.equal(1, n)
    assert.matches("subscriber bug", last)
    assert.are.equal(1, events.emit({ sandbox = "x", verdict = "deny" }))
    egress.unsubscribe(bad)
    egress.unsubscribe(good)
  end)

  it("keeps a bounded ring of recent events, oldest first", function()
    events.reset(4)
    for i = 1, 10 do events.emit({ sandbox = "r", port = i, verdict = "deny" }) end
    local r = egress.recent()
    assert.are.equal(4, #r)
    assert.are.equal(7, r[1].port)
    assert.are.equal(10, r[4].port)
    local two = egress.recent(2)
    assert.are.equal(9, two[1].port)
    assert.are.equal(10, two[2].port)
    assert.are.equal(4, #egress.recent(100))
  end)

  it("normalises addresses to canonical text, never reads text as bytes, drops non-scalar fields", function()
    events.emit({ sandbox = { id = "n" }, ip = "host", upstream = "::ffff:192.0.2.9", port = 1, verdict = "deny" })
    assert.are.equal('"host"', egress.recent(1)[1].ip) -- not 104.111.115.116
    events.emit({ sandbox = { id = "n" }, ip = "1::1", port = 1, verdict = "deny" })
    assert.are.equal("1::1", egress.recent(1)[1].ip) -- not 49.58.58.49
    events.emit({ sandbox = { id = "n" }, ip = "::ffff:192.0.2.1", upstream = "::ffff:192.0.2.9", port = 1,
                  verdict = "deny", junk = {} })
    local ev = egress.recent(1)[1]
    assert.are.equal("n", ev.sandbox)
    assert.are.equal("192.0.2.1", ev.ip)
    assert.are.equal("192.0.2.9", ev.upstream)
    assert.is_nil(ev.junk)
  end)

  it("writes one parseable JSON object per line", function()
    local dir = helpers.tmpdir("egress")
    local path = dir .. "/events.jsonl"
    local write, close = assert(events.json_lines_writer(path))
    egress.subscribe(write)
    egress.allow(sb, "pypi.org:443")
    egress.decide({ sandbox = sb, name = "pypi.org", port = 443 })
    egress.decide({ sandbox = sb, ip = "192.0.2.1", port = 22 })
    egress.unsubscribe(write)
    close()
    local lines = {}
    for line in assert(io.open(path)):lines() do lines[#lines + 1] = line end
    helpers.rmrf(dir)
    assert.are.equal(2, #lines)
    local a, _, aerr = json.decode(lines[1])
    assert.is_nil(aerr)
    assert.are.equal("allow", a.verdict)
    assert.are.equal("pypi.org", a.name)
    assert.are.equal(443, a.port)
    assert.are.equal("facade-sb", a.sandbox)
    local b = json.decode(lines[2])
    assert.are.equal("deny", b.verdict)
    assert.are.equal("192.0.2.1", b.ip)
    assert.matches("not in the allowlist", b.reason)
    -- after close the writer raises; emission still succeeds and counts it
    egress.subscribe(write)
    assert.are.equal(0, events.emit({ sandbox = "x", verdict = "deny" }))
    assert.are.equal(1, (events.failures()))
    egress.unsubscribe(write)
    local none, err = events.json_lines_writer("/nonexistent-dir/x.jsonl")
    assert.is_nil(none)
    assert.is_string(err)
  end)

  it("configure reads sandbox.network; DNS and upstream helpers follow the policy", function()
    local s = { id = "cfg-sb", network = { allow = { "pypi.org:443", "internal.example:443" },
                                           internal = { "10.1.0.0/16" } } }
    assert.is_table(egress.configure(s))
    assert.is_true(egress.resolvable(s, "pypi.org"))
    assert.is_nil(egress.resolvable(s, "evil.test"))
    local text = assert(egress.address(s, "pypi.org"))
    assert.are.equal("pypi.org", egress.lookup(s, text))
    assert.is_nil(egress.address(s, "evil.test"))
    assert.is_true(egress.check_resolved(s, "10.1.2.3"))
    assert.is_nil(egress.check_resolved(s, "10.2.2.3"))
    assert.is_nil(egress.check_resolved(s, "::ffff:169.254.169.254"))
    assert.is_true(egress.check_resolved(s, "192.0.2.1"))
    local bad, err = egress.configure({ id = "cfg-bad", network = { allow = { "pypi.org:99999" } } })
    assert.is_nil(bad)
    assert.matches('"pypi%.org:99999"', err.detail)
    egress.remove(s)
  end)
end)
