--- Egress allowlist entries: the grammar an operator writes in `network.allow`, each entry
-- parsed to its canonical form (lists of entries and matching: `corral.egress.allowlist`).
--
-- An entry is a destination and an optional port list:
--
--     pypi.org                    the name itself, any port
--     api.example.com:443         one port
--     *.example.com:80,443        any name *below* example.com (a.example.com,
--                                 a.b.example.com), never example.com itself
--     10.1.2.3:8000-8100          an IPv4 address, a port range
--     10.20.0.0/16                an IPv4 network
--     [2001:db8::1]:22            an IPv6 address: always in brackets
--     [2001:db8::]/32:443         an IPv6 network: the prefix length after the bracket
--
-- Ports: `:443`, `:8000-8100`, `:80,443,8000-8100`; 1-65535; no port means any port.
--
-- An entry is for TCP unless it begins `udp:` (`tcp:` may be written and is dropped):
--
--     udp:ntp.example.com:123     UDP datagrams to that name's port 123 (NTP)
--     udp:api.example.com:443     UDP to 443 (QUIC, HTTP/3)
--     udp:10.1.2.0/24:5000-5010   the same grammar after the prefix
--
-- A UDP entry must name its ports (UDP to every port of a host is never one entry's
-- grant), never port 53 alone (DNS stays the sandbox's own responder), and never a URL
-- (a URL's scheme names a TCP service). TCP and UDP entries grant only their own
-- protocol: `api.example.com:443` never lets a datagram through, nor `udp:…:443` a
-- connection.
--
-- A URL is read as the destination it names: `https://api.example.com` is
-- `api.example.com:443`, `http://api.example.com:8080/` is `api.example.com:8080` (the
-- scheme gives the port when the URL has none: http and ws 80, https and wss 443, ssh
-- 22, git 9418). A path other than `/`, a query or user information is refused: the
-- egress plane grants a destination, never a URL, and a grant must not look narrower
-- than it is.
--
-- Also refused, each saying why: a loopback address or network (`127.0.0.1:8080`,
-- `[::1]`, `localhost`) — the sandbox's own loopback, which never leaves it, so the
-- entry could never be used; and a single-label name (`garbage`) — what a typo or a
-- forgotten domain looks like, never a name the responder would answer for a real host.
-- IPv6 text is only accepted in brackets so that a trailing `:443` is never read as
-- part of the address (`2001:db8::1:443` is a valid address *and* a plausible typo for
-- port 443; refusing it is the only reading that cannot widen a grant).
--
-- Names are normalised (ASCII lowercase, one trailing dot dropped) and must be
-- hostnames: labels of 1-63 characters of `[a-z0-9-]`, not starting or ending with `-`,
-- at most 253 characters in all. Refused, each with a reason naming the fix:
--
-- * non-ASCII names: write the A-label (punycode, `xn--…`) form; corral does not
--   convert, so what is granted is exactly what the DNS resolves.
-- * underscores (`_dmarc.example.com`): SRV/TXT owner names, never a host one connects to.
-- * a numeric last label (`1.2.3`, `10.1`, `0x7f000001`): the C library's resolver
--   reads such a "name" as an IPv4 address (inet_aton: 1.2.0.3, 10.0.0.1, 127.0.0.1),
--   so it would grant an address the operator never wrote as one.
-- * a wildcard over a single label (`*.com`, `*.`, `*`): it would grant a whole
--   top-level domain. (No public-suffix list is consulted: `*.co.uk` is accepted.)
--
-- An IPv4-mapped IPv6 address or network (`[::ffff:10.0.0.1]`, `[::ffff:10.0.0.0]/104`)
-- is stored as its IPv4 form, and a mapped destination is matched as IPv4, so the two
-- spellings of one address never disagree.
-- @module corral.egress.grammar
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"
local egress_ranges = require "corral.egress.ranges"

local inet = core.inet
local host_text, parse_net = address.host_text, address.parse_net

local M = {}

--- The argument name every allowlist error carries.
M.ARGUMENT = "network.allow"

local function bad(entry, reason)
  return nil, errors.invalid_argument(M.ARGUMENT, string.format('"%s": %s', tostring(entry), reason))
end

local function parse_ports(text)
  if text == "" then return nil, "empty port list after ':'" end
  local ranges = {}
  for item in (text .. ","):gmatch("([^,]*),") do
    local a, b = item:match("^(%d+)%-(%d+)$")
    if not a then a = item:match("^(%d+)$"); b = a end
    if not a then
      if item:find(":", 1, true) then
        return nil, string.format("bad port list %q: ports are separated by ',' (%s)", text, (text:gsub(":+", ",")))
      end
      return nil, item == "" and "empty item in the port list" or string.format("bad port %q", item)
    end
    local lo, hi = tonumber(a), tonumber(b)
    if #a > 5 or lo < 1 or lo > 65535 then return nil, string.format("port %s out of range 1-65535", a) end
    if #b > 5 or hi < 1 or hi > 65535 then return nil, string.format("port %s out of range 1-65535", b) end
    if lo > hi then return nil, string.format("port range %s-%s is reversed", a, b) end
    ranges[#ranges + 1] = { lo, hi }
  end
  table.sort(ranges, function(x, y) return x[1] < y[1] end)
  local merged = {}
  for _, r in ipairs(ranges) do
    local last = merged[#merged]
    if last and r[1] <= last[2] + 1 then
      if r[2] > last[2] then last[2] = r[2] end
    else
      merged[#merged + 1] = { r[1], r[2] }
    end
  end
  return merged
end

local function ports_text(ports)
  local parts = {}
  for i, r in ipairs(ports) do
    parts[i] = r[1] == r[2] and tostring(r[1]) or (r[1] .. "-" .. r[2])
  end
  return table.concat(parts, ",")
end

--- The port list of an entry as text (`"80,443,8000-8100"`), or `"any"`.
-- @tparam table entry
-- @treturn string
function M.ports_text(entry)
  return entry.ports and ports_text(entry.ports) or "any"
end

local function canonical(e)
  local t
  if e.kind == "name" then
    t = e.name
  elseif e.kind == "wildcard" then
    t = "*." .. e.suffix
  elseif e.kind == "address" then
    t = host_text(e.bytes)
  else
    t = host_text(e.bytes) .. "/" .. e.prefix
  end
  if e.ports then t = t .. ":" .. ports_text(e.ports) end
  return t
end

--- The default port of each URL scheme an entry may be written with.
M.SCHEME_PORTS = { http = 80, https = 443, ws = 80, wss = 443, ssh = 22, git = 9418 }

-- A URL entry as the `host:port` entry it names, or nil and why.
local function from_url(scheme, rest)
  local port = M.SCHEME_PORTS[scheme:lower()]
  if not port then
    local known = {}
    for k in pairs(M.SCHEME_PORTS) do known[#known + 1] = k end
    table.sort(known)
    return nil, string.format("unknown scheme %q: write host:port, or a URL with one of %s", scheme,
      table.concat(known, ", "))
  end
  local authority, path = rest:match("^([^/?#]*)(.*)$")
  if authority:find("@", 1, true) then
    return nil, "user information in a URL is not part of a destination: write the host (and port) only"
  end
  if path ~= "" and path ~= "/" then
    return nil, string.format("the path %q cannot be enforced: an entry grants a destination (host and port), "
      .. "never a URL; write %s", path, authority ~= "" and authority or "the host")
  end
  if authority == "" then return nil, "no host after " .. scheme .. "://" end
  -- "[v6]:port", "[v6]", "host:port" or "host"
  if authority:match("%]$") or (not authority:find(":", 1, true)) then
    return authority .. ":" .. port
  end
  return authority
end

local function loopback(bytes, prefix)
  if #bytes == 4 then return bytes:byte(1) == 127 and prefix >= 8 end
  return prefix == 128 and bytes == string.rep("\0", 15) .. "\1"
end

--- The protocols an entry may name, with the prefix that selects each (`tcp:` is the
-- default and is dropped from the canonical text).
M.PROTOCOLS = { tcp = true, udp = true }

local parse_destination

-- Without its `udp:`/`tcp:` prefix, the entry's destination is read as any TCP entry is.
local function parse_protocol(s, proto, rest)
  if rest:sub(1, 2) == "//" then
    return bad(s, string.format("%s:// is not a URL corral reads; write %s:HOST:PORT", proto, proto))
  end
  if proto == "udp" and rest:match("^%a[%w+.-]*://") then
    return bad(s, string.format("a URL names a TCP service; write %s:HOST:PORT (%s:api.example.com:443)",
      proto, proto))
  end
  local inner = rest:match("^(%a+):")
  if inner and M.PROTOCOLS[inner:lower()] then return bad(s, "more than one protocol prefix") end
  local e, err = M.parse_entry(rest)
  if not e then return bad(s, (err.detail:gsub('^"[^"]*": ', ""))) end
  e.source = s
  if proto == "tcp" then return e end
  if not e.ports then
    local t = "udp:" .. e.text
    return bad(s, string.format("a UDP entry names its ports (%s:123, %s:443, %s:5000-5010): UDP to every "
      .. "port of a destination is never granted by one entry", t, t, t))
  end
  e.proto = "udp"
  e.text = "udp:" .. e.text
  return e
end

--- Parses one allowlist entry.
-- @tparam string s the entry as written
-- @treturn table `{kind =, text = canonical, proto = "tcp"|"udp", name? =, suffix? =,
--   bytes? =, prefix? =, family? =, cidr? =, ports = nil (any) or merged {lo, hi} pairs,
--   source = s}`; or nil and `invalid_argument`
function M.parse_entry(s)
  if type(s) ~= "string" then return bad(s, "an entry must be a string, got " .. type(s)) end
  local proto, rest = s:match("^(%a+):(.*)$")
  if proto and M.PROTOCOLS[proto:lower()] then return parse_protocol(s, proto:lower(), rest) end
  return parse_destination(s)
end

-- An entry without a protocol prefix (TCP).
function parse_destination(s)
  if type(s) ~= "string" then return bad(s, "an entry must be a string, got " .. type(s)) end
  if s == "" then return bad(s, "empty entry") end
  if s:find("%s") then return bad(s, "contains whitespace") end
  if s:find("\0", 1, true) then return bad(s, "contains a NUL byte") end
  local scheme, after = s:match("^(%a[%w+.-]*)://(.*)$")
  if scheme then
    local hostport, why = from_url(scheme, after)
    if not hostport then return bad(s, why) end
    local e, err = parse_destination(hostport)
    if not e then return bad(s, err.detail:gsub('^"[^"]*": ', "")) end
    e.source = s
    return e
  end
  local host, net, port
  if s:sub(1, 1) == "[" then
    local close = s:find("]", 1, true)
    if not close then return bad(s, "'[' without ']'") end
    host = s:sub(1, close)
    local rest = s:sub(close + 1)
    if host:find("/", 1, true) then
      local a, l = host:match("^%[(.-)/(.*)%]$")
      return bad(s, string.format("write the prefix length after the bracket: [%s]/%s", a, l))
    end
    if not host:find(":", 1, true) then
      return bad(s, "brackets are for IPv6 addresses; write an IPv4 address without them")
    end
    local len, p = rest:match("^/([^:]*)(.*)$")
    if len then net = len; rest = p end
    if rest ~= "" then
      port = rest:match("^:(.*)$")
      if not port then return bad(s, string.format("unexpected %q after the address", rest)) end
    end
  else
    local _, colons = s:gsub(":", "")
    if colons >= 2 then
      local a, l = s:match("^([^/]*)/(%d*)$")
      if a and inet.parse(a) == "inet6" then
        return bad(s, string.format("write IPv6 networks with the address in brackets: [%s]/%s or [%s]/%s:443",
          a, l, a, l))
      end
      if inet.parse(s) == "inet6" then
        local addr6, p = s:match("^(.*[^:]):(%d+)$")
        if addr6 and inet.parse(addr6) == "inet6" and tonumber(p) >= 1 and tonumber(p) <= 65535 then
          return bad(s, string.format("write IPv6 addresses in brackets: [%s], or, if :%s is a port, [%s]:%s",
            s, p, addr6, p))
        end
        return bad(s, string.format("write IPv6 addresses in brackets: [%s] or [%s]:443", s, s))
      end
      -- not IPv6: a port list written with ':' instead of ','
      local head, tail = s:match("^([^:]*):(.*)$")
      local dest = head:match("^(.-)/") or head
      if tail:match("^[%d,:-]*$") and head ~= "" and (inet.parse(dest) == "inet" or address.normalize_name(dest)
          or dest:match("^%*%.")) then
        return bad(s, string.format("more than one ':' after %s: ports are separated by ',' (%s:%s)",
          head, head, (tail:gsub(":+", ","))))
      end
      return bad(s, "not a valid entry: an IPv6 address is written in brackets, with any prefix and port "
        .. "after the bracket ([2001:db8::1]:443, [2001:db8::]/32:443); a name or IPv4 address takes one "
        .. "':' before its ports (example.com:80,443)")
    end
    host, port = s:match("^([^:]*):(.*)$")
    if not host then host = s end
    local a, l = host:match("^(.-)/(.*)$")
    if a then host, net = a, l end
  end
  if host == "" then return bad(s, "no destination before ':'") end

  local e = { source = s }
  if port then
    local ports, why = parse_ports(port)
    if not ports then return bad(s, why) end
    -- port 53 alone is always the sandbox's own responder (no query is forwarded), so such
    -- an entry could never be used: refused rather than silently meaningless
    if #ports == 1 and ports[1][1] == 53 and ports[1][2] == 53 then
      return bad(s, "port 53 (TCP and UDP) always reaches the sandbox's own DNS responder, which answers " ..
        "allowed names itself and forwards nothing: DNS stays the sandbox's own; allow the names instead")
    end
    e.ports = ports
  end

  local is_ip = host:sub(1, 1) == "[" or net ~= nil or inet.parse(host) or host:match("^[%d.]+$")
  if is_ip then
    local bytes, prefix, is_net = parse_net(host, net)
    if not bytes then return bad(s, prefix) end
    if loopback(bytes, prefix) then
      return bad(s, "that is the sandbox's own loopback: connections to it never leave the sandbox, so "
        .. "the entry could never be used; for a service on the host, give it a name (--allow NAME:PORT "
        .. "--resolve NAME=ADDR) or allow the address it listens on")
    end
    if not is_net then
      -- an address no connection reaches (multicast, broadcast, unspecified, corral's own
      -- synthetic ranges): refused like the loopback, the entry could never be used
      local what, cidr, fixed = egress_ranges.classify(inet.format(bytes))
      if fixed then
        local synthetic = cidr:find("^198%.18%.") or cidr:find("^64:ff9b:1:")
        return bad(s, string.format("%s (%s) is never a destination, so the entry could never be used%s", what,
          cidr, synthetic and "; allow the name the sandbox's DNS gave that address instead" or ""))
      end
    end
    e.kind = is_net and "network" or "address"
    e.bytes, e.prefix = bytes, prefix
    e.family = #bytes == 4 and "inet" or "inet6"
    e.cidr = inet.format(bytes) .. "/" .. prefix
  elseif host == "*" or host == "*." then
    return bad(s, "a wildcard needs a domain: *.example.com")
  elseif host:sub(1, 2) == "*." then
    local suffix, nlabels = address.normalize_name(host:sub(3))
    if not suffix then return bad(s, nlabels) end
    if nlabels < 2 then
      return bad(s, string.format("a wildcard over the single label %q would match a whole top-level "
        .. "domain; name at least two labels (*.example.%s)", suffix, suffix))
    end
    e.kind, e.suffix = "wildcard", suffix
  elseif host:find("*", 1, true) then
    return bad(s, "'*' is only allowed as the whole first label: *.example.com")
  else
    local name, why = address.normalize_name(host)
    if not name then return bad(s, why) end
    if name == "localhost" or name:match("%.localhost$") then
      return bad(s, "localhost is the sandbox's own loopback: connections to it never leave the sandbox, so "
        .. "the entry could never be used")
    end
    if not name:find(".", 1, true) then
      return bad(s, string.format("a single-label name is not a host on any network the sandbox reaches "
        .. "(a typo, or a domain left out?): write the full name, e.g. %s.example.com:443", name))
    end
    e.kind, e.name = "name", name
  end
  e.proto = "tcp"
  e.text = canonical(e)
  return e
end

return M
