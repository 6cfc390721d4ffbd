--- The host's own addresses: where a connection made for a tenant would reach the host.
--
-- A service on the host bound to the wildcard address (0.0.0.0, ::) answers on every
-- address of the host's network namespace, not only on loopback: a tenant allowed a name
-- that resolves to the host's eth0 address, or an IP entry that covers it, would reach
-- it. `corral.egress.ranges` refuses these like loopback unless `network.internal` lists
-- them (see there).
--
-- The set is every *local* destination of the namespace this process runs in, read from
-- the kernel without sending anything and without a shell:
--
-- * IPv4: the `LOCAL` leaves of /proc/net/fib_trie — each interface address as a /32,
--   and whole local routes (127.0.0.0/8, or an operator's `ip route add local
--   10.9.0.0/16 dev lo`) with their prefix.
-- * IPv6: the routes of /proc/net/ipv6_route flagged RTF_LOCAL (0x80000000), which hold
--   each address as a /128 and any local route with its prefix, plus every address of
--   /proc/net/if_inet6 (one still in duplicate address detection has no local route yet).
--
-- /proc/net is the reading thread's network namespace: it lists the veth address a test
-- adds to the host, not the far end in the test's own netns (tests/egress_hardening_spec.lua,
-- "reads this host's addresses from the kernel").
-- Addresses change under a running host (DHCP, an operator adding one), so the set is
-- read again when it is older than `REFRESH` seconds; reading it costs one pass over the
-- two files, bounded by the size of the host's routing table.
-- @module corral.egress.hostaddr
local core = require "corral.core"
local address = require "corral.egress.address"

local inet = core.inet

local M = {}

--- Seconds a read set is reused before the kernel is asked again.
M.REFRESH = 1

--- The files read (tests and hosts with another /proc may point them elsewhere).
M.FIB_TRIE, M.IPV6_ROUTE, M.IF_INET6 = "/proc/net/fib_trie", "/proc/net/ipv6_route", "/proc/net/if_inet6"

local RTF_LOCAL = 0x80000000

local read = require("corral.file").read

local function hex_bytes(h)
  return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
end

local function add(out, seen, bytes, prefix)
  if not bytes or #bytes * 8 < prefix then return end
  bytes = inet.mask(bytes, prefix)
  local key = bytes .. string.char(prefix)
  if seen[key] then return end
  seen[key] = true
  out[#out + 1] = { bytes = bytes, prefix = prefix, text = inet.format(bytes) .. "/" .. prefix }
end

--- Parses /proc/net/fib_trie text: the networks of its `LOCAL` entries.
-- @tparam string text
-- @treturn {table,...} `{bytes =, prefix =, text =}`
function M.parse_fib_trie(text, out, seen)
  out, seen = out or {}, seen or {}
  local leaf
  for line in text:gmatch("[^\n]+") do
    local addr = line:match("|%-%- ([%d.]+)%s*$")
    if addr then
      local fam, b = inet.parse(addr)
      leaf = fam == "inet" and b or nil
    elseif leaf then
      local len, kind = line:match("^%s*/(%d+)%s+%S+%s+(%u+)")
      if kind == "LOCAL" then add(out, seen, leaf, tonumber(len)) end
    end
  end
  return out
end

--- Parses /proc/net/ipv6_route text: its RTF_LOCAL routes.
-- @tparam string text
-- @treturn {table,...}
function M.parse_ipv6_route(text, out, seen)
  out, seen = out or {}, seen or {}
  for line in text:gmatch("[^\n]+") do
    local dst, len, flags = line:match("^(%x+) (%x%x) %x+ %x%x %x+ %x+ %x+ %x+ (%x+)")
    if dst and #dst == 32 and (tonumber(flags, 16) & RTF_LOCAL) ~= 0 then
      add(out, seen, hex_bytes(dst), tonumber(len, 16))
    end
  end
  return out
end

--- Parses /proc/net/if_inet6 text: every address, as a /128.
-- @tparam string text
-- @treturn {table,...}
function M.parse_if_inet6(text, out, seen)
  out, seen = out or {}, seen or {}
  for addr in text:gmatch("(%x+) %x+ %x+ %x+ %x+ +%S+") do
    if #addr == 32 then add(out, seen, hex_bytes(addr), 128) end
  end
  return out
end

--- Reads the set now (no cache).
-- @treturn[1] {table,...} `{bytes =, prefix =, text =}`, IPv4 and IPv6
-- @return[2] nil
-- @treturn[2] string why it could not be read
function M.read()
  local out, seen = {}, {}
  local v4, err = read(M.FIB_TRIE)
  if not v4 then return nil, "host addresses: " .. tostring(err) end
  M.parse_fib_trie(v4, out, seen)
  -- A host without IPv6 has neither file: it then has no IPv6 address to protect.
  local v6 = read(M.IPV6_ROUTE)
  if v6 then M.parse_ipv6_route(v6, out, seen) end
  local ifs = read(M.IF_INET6)
  if ifs then M.parse_if_inet6(ifs, out, seen) end
  return out
end

local cache, cache_at

--- The host's local networks, read again when older than `REFRESH` seconds. When a read
-- fails the previous set is kept; with no set at all the error is returned, and callers
-- refuse (a set that cannot be read protects nothing).
-- @tparam[opt] number now `core.clock.monotime()`
-- @treturn[1] {table,...}
-- @return[2] nil
-- @treturn[2] string
function M.get(now)
  now = now or core.clock.monotime()
  if cache and now - cache_at < M.REFRESH then return cache end
  local set, err = M.read()
  if set then
    cache, cache_at = set, now
  elseif not cache then
    return nil, err
  end
  return cache
end

--- The `env` argument of `corral.egress.decision.decide` and `check_resolved`:
-- `{host = get()}`, or `{host_error = why}` (then they refuse every address).
-- @tparam[opt] {table,...} extra more local networks (a sandbox link's own address)
-- @treturn table
function M.env(extra)
  local set, err = M.get()
  if not set then return { host_error = err } end
  if extra and #extra > 0 then
    set = table.move(set, 1, #set, 1, {})
    table.move(extra, 1, #extra, #set + 1, set)
  end
  return { host = set }
end

--- Forgets the cached set, so the next `get` reads the kernel.
function M.invalidate()
  cache, cache_at = nil, nil
end

--- The entry of a set that contains an address, if any.
-- @tparam table set from `get`
-- @tparam string ip address text
-- @treturn table|nil
function M.contains(set, ip)
  local b = address.parse_address(ip)
  if not b then return nil end
  for _, n in ipairs(set or {}) do
    if #n.bytes == #b and inet.in_cidr(b, n.bytes, n.prefix) then return n end
  end
  return nil
end

return M
