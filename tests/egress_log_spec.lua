-- The egress log: a DNS flood must not crowd connection decisions
-- out of the file, names are escaped once, every line carries the issue's fields, and
-- queries answered FORMERR/NOTIMP are logged. Every refusal is paired, in the same test,
-- with a control that succeeds under the same setup.
local core = require "corral.core"
local events = require "corral.egress.events"
local json = require "dkjson"
local h = require "helpers"
local errors = require "corral.errors"

-- A DNS query: labels (a list of strings, each one label as on the wire), then opts
-- `{id =, qtype =, qd =, ar =, tail =}` to break the shape.
local function query(labels, o)
  o = o or {}
  local s = string.pack(">I2I2I2I2I2I2", o.id or 7, o.flags or 0x0100, o.qd or 1, 0, 0, o.ar or 0)
  for _, l in ipairs(labels) do s = s .. string.char(#l) .. l end
  return s .. "\0" .. string.pack(">I2I2", o.qtype or 1, 1) .. (o.tail or "")
end

local OPT = "\0" .. string.pack(">I2I2I4I2", 41, 1232, 0, 0)

local function lines_of(text)
  local out = {}
  for line in (text or ""):gmatch("[^\n]+") do out[#out + 1] = assert(json.decode(line), line) end
  return out
end

describe("egress log: budgets by class", function()
  it("a DNS flood uses up only the DNS budget; connections keep theirs, denials theirs", function()
    local t, got = 100, {}
    local sub, flush = events.limit(function(ev) got[#got + 1] = ev end, 3, function() return t end)
    for i = 1, 10 do sub({ sandbox = "a", kind = "dns", verdict = "deny", name = "q" .. i, bytes = 0 }) end
    -- after the flood, in the same second: what the file must still show
    sub({ sandbox = "a", kind = "connect", verdict = "allow", name = "ok.test", port = 443, bytes = 0 })
    sub({ sandbox = "a", kind = "connect", verdict = "deny", name = "no.test", port = 443, bytes = 0 })
    sub({ sandbox = "a", kind = "closed", verdict = "allow", name = "ok.test", port = 443, bytes = 1234 })
    local kinds = {}
    for _, e in ipairs(got) do kinds[#kinds + 1] = e.kind .. ":" .. e.verdict end
    assert.are.same({ "dns:deny", "dns:deny", "dns:deny", "connect:allow", "connect:deny", "closed:allow" }, kinds)
    -- the closed class has its own limit too: a flood of ends is summed, bytes kept
    for i = 1, 4 do sub({ sandbox = "a", kind = "closed", verdict = "allow", bytes = 100 * i }) end
    assert.are.equal(8, #got) -- two more closed records fit (3 per class), two do not
    t = 101.5
    events.tick()
    local sum = {}
    for i = 9, #got do
      assert.are.equal("suppressed", got[i].kind)
      sum[got[i].class .. "/" .. got[i].verdict] = { got[i].suppressed, got[i].bytes }
    end
    assert.are.same({ ["dns/deny"] = { 7, 0 }, ["closed/allow"] = { 2, 300 + 400 } }, sum)
    flush()
  end)

  it("a flood of new connections never hides the byte counts of those that end", function()
    local got = {}
    local sub = events.limit(function(ev) got[#got + 1] = ev end, 3, function() return 7 end)
    for i = 1, 10 do sub({ sandbox = "c", kind = "connect", verdict = "allow", name = "n" .. i, bytes = 0 }) end
    sub({ sandbox = "c", kind = "closed", verdict = "allow", name = "n1", bytes = 4321 })
    sub({ sandbox = "c", kind = "failed", verdict = "allow", name = "n2", bytes = 0 })
    local kinds = {}
    for _, e in ipairs(got) do kinds[#kinds + 1] = e.kind end
    assert.are.same({ "connect", "connect", "connect", "closed", "failed" }, kinds)
    assert.are.equal(4321, got[4].bytes)
    assert.are.equal("connect", events.class({ kind = "connect", verdict = "allow" }))
    assert.are.equal("closed", events.class({ kind = "cut", verdict = "deny" }))
    assert.are.equal("refused", events.class({ kind = "connect", verdict = "deny" })) -- control
  end)

  it("UDP flows have their own budgets: decisions and ends, neither hidden by connections", function()
    local got = {}
    local sub = events.limit(function(ev) got[#got + 1] = ev end, 2, function() return 9 end)
    for i = 1, 5 do sub({ sandbox = "u", kind = "connect", verdict = "deny", name = "n" .. i, bytes = 0 }) end
    for i = 1, 3 do
      sub({ sandbox = "u", kind = "udp", protocol = "udp", verdict = "deny", name = "u" .. i, bytes = 0 })
    end
    sub({ sandbox = "u", kind = "udp_closed", protocol = "udp", verdict = "allow", name = "q", bytes = 2400 })
    sub({ sandbox = "u", kind = "cut", protocol = "udp", verdict = "deny", name = "q2", bytes = 10 })
    local kinds = {}
    for _, e in ipairs(got) do kinds[#kinds + 1] = e.kind end
    assert.are.same({ "connect", "connect", "udp", "udp", "udp_closed", "cut" }, kinds)
    assert.are.equal("udp", events.class({ kind = "udp", verdict = "allow" }))
    assert.are.equal("udp_closed", events.class({ kind = "cut", protocol = "udp", verdict = "deny" }))
    assert.are.equal("closed", events.class({ kind = "cut", verdict = "deny" })) -- control: TCP's cut
    local line = json.decode(events.encode({ sandbox = "u", kind = "udp", protocol = "udp", verdict = "deny",
      bytes = 0 }))
    assert.are.equal("udp", line.protocol)
  end)

  it("stamps each event with sub-second time", function()
    local a = events.now()
    local stamps = {}
    local function keep(ev) stamps[#stamps + 1] = ev.time end
    events.subscribe(keep)
    for _ = 1, 20 do events.emit({ sandbox = "t", kind = "error", verdict = "deny" }) end
    events.unsubscribe(keep)
    assert.is_true(math.abs(a - os.time()) <= 1)
    local fractional = 0
    for _, t in ipairs(stamps) do
      assert.is_true(t >= a and t <= events.now())
      if t ~= math.floor(t) then fractional = fractional + 1 end
    end
    assert.is_true(fractional >= 15, "whole seconds only: " .. table.concat(stamps, " "))
    -- control: a time the emitter gives is kept as it is
    events.subscribe(keep)
    events.emit({ sandbox = "t", kind = "error", verdict = "deny", time = 12 })
    events.unsubscribe(keep)
    assert.are.equal(12, stamps[#stamps])
  end)

  it("takes a rate per class, refuses unknown classes and bad rates", function()
    local got = {}
    local sub = events.limit(function(ev) got[#got + 1] = ev end, { dns = 1, refused = 2 }, function() return 5 end)
    for _ = 1, 3 do sub({ sandbox = "s", kind = "dns", verdict = "allow" }) end
    for _ = 1, 3 do sub({ sandbox = "s", kind = "connect", verdict = "deny" }) end
    assert.are.equal(1 + 2, #got)
    assert.has_error(function() events.limit(print, { dns = 1, http = 2 }) end)
    assert.has_error(function() events.limit(print, 0) end)
    assert.has_error(function() events.json_lines_writer("/tmp/x", { rate = { dns = -1 } }) end)
  end)
end)

describe("egress log: fields", function()
  it("writes sandbox, name, ip, port, verdict, reason and bytes on every line, null when absent", function()
    local dir = h.tmpdir("fields")
    local path = dir .. "/log.jsonl"
    local writer, close = assert(events.json_lines_writer(path))
    events.subscribe(writer)
    events.emit({ sandbox = "f", kind = "dns", name = "nope.test", verdict = "deny", reason = "not allowed",
      bytes = 0 })
    events.emit({ sandbox = "f", kind = "connect", name = "ok.test", ip = "198.18.0.9", port = 443,
      verdict = "allow", reason = "allowed by ok.test:443", bytes = 0 })
    events.emit({ sandbox = "f", kind = "error", verdict = "deny", reason = "boom" })
    events.unsubscribe(writer)
    close()
    local raw = h.read(path)
    local got = lines_of(raw)
    h.rmrf(dir)
    assert.are.equal(3, #got)
    for line in raw:gmatch("[^\n]+") do
      for _, k in ipairs(events.LOG_FIELDS) do
        assert.truthy(line:find('"' .. k .. '":', 1, true), k .. " missing: " .. line)
      end
    end
    assert.matches('"ip":null', raw:match("^[^\n]+"))           -- the DNS deny: no address
    assert.matches('"port":null', raw:match("^[^\n]+"))
    assert.are.equal(0, got[1].bytes)
    assert.are.equal("198.18.0.9", got[2].ip)                  -- control: present when known
    assert.are.equal(443, got[2].port)
    assert.are.equal(0, got[2].bytes)
    assert.are.equal("boom", got[3].reason)
  end)
end)

describe("egress log: the file", function()
  it("tightens an existing log's mode to the owner; a symbolic link is refused", function()
    local dir = h.tmpdir("mode")
    local path = dir .. "/log.jsonl"
    h.write(path, "")
    assert(core.fs.chmod(path, tonumber("644", 8)))
    h.must("ln -s log.jsonl " .. dir .. "/link")
    local w, err = events.json_lines_writer(dir .. "/link")
    assert.is_nil(w)
    assert.matches("symbolic link", err)
    local writer, close = assert(events.json_lines_writer(path)) -- control: the file itself
    writer({ sandbox = "m", kind = "error", verdict = "deny" })
    close()
    assert.are.equal(tonumber("600", 8), core.fs.lstat(path).mode)
    assert.matches('"kind":"error"', h.read(path))
    h.rmrf(dir)
  end)

  it("refuses a FIFO (without blocking), a device and another user's file; its own file after each", function()
    local dir = h.tmpdir("kinds")
    local path = dir .. "/log.jsonl"
    local function control(tag)
      local writer, close = assert(events.json_lines_writer(path))
      writer({ sandbox = tag, kind = "error", verdict = "deny" })
      close()
      assert.matches('"sandbox":"' .. tag .. '"', h.read(path), nil, true)
      assert.are.equal(tonumber("600", 8), core.fs.lstat(path).mode)
    end
    h.must("mkfifo " .. dir .. "/fifo")
    -- no reader: a blocking open would never return, and the test would hang here
    local w, err = events.json_lines_writer(dir .. "/fifo")
    assert.is_nil(w)
    assert.matches("FIFO", err)
    control("after-fifo")
    -- a FIFO that has a reader opens, and is refused on the fd it gave
    local reader = assert(io.popen("exec cat " .. dir .. "/fifo >/dev/null", "r"))
    assert.is_true(h.wait_for(function() -- once cat has it open
      w, err = events.json_lines_writer(dir .. "/fifo")
      return w or not err:find("no reader", 1, true)
    end, 3), err)
    assert.is_nil(w)
    assert.matches("a FIFO, not a regular file", err, nil, true)
    core.fs.open_private(dir .. "/fifo") -- never blocks; any writer's close ends cat
    reader:close()
    w, err = events.json_lines_writer("/dev/null")
    assert.is_nil(w)
    assert.matches("a character device, not a regular file", err, nil, true)
    control("after-device")
    if core.proc.geteuid() == 0 then
      local theirs = dir .. "/theirs.jsonl"
      h.write(theirs, "")
      assert(core.fs.chown(theirs, 65534, 65534))
      assert(core.fs.chmod(theirs, tonumber("644", 8)))
      w, err = events.json_lines_writer(theirs)
      assert.is_nil(w)
      assert.matches("owned by uid 65534", err, nil, true)
      assert.are.equal(tonumber("644", 8), core.fs.lstat(theirs).mode) -- not touched
      assert.are.equal("", h.read(theirs))
      control("after-theirs")
    end
    h.rmrf(dir)
  end)

end)

describe("egress log: the file under corral run #root #netns", function()
  it("writes - to standard output, never to a file named -; a missing directory is named", function()
    local dir = h.tmpdir("dash")
    local out = h.sh("cd " .. dir .. " && " .. h.quote(h.host) .. " run --allow api.test:443 --log-json - -- " ..
      "sh -c 'getent hosts nosuch.test; getent hosts api.test >/dev/null && echo resolved' 2>/dev/null")
    assert.is_nil(core.fs.lstat(dir .. "/-"), "a file named - was written")
    assert.matches('"name":"nosuch.test"', out, nil, true)
    assert.matches("resolved", out) -- control: the run itself went as asked
    local o2, st = h.corral("run", "--allow", "api.test:443", "--log-json", dir .. "/no/such/log.jsonl", "--", "true")
    assert.are.equal(2, st, o2)
    assert.matches("--log-json", o2, nil, true)
    assert.matches("the directory " .. dir .. "/no/such does not exist", o2, nil, true)
    local o3, st3 = h.corral("run", "--allow", "api.test:443", "--log-json", dir .. "/log.jsonl", "--", "true")
    assert.are.equal(0, st3, o3) -- control: an existing directory
    h.rmrf(dir)
  end)
end)

describe("egress log: names escaped once", function()
  local responder = require "corral.egress.responder"

  it("logs the codec's presentation form as it is, and escapes anything else once", function()
    local q = assert(core.dns.parse(query({ "api.rt2", "example", "com" })))
    assert.are.equal("api\\046rt2.example.com", q.name)                    -- the codec's form
    assert.are.equal("api\\046rt2.example.com", responder.printable(q.name))   -- kept, not \092046
    local sp = assert(core.dns.parse(query({ "a b\\c", "x" })))
    assert.are.equal("a\\032b\\092c.x", responder.printable(sp.name))
    assert.are.equal("pypi.org", responder.printable("pypi.org"))         -- control: a plain name
    -- text that is not the codec's: a bare backslash or a control byte is escaped, once
    assert.are.equal("a\\092b\\010", responder.printable("a\\b\n"))
    assert.are.equal("\\046x", responder.printable("\\046x"))
  end)
end)

describe("egress log: the responder's events #root #netns", function()
  local plane = require "corral.egress.plane"
  local loop = require "corral.egress.loop"
  local egress = require "corral.egress"
  local p, client
  local seen = {}
  local function collect(ev) if ev.sandbox == "log-dns" and ev.kind == "dns" then seen[#seen + 1] = ev end end

  setup(function()
    events.subscribe(collect)
    p = assert(plane.new("log-dns", { allow = { "pypi.org:443", "*.example.com:443" } }))
    loop.add(p)
    client = assert(core.listen.in_netns(p.netns, "udp", "127.0.0.1", 0))
  end)

  teardown(function()
    events.unsubscribe(collect)
    if client then client:close() end
    if p then
      loop.remove(p)
      p:close()
    end
  end)

  -- Sends one query over UDP inside the sandbox's netns and serves the loop until its
  -- answer arrives (nil after a second: dropped).
  local function ask(q)
    assert(core.udp.send(client, q, "127.0.0.1", 53))
    local deadline = core.clock.monotime() + 1
    while core.clock.monotime() < deadline do
      loop.step(0.02)
      if #(core.io.poll({ client }, 0) or {}) > 0 then return (core.udp.recv(client)) end
    end
  end

  local function rcode(reply) return reply and (string.unpack(">I2", reply, 3) & 0xf) end

  local function last_dns() return seen[#seen] end

  it("a denied name carries neither ip nor entry; an answered one its synthetic ip and entry", function()
    assert.are.equal(3, rcode(ask(query({ "evil", "test" }))))
    local ev = last_dns()
    assert.are.equal("deny", ev.verdict)
    assert.is_nil(ev.ip)
    assert.matches("not in the allowlist", ev.reason)
    -- a label with a dot in it: NXDOMAIN, logged with the one escape
    assert.are.equal(3, rcode(ask(query({ "api.rt2", "example", "com" }))))
    assert.are.equal("api\\046rt2.example.com", last_dns().name)
    -- control, after the denials, on the same responder
    local reply = ask(query({ "api", "example", "com" }))
    assert.are.equal(0, rcode(reply))
    ev = last_dns()
    local text = assert(egress.address("log-dns", "api.example.com"))
    assert.are.equal("allow", ev.verdict)
    assert.are.equal(text, ev.ip)
    assert.are.equal(core.inet.format(reply:sub(-4)), ev.ip) -- the address the tenant was given
    assert.is_nil(ev.port)
    assert.are.equal("allowed by *.example.com:443", ev.reason)
    assert.are.equal(0, ev.bytes)
  end)

  it("logs each malformed query as a deny with the rule it broke, and answers it as before", function()
    local good = query({ "pypi", "org" })
    local cases = {
      { query({ "pypi", "org" }, { qd = 2 }), 1, "QDCOUNT 2" },
      { query({}, { qd = 1 }):sub(1, 12) .. "\192\12" .. string.pack(">I2I2", 1, 1), 1, "compression pointer" },
      { good .. "junk", 1, "4 bytes after the question" },
      { query({ "pypi", "org" }, { ar = 2, tail = OPT .. OPT }), 1, "ARCOUNT 2" },
      { query({ "pypi", "org" }, { flags = 0x1100 }), 4, "opcode 2" },
    }
    for _, c in ipairs(cases) do
      local before = #seen
      local reply = ask(c[1])
      assert.are.equal(c[2], rcode(reply), c[3])
      assert.are.equal(before + 1, #seen, c[3]) -- one event per query
      local ev = last_dns()
      assert.are.equal("deny", ev.verdict, c[3])
      assert.are.equal(c[2] == 1 and "formerr" or "notimp", ev.answer, c[3])
      assert.matches(c[3], ev.reason, nil, true)
      assert.are.equal(0, ev.bytes)
    end
    -- a response (QR set) is dropped, as the codec's contract says, and still logged
    assert.is_nil(p.responder:answer(query({ "pypi", "org" }, { flags = 0x8100 })))
    assert.are.equal("dropped", last_dns().answer)
    assert.matches("QR set", last_dns().reason)
    -- control: the same question, well formed (one OPT record is fine), is answered
    local reply = ask(query({ "pypi", "org" }, { ar = 1, tail = OPT }))
    assert.are.equal(0, rcode(reply))
    assert.are.equal("allow", last_dns().verdict)
    assert.are.equal("allowed by pypi.org:443", last_dns().reason)
  end)
end)

describe("egress log: policy epochs #root #netns", function()
  local plane = require "corral.egress.plane"
  local ruleset = require "corral.egress.ruleset"
  local egress = require "corral.egress"
  local p
  local seen = {}
  local function collect(ev) if ev.sandbox == "epoch-sb" then seen[#seen + 1] = ev end end

  setup(function()
    events.subscribe(collect)
    p = assert(plane.new("epoch-sb", { allow = { "pypi.org:443" } }))
  end)

  teardown(function()
    events.unsubscribe(collect)
    if p then p:close() end
  end)

  local function asked(name)
    p.responder:answer(query({ name:match("^([^.]+)%.(.+)$") }))
    return seen[#seen]
  end

  it("every line carries the epoch; a change the ruleset cannot follow is refused and keeps the old", function()
    local ev = asked("pypi.org")
    assert.are.equal(1, ev.epoch)
    assert.is_table(egress.allow("epoch-sb", "example.com:443"))
    assert.are.equal(2, asked("example.com").epoch)
    assert.are.equal("allow", seen[#seen].verdict)
    -- the ruleset refuses the next change: the caller hears it, the log says it, nothing moved
    p.nft = setmetatable({ apply = function() return nil, "nft apply: injected failure" end },
      { __index = core.nft })
    local e, err = egress.allow("epoch-sb", "evil.test:8443")
    assert.is_nil(e)
    assert.is_true(errors.is(err, "cannot_enforce"), tostring(err))
    assert.matches("keeps the previous one.*injected failure", tostring(err))
    local logged
    for _, x in ipairs(seen) do if x.kind == "error" then logged = x end end
    assert.matches("could not follow the new policy", logged.reason)
    assert.are.equal(2, logged.epoch)
    assert.are.equal("deny", asked("evil.test").verdict) -- the entry was not added
    assert.are.equal(2, seen[#seen].epoch)
    assert.is_true(core.nft.verify(p.netns, ruleset.plan(p, { { 443, 443 } }))) -- the old ruleset, intact
    -- control: the same change with a ruleset that follows
    p.nft = core.nft
    assert.is_table(egress.allow("epoch-sb", "evil.test:8443"))
    local ok = asked("evil.test")
    assert.are.equal("allow", ok.verdict)
    assert.are.equal(3, ok.epoch)
    assert.is_true(core.nft.verify(p.netns, ruleset.plan(p, { { 443, 443 }, { 8443, 8443 } })))
  end)
end)
