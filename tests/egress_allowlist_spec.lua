-- corral.egress.allowlist and corral.egress.ranges, and the core.inet binding under
-- them. Every refusal is checked next to a control that the same code accepts.
-- Documentation addresses (192.0.2.0/24, 198.51.100.0/24, 2001:db8::/32) stand in for
-- public ones throughout: ranges.lua treats them as ordinary addresses (see its header).
local core = require "corral.core"
local errors = require "corral.errors"
local allowlist = require "corral.egress.allowlist"
local grammar = require "corral.egress.grammar"
local address = require "corral.egress.address"
local ranges = require "corral.egress.ranges"
local decision = require "corral.egress.decision"
local synthetic = require "corral.egress.synthetic"

local inet = core.inet

local function bytes(text)
  local _, b = inet.parse(text)
  return assert(b, text)
end

describe("core.inet", function()
  it("parses IPv4, IPv6 and bracketed IPv6 to network-order bytes", function()
    local fam, b = inet.parse("192.0.2.1")
    assert.are.equal("inet", fam)
    assert.are.equal("\192\0\2\1", b)
    fam, b = inet.parse("2001:db8::1")
    assert.are.equal("inet6", fam)
    assert.are.equal("\32\1\13\184" .. ("\0"):rep(11) .. "\1", b)
    assert.are.equal(b, select(2, inet.parse("[2001:DB8::1]")))
  end)

  it("reports an IPv4-mapped address with its IPv4 bytes as a third value", function()
    local fam, b, v4 = inet.parse("::ffff:169.254.169.254")
    assert.are.equal("inet6", fam)
    assert.are.equal(16, #b)
    assert.are.equal("\169\254\169\254", v4)
    assert.are.equal(v4, inet.unmap(b))
    -- control: an ordinary IPv6 address has no third value
    fam, b, v4 = inet.parse("2001:db8::a9fe:a9fe")
    assert.are.equal("inet6", fam)
    assert.is_nil(v4)
    assert.is_nil(inet.unmap(b))
  end)

  it("refuses what inet_aton or a port/zone would smuggle in, and accepts the canonical form", function()
    for _, s in ipairs({ "1.2.3", "010.0.0.1", "0x7f000001", "[1.2.3.4]", "fe80::1%eth0", "10.0.0.0/8",
                         "[2001:db8::1]:443", "pypi.org", "", "1.2.3.4\0" }) do
      local fam, msg, errno = inet.parse(s)
      assert.is_nil(fam, s)
      assert.matches("^inet parse: ", msg)
      assert.are.equal(core.errno.EINVAL, errno)
    end
    assert.are.equal("inet", (inet.parse("10.0.0.1")))
    assert.are.equal("inet6", (inet.parse("[fe80::1]")))
  end)

  it("formats, tests containment and masks", function()
    assert.are.equal("2001:db8::1", inet.format(bytes("2001:0db8:0::1")))
    assert.are.equal("::ffff:10.0.0.1", inet.format(bytes("::ffff:10.0.0.1")))
    assert.is_true(inet.in_cidr(bytes("172.31.0.1"), bytes("172.16.0.0"), 12))
    assert.is_false(inet.in_cidr(bytes("172.32.0.1"), bytes("172.16.0.0"), 12))
    assert.is_false(inet.in_cidr(bytes("::ffff:10.0.0.1"), bytes("10.0.0.0"), 8)) -- no silent unmapping
    assert.are.equal(bytes("10.20.0.0"), inet.mask(bytes("10.20.3.4"), 16))
  end)

  it("raises on a wrong-length address or a prefix out of range", function()
    assert.has_error(function() inet.format("abc") end)
    assert.has_error(function() inet.in_cidr(bytes("10.0.0.1"), bytes("10.0.0.0"), 33) end)
    assert.has_no.errors(function() inet.in_cidr(bytes("10.0.0.1"), bytes("10.0.0.0"), 32) end)
    assert.are.equal("10.0.0.1", inet.format("\10\0\0\1"))
  end)
end)

describe("allowlist addresses: text and packed, never confused", function()
  it("reads text as text whatever its length, and packed bytes only when asked to", function()
    assert.are.equal("\192\0\2\1", address.parse_address("192.0.2.1"))
    assert.are.equal("\192\0\2\1", address.parse_address("::ffff:192.0.2.1"))
    assert.are.equal("\192\0\2\1", address.packed_address("\192\0\2\1"))
    assert.are.equal("\192\0\2\1", address.packed_address(("\0"):rep(10) .. "\255\255\192\0\2\1"))
    assert.are.equal("2001:db8::1", address.packed_text(select(2, inet.parse("2001:db8::1"))))
    -- host names of 4 and 16 characters are not addresses (they read as 104.111.115.116
    -- and 6170:692e:… when any 4- or 16-byte string was taken for bytes)
    for _, name in ipairs({ "host", "api.example.test", "\192\0\2\1", ("\0"):rep(16) }) do
      local none, why = address.parse_address(name)
      assert.is_nil(none, name)
      assert.matches("not an IP address", why)
      assert.is_nil(address.address_text(name))
    end
    -- a 4-character IPv6 text is IPv6, bare or bracketed (not 49.58.58.49)
    assert.are.equal("1::1", address.address_text("1::1"))
    assert.are.equal("1::1", address.address_text("[1::1]"))
    local t = "2001:db8::1:2:3a"
    assert.are.equal(16, #t)
    assert.are.equal("2001:db8::1:2:3a", address.address_text(t))
    -- packed: exactly 4 or 16 bytes
    assert.is_nil(address.packed_address("\1\2\3"))
    assert.is_nil(address.packed_text("192.0.2.1"))
    assert.is_nil(allowlist.address) -- one reader for both was the confusion: gone
  end)

  it("matches and checks a name-shaped string as no address at all (attempt, then control)", function()
    local al = assert(allowlist.parse({ "104.111.115.116:443", "[6170:692e:6578:616d:706c:652e:7465:7374]:443",
      "49.58.58.49:443" }))
    assert.is_nil(al:match({ ip = "host", port = 443 }))
    assert.is_nil(al:match({ ip = "api.example.test", port = 443 }))
    assert.is_nil(al:match({ ip = "1::1", port = 443 }))
    assert.truthy(al:match({ ip = "104.111.115.116", port = 443 })) -- control
    assert.is_nil(ranges.check("host"))
    assert.is_nil(ranges.classify("host"))
    assert.is_true(ranges.check("104.111.115.116")) -- control
    assert.is_false(synthetic.is_synthetic("\198\18\0\7"))
    assert.is_true(synthetic.is_synthetic("198.18.0.7")) -- control
    local v = decision.decide({ sandbox = "s", ip = "host", port = 443 }, { allowlist = al })
    assert.are.equal("deny", v.verdict)
    assert.matches('not an IP address: "host"', v.reason)
    v = decision.decide({ sandbox = "s", ip = "104.111.115.116", port = 443 }, { allowlist = al }, { host = {} })
    assert.are.equal("allow", v.verdict) -- control
  end)
end)

-- {entry, canonical text, kind}
local ACCEPTED = {
  { "pypi.org", "pypi.org", "name" },
  { "api.example.com", "api.example.com", "name" },
  { "PyPI.Org.", "pypi.org", "name" },
  { "xn--bcher-kva.example", "xn--bcher-kva.example", "name" },
  { "a-b.example.com:443", "a-b.example.com:443", "name" },
  { "*.example.com", "*.example.com", "wildcard" },
  { "*.co.uk:443", "*.co.uk:443", "wildcard" },
  { "api.example.com:8000-8100", "api.example.com:8000-8100", "name" },
  { "api.example.com:443,80", "api.example.com:80,443", "name" },
  { "api.example.com:80,443,8000-8100,81", "api.example.com:80-81,443,8000-8100", "name" },
  { "api.example.com:1,65535", "api.example.com:1,65535", "name" },
  { "10.1.2.3", "10.1.2.3", "address" },
  { "10.1.2.3:22", "10.1.2.3:22", "address" },
  { "10.20.0.0/16", "10.20.0.0/16", "network" },
  { "10.20.0.0/16:443", "10.20.0.0/16:443", "network" },
  { "0.0.0.0/0", "0.0.0.0/0", "network" },
  { "[2001:db8::1]", "[2001:db8::1]", "address" },
  { "[2001:DB8:0::1]:22", "[2001:db8::1]:22", "address" },
  { "[2001:db8::]/32", "[2001:db8::]/32", "network" },
  { "[2001:db8::]/32:443", "[2001:db8::]/32:443", "network" },
  { "[::ffff:192.0.2.1]:80", "192.0.2.1:80", "address" },
  { "[::ffff:10.0.0.0]/104", "10.0.0.0/8", "network" },
  { ("a"):rep(63) .. ".example", ("a"):rep(63) .. ".example", "name" },
  -- URL forms: the scheme gives the port when the URL has none; "/" is no path
  { "https://api.test", "api.test:443", "name" },
  { "http://api.test:8080/", "api.test:8080", "name" },
  { "HTTP://API.test", "api.test:80", "name" },
  { "wss://*.example.com/", "*.example.com:443", "wildcard" },
  { "https://[2001:db8::1]", "[2001:db8::1]:443", "address" },
  { "ssh://10.1.2.3", "10.1.2.3:22", "address" },
  -- a network that holds loopback among much else is not the loopback itself
  { "126.0.0.0/7", "126.0.0.0/7", "network" },
}

-- {bad entry, reason fragment, control entry that differs only in the fault}
local REFUSED = {
  { "", "empty entry", "a.example" },
  { "pypi.org ", "whitespace", "pypi.org" },
  { "pypi\0.org", "NUL", "pypi.org" },
  { "*.com", "single label", "*.example.com" },
  { "dns.example.com:53", "sandbox's own DNS responder", "dns.example.com:53,853" },
  { "10.0.0.0/8:53", "sandbox's own DNS responder", "10.0.0.0/8:5353" },
  { "*.", "needs a domain", "*.example.com" },
  { "*", "needs a domain", "*.example.com" },
  { "*example.com", "whole first label", "*.example.com" },
  { "foo.*.example.com", "whole first label", "*.example.com" },
  { "**.example.com", "whole first label", "*.example.com" },
  { "b\195\188cher.example", "xn%-%-", "xn--bcher-kva.example" },
  { "_dmarc.example.com", "underscore", "dmarc.example.com" },
  { "my_host.example.com", "underscore", "my-host.example.com" },
  { "-a.example.com", "starts or ends with '-'", "a.example.com" },
  { "a-.example.com", "starts or ends with '-'", "a.example.com" },
  { "a..example.com", "empty label", "a.example.com" },
  { ".example.com", "empty label", "example.com" },
  { "example.com..", "empty label", "example.com." },
  { ("a"):rep(64) .. ".example", "longer than 63", ("a"):rep(63) .. ".example" },
  { ("abcdefghi."):rep(25) .. "example", "longer than 253", ("abcdefghi."):rep(24) .. "example" },
  { "exa!mple.com", "not allowed in a hostname", "example.com" },
  { "1.2.3", "not a valid IPv4", "1.2.3.4" },
  { "256.1.1.1", "not a valid IPv4", "203.1.1.1" },
  { "010.0.0.1", "not a valid IPv4", "10.0.0.1" },
  { "0x7f000001", "numeric", "0x7f000001.example" },
  { "example.123", "numeric", "example.a123" },
  { "api.example.com:0", "out of range 1%-65535", "api.example.com:1" },
  { "api.example.com:65536", "out of range 1%-65535", "api.example.com:65535" },
  { "api.example.com:8100-8000", "reversed", "api.example.com:8000-8100" },
  { "api.example.com:", "empty port list", "api.example.com" },
  { "api.example.com:80,", "empty item", "api.example.com:80" },
  { "api.example.com:http", "bad port", "api.example.com:80" },
  { "api.example.com:-80", "bad port", "api.example.com:80" },
  { ":443", "no destination", "a.example:443" },
  { "10.20.1.0/16", "host bits set after /16: the network is 10.20.0.0/16", "10.20.0.0/16" },
  { "10.0.0.0/33", "longer than the 32 bits", "10.0.0.0/32" },
  { "10.0.0.0/x", "bad prefix length", "10.0.0.0/8" },
  { "[2001:db8::1]/32", "host bits set after /32: the network is %[2001:db8::%]/32", "[2001:db8::]/32" },
  { "[2001:db8::]/129", "longer than the 128 bits", "[2001:db8::]/128" },
  { "2001:db8::1", "in brackets: %[2001:db8::1%]", "[2001:db8::1]" },
  { "2001:db8::1:443", "in brackets", "[2001:db8::1]:443" },
  { "2001:db8::/32", "%[2001:db8::%]/32", "[2001:db8::]/32" },
  { "[2001:db8::/32]", "after the bracket: %[2001:db8::%]/32", "[2001:db8::]/32" },
  { "[2001:db8::1", "without ']'", "[2001:db8::1]" },
  { "[2001:db8::1]443", "after the address", "[2001:db8::1]:443" },
  { "[1.2.3.4]", "brackets are for IPv6", "1.2.3.4" },
  { "[fe80::1%eth0]", "not a valid IP", "[fe80::1]" },
  { "127.0.0.1:8080", "sandbox's own loopback", "10.0.0.1:8080" },
  { "127.0.0.0/8", "sandbox's own loopback", "10.0.0.0/8" },
  { "127.1.0.0/16:22", "sandbox's own loopback", "10.1.0.0/16:22" },
  { "[::1]:8080", "sandbox's own loopback", "[2001:db8::2]:8080" },
  { "[::ffff:127.0.0.1]", "sandbox's own loopback", "[::ffff:10.0.0.1]" },
  { "localhost:8080", "localhost is the sandbox's own loopback", "localhost.example:8080" },
  -- addresses no connection reaches: refused as the loopback is; a network holding them is
  -- still an entry (its other addresses are reachable)
  { "224.0.0.1:80", "multicast %(224%.0%.0%.0/4%) is never a destination", "192.0.2.1:80" },
  { "[ff02::1]:80", "multicast %(ff00::/8%) is never a destination", "[2001:db8::1]:80" },
  { "255.255.255.255:80", "broadcast .* never a destination", "192.0.2.255:80" },
  { "0.0.0.0:80", "never a destination", "0.0.0.0/0:80" },
  { "[::]:80", "unspecified address .* never a destination", "[::]/0:80" },
  { "198.18.95.150:443", "synthetic range .* allow the name the sandbox's DNS gave", "198.51.100.7:443" },
  { "[64:ff9b:1::c612:5f96]:443", "synthetic range .* allow the name", "[2001:db8::7]:443" },
  { "garbage", "single%-label name .* garbage%.example%.com", "garbage.example" },
  { "db:5432", "single%-label", "db.internal:5432" },
  { "https://api.test/simple/", 'the path "/simple/" cannot be enforced.*write api%.test', "https://api.test/" },
  { "https://api.test?x=1", "cannot be enforced", "https://api.test" },
  { "https://user@api.test", "user information", "https://api.test" },
  { "gopher://api.test", 'unknown scheme "gopher".*https', "http://api.test" },
  { "https://", "no host", "https://a.test" },
  { "https://garbage", "single%-label", "https://garbage.test" },
  { "http://127.0.0.1:8080/", "sandbox's own loopback", "http://10.0.0.1:8080/" },
}

describe("allowlist grammar", function()
  it("accepts every form and normalises it", function()
    for _, c in ipairs(ACCEPTED) do
      local e, err = grammar.parse_entry(c[1])
      assert.is_nil(err, c[1])
      assert.are.equal(c[2], e.text, c[1])
      assert.are.equal(c[3], e.kind, c[1])
      -- the canonical text parses back to itself
      assert.are.equal(c[2], grammar.parse_entry(c[2]).text)
    end
  end)

  it("refuses each bad form naming the entry and the reason, and accepts its control", function()
    for _, c in ipairs(REFUSED) do
      local bad, good = c[1], c[3]
      local e, err = grammar.parse_entry(bad)
      assert.is_nil(e, bad)
      assert.is_true(errors.is(err, "invalid_argument"), bad)
      assert.are.equal("network.allow", err.argument)
      local quoted = '"' .. bad .. '": '
      assert.are.equal(quoted, err.detail:sub(1, #quoted), bad)
      assert.matches(c[2], err.detail, nil, false, bad)
      assert.matches("network.allow", tostring(err))
      local ok, gerr = grammar.parse_entry(good)
      assert.is_nil(gerr, good)
      assert.is_table(ok)
    end
  end)

  it("survives the mutation fuzzer's invariants (tests/fuzz/fuzz_allowlist.lua), seeded", function()
    local fuzz = dofile("tests/fuzz/fuzz_allowlist.lua")
    local n, accepted = fuzz.run({ count = 20000, seed = 11 })
    assert.are.equal(20000, n)
    assert.is_true(accepted > 1000 and accepted < n, tostring(accepted)) -- both sides were reached
    -- control: the checker catches a parser that breaks an invariant (a canonical text
    -- that does not parse back)
    local real = grammar.parse_entry
    grammar.parse_entry = function(e)
      if e == "bad.test" then return { text = "not canonical", kind = "name" } end
      return real(e)
    end
    local ok, err = pcall(fuzz.check, "bad.test")
    grammar.parse_entry = real
    assert.is_false(ok)
    assert.matches("does not parse back", err)
  end)

  it("refuses a non-string entry", function()
    local e, err = grammar.parse_entry(443)
    assert.is_nil(e)
    assert.matches('"443": an entry must be a string', err.detail)
    assert.is_table(grammar.parse_entry("443.example"))
  end)

  it("parse() names the first bad entry of a list", function()
    local al, err = allowlist.parse({ "pypi.org:443", "*.com", "example.com:0" })
    assert.is_nil(al)
    assert.matches('^"%*%.com": ', err.detail)
    al = assert(allowlist.parse({ "pypi.org:443", "*.example.com", "example.com:1" }))
    assert.are.equal(3, #al)
    assert.same({ "pypi.org:443", "*.example.com", "example.com:1" }, al:texts())
    local nl, nerr = allowlist.parse("pypi.org")
    assert.is_nil(nl)
    assert.matches("must be a list", nerr.detail)
  end)
end)

describe("allowlist matching", function()
  local al = assert(allowlist.parse({
    "example.com:443",
    "*.example.com:80,443",
    "pypi.org",
    "192.0.2.10:22",
    "198.51.100.0/24:8000-8100",
    "[2001:db8::1]:443",
    "[2001:db8:100::]/40",
  }))

  -- {query, expected entry text or false}
  local CASES = {
    { { name = "example.com", port = 443 }, "example.com:443" }, -- control
    { { name = "example.com", port = 80 }, false },              -- same name, other port
    { { name = "EXAMPLE.com.", port = 443 }, "example.com:443" }, -- normalised
    { { name = "not-allowed.test", port = 443 }, false },
    { { name = "example.com.evil.test", port = 443 }, false },
    { { name = "evilexample.com", port = 443 }, false },
    { { name = "evilexample.com", port = 80 }, false },
    { { name = "a.example.com", port = 80 }, "*.example.com:80,443" },
    { { name = "a.b.c.example.com", port = 443 }, "*.example.com:80,443" },
    { { name = "a.example.com", port = 22 }, false },
    { { name = "example.com", port = 80 }, false },  -- the apex under *.example.com:80
    { { name = "pypi.org", port = 1 }, "pypi.org" },
    { { name = "pypi.org", port = 65535 }, "pypi.org" },
    { { name = "files.pypi.org", port = 443 }, false }, -- an exact name grants no subdomain
    { { ip = "192.0.2.10", port = 22 }, "192.0.2.10:22" },
    { { ip = "192.0.2.11", port = 22 }, false },
    { { ip = "192.0.2.10", port = 23 }, false },
    { { ip = "\192\0\2\10", port = 22 }, false }, -- bytes are not text
    { { ip = "::ffff:192.0.2.10", port = 22 }, "192.0.2.10:22" }, -- v4-mapped as IPv4
    { { ip = "\0\0\0\0\0\0\0\0\0\0\255\255\192\0\2\10", port = 22 }, false },
    { { ip = "198.51.100.77", port = 8050 }, "198.51.100.0/24:8000-8100" },
    { { ip = "198.51.101.77", port = 8050 }, false },
    { { ip = "198.51.100.77", port = 8101 }, false },
    { { ip = "2001:db8::1", port = 443 }, "[2001:db8::1]:443" },
    { { ip = "[2001:db8::1]", port = 443 }, "[2001:db8::1]:443" },
    { { ip = "2001:db8::2", port = 443 }, false },
    { { ip = "2001:db8:1ff:ffff::9", port = 1 }, "[2001:db8:100::]/40" },
    { { ip = "2001:db8:200::9", port = 1 }, false },
    { { ip = "pypi.org", port = 443 }, false }, -- a name is not an IP
    { { name = "192.0.2.10", port = 22 }, false }, -- nor an IP a name
    { { name = "example.com", port = "443" }, false }, -- a port is an integer
  }

  it("matches exactly the destinations the entries name", function()
    for i, c in ipairs(CASES) do
      local q, want = c[1], c[2]
      local got = al:match(q)
      local label = string.format("case %d: %s port %s", i, tostring(q.name or q.ip), tostring(q.port))
      if want then
        assert.is_table(got, label)
        assert.are.equal(want, got.text, label)
      else
        assert.is_nil(got, label)
      end
      -- the index and the per-entry rule agree
      local linear
      for _, e in ipairs(al:entries()) do
        if allowlist.matches(e, q) then linear = linear or e end
      end
      assert.are.equal(got ~= nil, linear ~= nil, label)
    end
  end)

  it("answers the DNS question (any port) for names only", function()
    assert.are.equal("example.com:443", allowlist.match_name(al, "example.com").text)
    assert.are.equal("*.example.com:80,443", allowlist.match_name(al, "x.example.com").text)
    assert.is_nil(allowlist.match_name(al, "evilexample.com"))
    assert.is_nil(allowlist.match_name(al, "192.0.2.10"))
  end)

  it("add and remove work on canonical equality", function()
    local l = allowlist.new()
    assert.is_nil(l:match({ name = "pypi.org", port = 443 }))
    assert.is_table(l:add("PyPI.org.:443,80"))
    assert.is_table(l:match({ name = "pypi.org", port = 443 }))
    l:add("pypi.org:80,443") -- equal: not added twice
    assert.are.equal(1, #l)
    assert.are.equal(1, l:remove("pypi.org:443,80"))
    assert.is_nil(l:match({ name = "pypi.org", port = 443 }))
    assert.are.equal(0, l:remove("pypi.org:443,80"))
    local n, err = l:remove("*.com")
    assert.is_nil(n)
    assert.matches('"%*%.com"', err.detail)
  end)
end)

describe("allowlist protocols", function()
  it("reads udp: entries with the same grammar, and tcp: as the default it is", function()
    for _, c in ipairs({
      { "udp:ntp.example.com:123", "udp:ntp.example.com:123", "name" },
      { "UDP:API.example.com.:443", "udp:api.example.com:443", "name" },
      { "udp:*.example.com:443,80", "udp:*.example.com:80,443", "wildcard" },
      { "udp:192.0.2.0/24:5000-5010", "udp:192.0.2.0/24:5000-5010", "network" },
      { "udp:[2001:db8::1]:443", "udp:[2001:db8::1]:443", "address" },
      { "tcp:api.example.com:443", "api.example.com:443", "name" },
      { "tcp:https://api.example.com", "api.example.com:443", "name" },
    }) do
      local e, err = grammar.parse_entry(c[1])
      assert.is_nil(err, c[1])
      assert.are.equal(c[2], e.text, c[1])
      assert.are.equal(c[3], e.kind, c[1])
      assert.are.equal(c[2]:sub(1, 4) == "udp:" and "udp" or "tcp", e.proto, c[1])
      assert.are.equal(e.text, grammar.parse_entry(e.text).text, c[1]) -- parses back to itself
    end
  end)

  it("refuses a UDP entry without ports, for DNS, as a URL or twice prefixed, naming why", function()
    for _, c in ipairs({
      { "udp:ntp.example.com", "a UDP entry names its ports %(udp:ntp%.example%.com:123" },
      { "udp:192.0.2.0/24", "UDP to every port of a destination is never granted" },
      { "udp:ntp.example.com:53", "DNS stays the sandbox's own" },
      { "udp:10.0.0.1:53", "port 53 %(TCP and UDP%) always reaches the sandbox's own DNS responder" },
      { "udp:https://api.example.com", "a URL names a TCP service; write udp:HOST:PORT" },
      { "udp://api.example.com:443", "udp:// is not a URL corral reads" },
      { "udp:tcp:api.example.com:443", "more than one protocol prefix" },
      { "udp:127.0.0.1:123", "the sandbox's own loopback" },
      { "udp:", "empty entry" },
    }) do
      local e, err = grammar.parse_entry(c[1])
      assert.is_nil(e, c[1])
      assert.are.equal('"' .. c[1] .. '": ', err.detail:sub(1, #c[1] + 4), c[1])
      assert.matches(c[2], err.detail, nil, false, c[1])
    end
    -- control: the same destinations with ports, and a range that covers 53 among others
    for _, good in ipairs({ "udp:ntp.example.com:123", "udp:192.0.2.0/24:1-100", "udp:api.example.com:443" }) do
      assert.is_table(grammar.parse_entry(good), good)
    end
  end)

  it("grants each protocol only its own entries; DNS (any protocol) sees both", function()
    local al = assert(allowlist.parse({ "api.example.com:443", "udp:ntp.example.com:123", "udp:api.example.com:8443",
      "udp:192.0.2.0/24:5000" }))
    local function text(q) local e = al:match(q) return e and e.text or false end
    assert.are.equal("api.example.com:443", text({ name = "api.example.com", port = 443, proto = "tcp" }))
    assert.is_false(text({ name = "api.example.com", port = 443, proto = "udp" }))
    assert.are.equal("udp:api.example.com:8443", text({ name = "api.example.com", port = 8443, proto = "udp" }))
    assert.is_false(text({ name = "api.example.com", port = 8443, proto = "tcp" }))
    assert.are.equal("udp:ntp.example.com:123", text({ name = "ntp.example.com", port = 123, proto = "udp" }))
    assert.is_false(text({ name = "ntp.example.com", port = 123, proto = "tcp" }))
    assert.are.equal("udp:192.0.2.0/24:5000", text({ ip = "192.0.2.7", port = 5000, proto = "udp" }))
    assert.is_false(text({ ip = "192.0.2.7", port = 5000, proto = "tcp" }))
    -- the DNS question: a name only a udp: entry names is still answered
    assert.are.equal("udp:ntp.example.com:123", allowlist.match_name(al, "ntp.example.com").text)
    for _, e in ipairs(al:entries()) do
      for _, q in ipairs({ { name = "ntp.example.com", port = 123, proto = "tcp" },
                           { name = "api.example.com", port = 443, proto = "udp" } }) do
        assert.is_false(allowlist.matches(e, q), e.text)
      end
    end
  end)
end)

describe("special ranges", function()
  it("refuses loopback, private and link-local results; an internal entry unlocks its range", function()
    for _, ip in ipairs({ "127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1",
                          "100.64.0.1", "169.254.1.1", "fe80::1", "fd12:3456::1", "fc00::1" }) do
      local ok, why = ranges.check(ip)
      assert.is_nil(ok, ip)
      assert.matches("network.internal", why)
    end
    assert.is_true(ranges.check("192.0.2.1")) -- control: TEST-NET-1, no service behind it
    assert.is_true(ranges.check("2001:db8::1"))
    assert.is_true(ranges.check("198.51.100.7"))
  end)

  it("10.x is refused unless network.internal lists its range", function()
    local ok, why = ranges.check("10.1.2.3", { "192.168.0.0/16" })
    assert.is_nil(ok)
    assert.matches("10%.1%.2%.3 is private %(RFC 1918%) %(10%.0%.0%.0/8%)", why)
    assert.is_true(ranges.check("10.1.2.3", { "10.1.0.0/16" }))
    assert.is_true(ranges.check("10.1.2.3", { "10.0.0.0/8" }))
    assert.is_true(ranges.check("::ffff:10.1.2.3", { "10.1.0.0/16" }))
    assert.is_true(ranges.check("fd12::1", { "[fd12::]/16" }))
    assert.is_true(ranges.check("fd12::1", { "fd12::/16" }))
  end)

  it("an internal entry broader than the special range unlocks nothing", function()
    local ok, why = ranges.check("10.1.2.3", { "0.0.0.0/0" })
    assert.is_nil(ok)
    assert.matches("0%.0%.0%.0/0 is broader than 10%.0%.0%.0/8", why)
    assert.is_nil(ranges.check("::1", { "::/0" }))
    assert.is_true(ranges.check("::1", { "::1" })) -- control
  end)

  it("refuses the metadata address, its IPv4-mapped and NAT64 forms, even under link-local", function()
    for _, ip in ipairs({ "169.254.169.254", "::ffff:169.254.169.254", "::ffff:a9fe:a9fe",
                          "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "fd00:ec2::254", "100.100.100.200" }) do
      local ok, why = ranges.check(ip, { "169.254.0.0/16", "fd00::/8", "100.64.0.0/10" })
      assert.is_nil(ok, ip)
      assert.matches("metadata", why)
    end
    local _, why = ranges.check("::ffff:169.254.169.254")
    assert.matches("^::ffff:169%.254%.169%.254 is IPv4%-mapped", why)
    -- control: listed on its own, the metadata address is allowed; a public address
    -- behind NAT64 and a mapped public address are ordinary
    assert.is_true(ranges.check("::ffff:169.254.169.254", { "169.254.169.254" }))
    assert.is_true(ranges.check("fd00:ec2::254", { "fd00:ec2::254/128" }))
    assert.is_true(ranges.check("64:ff9b::c000:201"))
    assert.is_true(ranges.check("::ffff:192.0.2.1"))
  end)

  it("never unlocks the fixed ranges, corral's synthetic ones included", function()
    local all = { "0.0.0.0/8", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255",
                  "::/128", "::/96", "[64:ff9b:1::]/48", "ff00::/8", "100::/64" }
    for _, ip in ipairs({ "0.0.0.0", "0.1.2.3", "198.18.0.1", "198.19.255.254", "224.0.0.1",
                          "255.255.255.255", "240.0.0.1", "::", "::10.0.0.1", "64:ff9b:1::c612:1",
                          "ff02::1", "100::1" }) do
      local ok, why = ranges.check(ip, all)
      assert.is_nil(ok, ip)
      assert.matches("never a destination", why)
    end
    assert.is_true(ranges.check("198.20.0.1", all)) -- control: just past 198.18.0.0/15
    assert.is_true(ranges.check("64:ff9b:2::1", all))
  end)

  it("classifies and validates the internal list", function()
    local what, cidr, fixed = ranges.classify("198.18.3.4")
    assert.matches("synthetic", what)
    assert.are.equal("198.18.0.0/15", cidr)
    assert.is_true(fixed)
    assert.is_nil(ranges.classify("192.0.2.1"))
    local nets, err = ranges.parse_internal({ "10.0.0.0/8", "10.1.2.0/8" })
    assert.is_nil(nets)
    assert.are.equal("network.internal", err.argument)
    assert.matches('"10%.1%.2%.0/8": host bits set', err.detail)
    assert.is_table(ranges.parse_internal({ "10.0.0.0/8", "10.1.2.0/24" }))
    local ok, why = ranges.check("192.0.2.1", { "not-a-cidr" })
    assert.is_nil(ok)
    assert.matches("not%-a%-cidr", why)
    local bad, bwhy = ranges.check("not-an-ip")
    assert.is_nil(bad)
    assert.matches("not an IP address", bwhy)
  end)
end)
