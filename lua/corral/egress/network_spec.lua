--- The `network` table of a sandbox, checked: what each field may hold, and nothing
-- else. Pure (no sockets, no namespaces, no registry), so that describing a sandbox
-- (`corral.sandbox`) never loads the data plane; the plane (`corral.egress.plane`)
-- reads the same table once it builds the sandbox's network.
-- @module corral.egress.network_spec
local core = require "corral.core"
local errors = require "corral.errors"
local allowlist = require "corral.egress.allowlist"
local address = require "corral.egress.address"
local ranges = require "corral.egress.ranges"

local M = {}

--- What the data plane uses for a field the table leaves out. No idle limit: a long-lived
-- connection (ssh, a database pool, a websocket without pings) lives as long as its ends
-- do, and TCP keepalive on both legs ends it once either end is gone. 4,096 connections
-- per sandbox: a parallel build's downloads (lowered to what the host process's fd limit
-- holds: corral.egress.fdlimit). Each costs the host six fds once bytes have moved, about
-- 20 KiB of kernel memory (its two sockets, two pipes, the NAT entry) and 2 KiB of the
-- corral process's, plus up to 2 x 256 KiB of pipe only while bytes wait in it. Measured
-- with `build/corral scripts/bench/egress-conns.lua 2000` (a real `corral run` whose
-- tenant holds 2,000 echoed connections): corral's RSS +3.5 MiB, kernel slab +52 MiB
-- against +13.5 MiB for the same connections made directly. attempt_delay is RFC 8305's
-- head start of one address over the next (250 ms, the RFC's recommended value).
--
-- A UDP flow has no end of its own: it ends after udp_idle seconds without a datagram
-- either way, 120 by default (RFC 4787 REQ-5: a NAT keeps a UDP mapping at least 2
-- minutes; QUIC and NTP clients expect no less). At most max_udp_flows are relayed at
-- once, 1,024 by default: each holds one upstream socket on the host (plus a reply socket
-- per destination in the sandbox) and under 200 bytes of relay state.
M.DEFAULTS = { max_connections = 4096, idle = 0, connect_timeout = 10, attempt_delay = 0.25, udp_idle = 120,
  max_udp_flows = 1024 }

local KNOWN = { allow = true, decide = true, internal = true, resolve = true, budget = true,
                max_connections = true, idle = true, connect_timeout = true, link = true, sni = true,
                learn = true, udp_idle = true, max_udp_flows = true, secrets = true, ca_file = true,
                requests = true, request = true, upstream_proxy = true }
local LINK = { peer_netns = true, address = true, peer_address = true, gateway = true }

local function bad(detail)
  return nil, errors.invalid_argument("network", detail)
end

--- Checks an operator's resolve table (`{name = "addr" | {"addr", ...}}`) and returns it
-- with its names normalised as allowlist names are (`PyPI.org.` is `pypi.org`).
-- @tparam table t
-- @treturn[1] table name → {address text, ...}
-- @return[2] nil
-- @treturn[2] table `invalid_argument` on `network.resolve` naming the name or address
function M.resolve_table(t)
  local out = {}
  local function rbad(detail) return nil, errors.invalid_argument("network.resolve", detail) end
  for k, v in pairs(t) do
    local name, why = address.normalize_name(k)
    if not name then return rbad(string.format("%s: %s", tostring(k), why)) end
    local list = type(v) == "string" and { v } or v
    if type(list) ~= "table" or #list == 0 then
      return rbad(string.format("%s: expected an address or a list of addresses, got %s", name, type(v)))
    end
    out[name] = out[name] or {}
    for _, a in ipairs(list) do
      local text = type(a) == "string" and (a:match("^%[(.*)%]$") or a)
      if not text or not core.inet.parse(text) then
        return rbad(string.format("%s: %s is not an IP address", name,
          type(a) == "string" and string.format("%q", a) or type(a)))
      end
      table.insert(out[name], text)
    end
  end
  return out
end

local function check_link(l)
  if type(l) ~= "table" then return bad("link must be a table") end
  for k in pairs(l) do
    if not LINK[k] then return bad("link: unknown field " .. tostring(k)) end
  end
  if type(l.peer_netns) ~= "string" or l.peer_netns:sub(1, 1) ~= "/" then
    return bad("link.peer_netns must be the path of a network namespace (e.g. /run/netns/NAME)")
  end
  for _, k in ipairs({ "address", "peer_address" }) do
    if l[k] ~= nil and (type(l[k]) ~= "string" or not l[k]:match("^[%x:.]+/%d+$")) then
      return bad("link." .. k .. " must be ADDRESS/PREFIX")
    end
  end
  if not l.address or type(l.gateway) ~= "string" or not core.inet.parse(l.gateway) then
    return bad("link needs address (ADDRESS/PREFIX) and gateway (an address)")
  end
  return true
end

--- Validates `sandbox.network` once (a malformed entry refuses the sandbox).
-- @tparam table network `{allow = {...}, decide = fn?, internal = {cidr...}?,
--   resolve = fn|table?, budget = n?, max_connections = n?, idle = s? (0: none), connect_timeout = s?,
--   link = {peer_netns =, address =, peer_address? =, gateway =}?, sni = "match"|"require"|"off"?,
--   learn = boolean? (answer every name, relay nothing it was not allowed: `corral.egress.learn`),
--   udp_idle = s? (> 0), max_udp_flows = n?} (see `corral.egress.udp`), secrets = {...}? (made by
--   `corral.egress.secrets.parse`), ca_file = path? (trusted upstream besides the host's store)`
-- @treturn[1] table the network table, checked
-- @return[2] nil
-- @treturn[2] table `invalid_argument` naming the field or entry and the reason
function M.check(network)
  if type(network) ~= "table" then return bad("must be a table") end
  for k in pairs(network) do
    if not KNOWN[k] then return bad("unknown field " .. tostring(k)) end
  end
  local _, err = allowlist.parse(network.allow or {})
  if err then return nil, err end
  if network.decide ~= nil and type(network.decide) ~= "function" then
    return bad("decide must be a function")
  end
  local _, ierr = ranges.parse_internal(network.internal)
  if ierr then return nil, ierr end
  local resolve = network.resolve
  if resolve ~= nil and type(resolve) ~= "function" and type(resolve) ~= "table" then
    return bad("resolve must be a function or a table of name → address(es)")
  end
  if type(resolve) == "table" then
    local _, rerr = M.resolve_table(resolve)
    if rerr then return nil, rerr end
  end
  if network.link ~= nil then
    local ok, lerr = check_link(network.link)
    if not ok then return nil, lerr end
  end
  for _, k in ipairs({ "max_connections", "budget", "max_udp_flows" }) do
    if network[k] ~= nil and (math.type(network[k]) ~= "integer" or network[k] < 1) then
      return bad(k .. " must be a positive integer")
    end
  end
  if network.sni ~= nil and network.sni ~= "off" and network.sni ~= "match" and network.sni ~= "require" then
    return bad('sni must be "match" (a name the first flight carries must be the connection\'s), '
      .. '"require" (and it must carry one) or "off"')
  end
  if network.learn ~= nil and type(network.learn) ~= "boolean" then return bad("learn must be a boolean") end
  for _, k in ipairs({ "idle", "connect_timeout" }) do
    local v = network[k]
    if v ~= nil and (type(v) ~= "number" or v ~= v or v < 0 or v > 86400 * 365) then
      return bad(k .. " must be a number of seconds (0: none, at most a year)")
    end
  end
  if network.secrets ~= nil then
    local why = require("corral.egress.secrets").check(network.secrets)
    if why then return bad(why) end
  end
  if network.ca_file ~= nil and type(network.ca_file) ~= "string" then return bad("ca_file must be a path") end
  if network.request ~= nil and type(network.request) ~= "function" then return bad("request must be a function") end
  local up = network.upstream_proxy
  if up ~= nil and (type(up) ~= "table" or type(up.ip) ~= "string" or math.type(up.port) ~= "integer") then
    return bad("upstream_proxy must be {ip =, port =} (corral.egress.upstream_proxy.parse)")
  end
  if (network.request ~= nil or network.requests ~= nil) and network.secrets == nil then
    return bad("request rules apply on the hosts a secret is bound to: give secrets too")
  end
  local ui = network.udp_idle
  if ui ~= nil and (type(ui) ~= "number" or ui ~= ui or ui <= 0 or ui > 86400 * 365) then
    return bad("udp_idle must be a number of seconds above 0 (a UDP flow has no end of its own), at most a year")
  end
  return network
end

return M
