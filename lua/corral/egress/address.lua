--- Addresses and hostnames as egress policy reads them: text or packed addresses, CIDRs
-- and normalised hostnames. Pure: the allowlist grammar, the refused ranges, the
-- synthetic addresses and the host's own addresses all read through it, so it requires
-- none of them.
-- @module corral.egress.address
local core = require "corral.core"
local memo = require "corral.memo"

local inet = core.inet

local M = {}

-- Addresses come in two forms that must never be confused: text, which is what a user,
-- a log, a resolver and the kernel's textual answers (SO_ORIGINAL_DST, the UDP relay)
-- give, and packed bytes (network order), which only the core's binary interfaces give
-- (the ruleset's record, a DNS answer). A string is text unless the caller says it is
-- packed: "host" and "api.example.test" are four and sixteen characters, never
-- 104.111.115.116 or 6170:692e:…, and "1::1" is an IPv6 address, never 49.58.58.49.

--- Reads an IP address written as text (`192.0.2.1`, `2001:db8::1`, `[2001:db8::1]`).
-- Never bytes, whatever the length. IPv4-mapped comes back as IPv4.
-- @tparam string text
-- @treturn string 4 or 16 bytes and the family (`"inet"`/`"inet6"`); or nil and why not
function M.parse_address(text)
  if type(text) ~= "string" then return nil, "not an IP address: " .. tostring(text) end
  local fam, b, v4 = inet.parse(text)
  if not fam then return nil, string.format("not an IP address: %q", text) end
  local bytes = v4 or b
  bytes = inet.unmap(bytes) or bytes
  return bytes, #bytes == 4 and "inet" or "inet6"
end

--- Reads a packed address: exactly 4 or 16 bytes in network order, as the core's binary
-- interfaces give it. Only for bytes the program itself holds, never for a user's string.
-- IPv4-mapped comes back as IPv4.
-- @tparam string bytes
-- @treturn string 4 or 16 bytes and the family; or nil and why not
function M.packed_address(bytes)
  if type(bytes) ~= "string" or (#bytes ~= 4 and #bytes ~= 16) then
    return nil, "not a packed IP address (4 or 16 bytes): " .. tostring(bytes)
  end
  bytes = inet.unmap(bytes) or bytes
  return bytes, #bytes == 4 and "inet" or "inet6"
end

--- The canonical text of an address written as text; IPv6 without brackets.
-- @tparam string text
-- @treturn string|nil
function M.address_text(text)
  local b = M.parse_address(text)
  return b and inet.format(b)
end

--- The text of a packed address (see `packed_address`).
-- @tparam string bytes
-- @treturn string|nil
function M.packed_text(bytes)
  local b = M.packed_address(bytes)
  return b and inet.format(b)
end

--- An address as a host is written in an entry or a URL: IPv6 in brackets.
-- @tparam string bytes packed
-- @treturn string
function M.host_text(bytes)
  local t = inet.format(bytes)
  return #bytes == 16 and "[" .. t .. "]" or t
end

local function numeric_label(label)
  return label:match("^%d+$") or label:match("^0x%x*$")
end

-- normalize_name's answers, remembered (corral.memo; at most 1,024 names): it is pure,
-- and the DNS answer, the decision and the log each ask it again of the same few names,
-- label by label (measured: ~9 % of the Lua work of a request through `corral run
-- --allow`, scripts/bench/egress-curl).
local normalize_name
local remembered_name = memo.bounded(function(name) return normalize_name(name) end, 1024)

--- Normalises a hostname: ASCII lowercase, one trailing dot dropped, then checked.
-- @tparam string name
-- @treturn string the normalised name, or nil and the reason
function M.normalize_name(name)
  if type(name) ~= "string" then return nil, "not a string" end
  return remembered_name(name)
end

normalize_name = function(name)
  if name:find("[\128-\255]") then
    return nil, "non-ASCII name: write its A-label (punycode) form, e.g. xn--bcher-kva.example for "
      .. "b\195\188cher.example"
  end
  local n = name:lower()
  if n:sub(-1) == "." then n = n:sub(1, -2) end
  if n == "" then return nil, "empty name" end
  if #n > 253 then return nil, "name longer than 253 characters" end
  local labels = {}
  for label in (n .. "."):gmatch("([^.]*)%.") do
    if label == "" then return nil, "empty label (two dots, or a leading dot)" end
    if #label > 63 then return nil, string.format("label longer than 63 characters: %s", label) end
    if label:find("_", 1, true) then
      return nil, string.format("underscore in label %q: not a hostname", label)
    end
    local c = label:match("[^a-z0-9-]")
    if c then return nil, string.format("character %q is not allowed in a hostname", c) end
    if label:sub(1, 1) == "-" or label:sub(-1) == "-" then
      return nil, string.format("label %q starts or ends with '-'", label)
    end
    labels[#labels + 1] = label
  end
  if numeric_label(labels[#labels]) then
    return nil, string.format("last label %q is numeric: resolvers read such a name as an IPv4 address; "
      .. "write an address as four decimal parts (10.0.0.1)", labels[#labels])
  end
  return n, #labels
end

-- An IPv4-mapped network of prefix >= 96 is the IPv4 network it maps.
local function fold_network(bytes, prefix)
  local v4 = inet.unmap(bytes)
  if v4 and prefix >= 96 then return v4, prefix - 96 end
  return bytes, prefix
end

-- "addr" or "addr/len", IPv4 or IPv6 text; returns bytes, prefix, is_network or nil, reason.
function M.parse_net(addr, len)
  local family, bytes = inet.parse(addr)
  if not family then
    if addr:match("^[%d.]+$") then
      return nil, "not a valid IPv4 address (four decimal parts 0-255, no leading zeros)"
    end
    return nil, "not a valid IP address"
  end
  local bits = #bytes * 8
  if len == nil then
    local b, p = fold_network(bytes, bits)
    return b, p, false
  end
  if not len:match("^%d%d?%d?$") then return nil, string.format("bad prefix length %q", len) end
  local prefix = tonumber(len)
  if prefix > bits then
    return nil, string.format("prefix length /%d is longer than the %d bits of an %s address", prefix, bits,
      family == "inet" and "IPv4" or "IPv6")
  end
  local net = inet.mask(bytes, prefix)
  if net ~= bytes then
    return nil, string.format("host bits set after /%d: the network is %s/%d", prefix, M.host_text(net), prefix)
  end
  local b, p = fold_network(bytes, prefix)
  return b, p, true
end

--- Parses a CIDR or an address as written in `network.internal` (no port; brackets optional).
-- @tparam string text
-- @treturn string network bytes (IPv4-mapped folded) and the prefix; or nil and the reason
function M.parse_cidr(text)
  if type(text) ~= "string" then return nil, "not a string" end
  local addr, len = text:match("^(.-)/(.*)$")
  if not addr then addr = text end
  local inner = addr:match("^%[(.*)%]$")
  if inner and not inner:find(":", 1, true) then return nil, "brackets are for IPv6 addresses" end
  local bytes, prefix = M.parse_net(addr, len)
  if not bytes then return nil, prefix end
  return bytes, prefix
end

return M
