-- core.dns: the responder's codec against the bytes dig really sends, and against dig
-- itself: a responder started here (socat hands each UDP datagram to a Lua process that
-- answers it with core.dns) serves real dig queries on loopback.
local core = require "corral.core"
local h = require "helpers"
local dns = core.dns

local function unhex(text)
  return (text:gsub("%s+", ""):gsub("..", function(b) return string.char(tonumber(b, 16)) end))
end

local function u16(s, i)
  return s:byte(i) << 8 | s:byte(i + 1)
end

-- Captured once from dig 9.18 (`dig @127.0.0.1 -p P pypi.org A +noedns` and
-- `... pypi.org AAAA`, which adds an OPT record with a client cookie).
local DIG_A = unhex("394e01200001000000000000 0470797069036f726700 0001 0001")
local DIG_AAAA_EDNS = unhex([[ef8701200001000000000001 0470797069036f726700 001c 0001
  00 0029 04d0 00000000 000c 000a 0008 b058c9bd1c37b957]])

describe("core.dns codec", function()
  it("parses dig's A query and answers it with the synthetic address", function()
    local q = assert(dns.parse(DIG_A))
    assert.same({ id = 0x394e, flags = 0x0120, qtype = dns.A, qclass = dns.IN, name = "pypi.org",
                  rd = true, hostname = true, edns = false }, q)
    local r = assert(dns.answer(DIG_A, dns.NOERROR, "\198\18\0\7", 60))
    assert.equal(#DIG_A + 16, #r)
    assert.equal(0x394e, u16(r, 1))
    assert.equal(0x8500, u16(r, 3)) -- QR AA RD, RA clear, NOERROR
    assert.equal(1, u16(r, 7))      -- ancount
    assert.equal(DIG_A:sub(13), r:sub(13, #DIG_A))
    assert.equal(unhex("c00c 0001 0001 0000003c 0004 c6120007"), r:sub(#DIG_A + 1))
  end)

  it("parses dig's AAAA query with EDNS and answers without echoing the OPT", function()
    local q = assert(dns.parse(DIG_AAAA_EDNS))
    assert.equal(dns.AAAA, q.qtype)
    assert.is_true(q.edns)
    -- the family must match the question: a v4 address for AAAA is refused
    local ok, err, errno = dns.answer(DIG_AAAA_EDNS, dns.NOERROR, "\198\18\0\7")
    assert.is_nil(ok)
    assert.matches("^dns answer:", err)
    assert.equal(core.errno.EINVAL, errno)
    -- control, after it: the same question with a v6 address is answered
    local v6 = unhex("fd00c044000000000000000000000007")
    local r = assert(dns.answer(DIG_AAAA_EDNS, dns.NOERROR, v6, 0))
    assert.equal(0, u16(r, 11)) -- arcount
    assert.equal(v6, r:sub(-16))
    -- NODATA: NOERROR with no address
    r = assert(dns.answer(DIG_AAAA_EDNS, dns.NOERROR))
    assert.equal(0, u16(r, 7))
    assert.equal(0, r:byte(4) & 0xf)
  end)

  it("maps each malformed shape to FORMERR, NOTIMP or drop", function()
    local good = DIG_A
    local function with(at, byte) return good:sub(1, at - 1) .. string.char(byte) .. good:sub(at + 1) end
    local cases = {
      { good:sub(1, 11), dns.EMSGSIZE, nil, "short", "11 bytes: shorter than a DNS header" },
      { with(3, 0x81), dns.EPROTO, nil, "response", "a response (QR set), not a query: not answered" },
      { with(3, 0x11), dns.EOPNOTSUPP, dns.NOTIMP, "opcode", "opcode 2: only QUERY (0) is answered" },
      { with(6, 0), dns.EBADMSG, dns.FORMERR, "qdcount", "QDCOUNT 0: exactly one question is answered" },
      { with(8, 1), dns.EBADMSG, dns.FORMERR, "records", "ANCOUNT 1, NSCOUNT 0: a query carries neither" },
      { with(13, 0xc0), dns.EBADMSG, dns.FORMERR, "pointer", "a compression pointer in the question's name" },
      { good:sub(1, -2), dns.EBADMSG, dns.FORMERR, "question_truncated",
        "the question is truncated (no QTYPE/QCLASS)" },
    }
    for i, c in ipairs(cases) do
      local q, err, errno, why, reason = dns.parse(c[1])
      assert.is_nil(q, "case " .. i)
      assert.matches("^dns parse: ", err)
      assert.equal(c[2], errno, "case " .. i)
      assert.equal(c[4], reason, "case " .. i) -- the rule it broke, named by the codec
      assert.equal(c[5], why, "case " .. i)
      assert.equal(c[3], dns.error_rcode(errno), "case " .. i)
      if c[3] then
        local r = assert(dns.answer(c[1], c[3]))
        assert.equal(12, #r)                -- header only
        assert.equal(0x394e, u16(r, 1))     -- the id answered to
        assert.equal(c[3], r:byte(4) & 0xf)
      else
        assert.is_nil(dns.answer(c[1], dns.FORMERR))
      end
    end
    assert.has_error(function() dns.answer(good, 16) end)
    assert.has_error(function() dns.answer(good, dns.NOERROR, "\1\2\3") end)
    assert.truthy(dns.parse(good)) -- control, after them: the same bytes, unmodified
    assert.truthy(dns.answer(good, dns.NOERROR, "\198\18\0\7"))
  end)
end)

describe("core.dns with real dig", function()
  local tmp, proc, pid, port
  local cwd = assert(core.path.resolve("."))

  -- One process per datagram (socat ...,fork): read the query, decide as the real
  -- responder will (allowlist of one name), write the answer or nothing (drop).
  local RESPONDER = [[
package.cpath = CWD .. "/?.so;" .. package.cpath
local dns = require("corral.core").dns
local msg = io.read("a")
local log = assert(io.open(LOG, "a"))
local q, _, errno = dns.parse(msg)
local r
if q then
  log:write(string.format("ok %d %s %s\n", q.qtype, q.name, q.edns))
  if not (q.hostname and q.name == "pypi.org") then
    r = dns.answer(msg, dns.NXDOMAIN)
  elseif q.qtype == dns.A then
    r = dns.answer(msg, dns.NOERROR, "\198\18\0\7", 60)
  elseif q.qtype == dns.AAAA then
    r = dns.answer(msg, dns.NOERROR, "\253" .. string.rep("\0", 14) .. "\7", 60)
  else
    r = dns.answer(msg, dns.REFUSED)
  end
else
  log:write(string.format("err %d\n", errno))
  local rcode = dns.error_rcode(errno)
  if rcode then r = dns.answer(msg, rcode) end
end
log:close()
if r then io.write(r) io.flush() end
]]

  setup(function()
    tmp = h.tmpdir("dns")
    local script = tmp .. "/responder.lua"
    h.write(script, string.format("local CWD, LOG = %q, %q\n", cwd, tmp .. "/log") .. RESPONDER)
    -- the host under `make asan`, else the stock interpreter loading ./corral/core.so
    local lua = os.getenv("CORRAL_HOST")
    if not (lua and os.execute("test -x " .. h.quote(lua))) then lua = "lua5.4" end
    local exec = "EXEC:" .. h.quote(lua .. " " .. script)
    for _ = 1, 10 do
      port = h.free_port()
      -- h.child keeps socat our child (its shell execs it), so that teardown reaps it
      proc, pid = h.child(string.format("exec socat UDP4-RECVFROM:%d,bind=127.0.0.1,fork %s 2>%s",
        port, exec, h.quote(tmp .. "/socat.log")))
      local listening = h.wait_for(function()
        if h.sh("ss -Hnul " .. h.quote("sport = :" .. port)):match("127%.0%.0%.1:" .. port) then return true end
        return not os.execute("kill -0 " .. pid .. " 2>/dev/null") -- socat gone: the port was taken
      end, 2) and os.execute("kill -0 " .. pid .. " 2>/dev/null")
      if listening then return end
      os.execute("kill " .. pid .. " 2>/dev/null")
      proc:close()
      pid, proc = nil, nil
    end
    error("could not start socat on a loopback port")
  end)

  teardown(function()
    if pid then
      os.execute("kill " .. pid .. " 2>/dev/null")
      proc:close()
    end
    h.rmrf(tmp)
  end)

  local function dig(args)
    local out = h.capture({ "dig", "@127.0.0.1", "-p", tostring(port), "+tries=1", "+time=2",
      table.unpack(args) })
    local status = out:match("status: (%u+)")
    local answers = {}
    local section = out:match(";; ANSWER SECTION:\n(.-)\n\n") or ""
    for line in section:gmatch("[^\n]+") do
      answers[#answers + 1] = line:gsub("%s+", " ")
    end
    return status, answers, out
  end

  it("answers NXDOMAIN for others, REFUSED for TXT and ANY, then allowed names", function()
    local status, answers, out = dig({ "evil.example", "A" })
    assert.equal("NXDOMAIN", status, out)
    assert.same({}, answers)

    status, answers, out = dig({ "pypi.org", "TXT" })
    assert.equal("REFUSED", status, out)
    assert.same({}, answers)
    status, answers, out = dig({ "pypi.org", "ANY", "+notcp" })
    assert.equal("REFUSED", status, out)
    assert.same({}, answers)

    -- no question at all: FORMERR; opcode STATUS: NOTIMP (the same dig, the same server)
    status, answers, out = dig({ "+header-only" })
    assert.equal("FORMERR", status, out)
    assert.same({}, answers)
    status, answers, out = dig({ "+opcode=status", "pypi.org" })
    assert.equal("NOTIMP", status, out)
    assert.same({}, answers)

    -- controls, after the refusals: the same server answers the allowed name
    status, answers, out = dig({ "pypi.org", "A", "+noedns" })
    assert.equal("NOERROR", status, out)
    assert.same({ "pypi.org. 60 IN A 198.18.0.7" }, answers)
    assert.matches("flags: qr aa rd;", out)

    status, answers, out = dig({ "pypi.org", "AAAA" })
    assert.equal("NOERROR", status, out)
    assert.same({ "pypi.org. 60 IN AAAA fd00::7" }, answers)

    -- case is echoed as sent (dig compares the question), matched lowercased
    status, answers, out = dig({ "PyPI.Org", "A" })
    assert.equal("NOERROR", status, out)
    assert.same({ "PyPI.Org. 60 IN A 198.18.0.7" }, answers)

    local log = assert(io.open(tmp .. "/log")):read("a")
    assert.equal(table.concat({
      "ok 1 evil.example true", "ok 16 pypi.org true", "ok 255 pypi.org true",
      "err " .. dns.EBADMSG, "err " .. dns.EOPNOTSUPP,
      "ok 1 pypi.org false", "ok 28 pypi.org true", "ok 1 pypi.org true", "" }, "\n"), log)
  end)
end)
