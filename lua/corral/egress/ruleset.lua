--- The nftables ruleset of a sandbox's plane: its plan, the TCP and UDP ports a policy
-- opens (only those are redirected; the rest are refused at the SYN), and the ruleset
-- brought in line when the policy changes (`corral.egress.plane` follows the registry
-- and calls `sync_ports`).
-- @module corral.egress.ruleset
local core = require "corral.core"
local errors = require "corral.errors"
local events = require "corral.egress.events"
local udp = require "corral.egress.udp"

local M = {}

-- The host's mark, as `corral.egress.plane.MARK`.
local MARK = core.nft.DEFAULT_MARK

--- The nftables plan for a plane with these redirected ports (see `tcp_ports`), and the
-- UDP ports its relay takes (as `udp_ports` answers them, nil included; when not given,
-- the plane's own).
function M.plan(plane, ports, ...)
  local udp_ports = plane.udp_ports
  if select("#", ...) > 0 then udp_ports = ... end
  local relay = udp_ports ~= false and plane.udp or nil
  return { dns_port = plane.dns_port, acceptor_port = plane.acceptor_port, mark = MARK,
    tcp_ports = ports or nil, no_tcp = ports == false,
    udp_port = relay and relay.port or nil, udp_mark = relay and udp.ROUTE_MARK or nil,
    udp_ports = relay and udp_ports or nil }
end

--- The UDP ports some `udp:` entry of the policy allows, as merged `{lo, hi}` ranges
-- (DNS excepted by the ruleset); nil for every port (more ranges than the ruleset takes);
-- false for none: no `udp:` entry, and no relay. A decide hook alone opens no UDP
-- (`corral.egress.decision`).
-- @tparam table|nil policy
-- @treturn table|nil|false
function M.udp_ports(policy)
  if not policy or not policy.allowlist then return false end
  local spans = {}
  for _, e in ipairs(policy.allowlist:entries()) do
    if e.proto == "udp" then
      for _, r in ipairs(e.ports) do spans[#spans + 1] = { r[1], r[2] } end
    end
  end
  return M.merge_ports(spans)
end

--- Sorted, merged `{lo, hi}` ranges; false for none, nil past the ruleset's 16.
-- @tparam {table,...} spans
-- @treturn table|nil|false
function M.merge_ports(spans)
  if #spans == 0 then return false end
  table.sort(spans, function(a, b) return a[1] < b[1] end)
  local merged = { spans[1] }
  for i = 2, #spans do
    local last, r = merged[#merged], spans[i]
    if r[1] <= last[2] + 1 then
      last[2] = math.max(last[2], r[2])
    else
      merged[#merged + 1] = r
    end
  end
  if #merged > core.nft.MAX_PORT_RANGES then return nil end
  return merged
end

local function same_ports(a, b)
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i][1] ~= b[i][1] or a[i][2] ~= b[i][2] then return false end
  end
  return true
end

--- The TCP ports some entry of the policy allows, as merged `{lo, hi}` ranges; nil
-- for "any port may be allowed" (a decide hook, an entry without ports, or more ranges
-- than the ruleset takes); false for "none may be" (an empty list, no hook). Only these
-- ports are redirected to the acceptor; TCP to any other is reset at its SYN, so a bare
-- connect fails too (with every port redirected, the acceptor took each connection only
-- to reset it, and `nc -z` saw the port open).
-- @tparam table|nil policy
-- @treturn table|nil
function M.tcp_ports(policy)
  if not policy or policy.decide or not policy.allowlist then return nil end
  local spans = {}
  for _, e in ipairs(policy.allowlist:entries()) do
    if e.proto ~= "udp" then
      if not e.ports then return nil end
      for _, r in ipairs(e.ports) do spans[#spans + 1] = { r[1], r[2] } end
    end
  end
  return M.merge_ports(spans)
end

--- Brings the ruleset's redirected ports in line with the policy: the table is replaced
-- in one transaction (never a moment without it) and read back. On failure the old
-- ruleset stays (the kernel applies a batch whole or not at all), an `error` event says
-- so, and the registry is told (`nil, err`): it undoes a `set` or `allow`, so the
-- previous policy — stricter than the one that could not be enforced — stays too.
-- @tparam table plane the sandbox's plane (`corral.egress.plane`)
-- @tparam table|nil policy
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", why)
function M.sync_ports(plane, policy)
  local want, want_udp -- nil in learn mode: every port (false, from tcp_ports, is none)
  if not plane.network.learn then want, want_udp = M.tcp_ports(policy), M.udp_ports(policy) end
  if (same_ports(want, plane.tcp_ports) and same_ports(want_udp, plane.udp_ports)) or not plane.netns then
    return true
  end
  if want_udp ~= false then
    local ok, uerr = plane:udp_enable()
    if not ok then
      local why = "the UDP relay could not be made, so the ruleset keeps the previous policy: " .. tostring(uerr)
      events.emit({ sandbox = plane.id, kind = "error", verdict = "deny", bytes = 0, reason = why })
      return nil, errors.cannot_enforce("network_restriction", why)
    end
  end
  -- the replaced table's record of refusals goes with it: read it first
  plane:read_refused()
  local plan = M.plan(plane, want, want_udp)
  local ok, err = plane.nft.apply(plane.netns, setmetatable({ replace = true }, { __index = plan }))
  if ok then ok, err = plane.nft.verify(plane.netns, plan) end
  if ok then
    plane.tcp_ports, plane.udp_ports = want, want_udp
    plane.refused_seen, plane.refused_total = {}, 0
    return true
  end
  local why = "the ruleset could not follow the new policy, so it keeps the previous one (which refuses "
    .. "what it did): " .. tostring(err)
  events.emit({ sandbox = plane.id, kind = "error", verdict = "deny", bytes = 0, reason = why })
  return nil, errors.cannot_enforce("network_restriction", why)
end

return M
