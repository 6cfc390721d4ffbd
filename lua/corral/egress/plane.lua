--- The egress data plane of one sandbox: its network namespace, link and ruleset, and
-- the parts that serve it — the DNS responder (`corral.egress.responder`), the acceptor
-- (`corral.egress.acceptor`), the inbound service (`corral.egress.service`), and, once a
-- `udp:` entry (or `--learn`) asks for it, the UDP relay (`corral.egress.udp`) — driven
-- by one process-wide loop (`corral.egress.loop`), which polls what `watch` lists.
--
-- Ownership order: the host creates the netns (owned by the host's user namespace, in
-- which the tenant holds no capability), brings lo up with default routes via lo, binds
-- the responder and acceptor inside it from setns threads, programs and verifies the
-- nftables table — all before the tenant exists. The tenant then joins the netns from
-- the spawner before its own user namespace is made.
--
-- Without root (`new_netns`): the netns is owned by a user namespace of the caller's own
-- (U1), over which the caller holds every capability without entering it; each step
-- "inside" runs on a child that joins U1 and the netns (`corral_ns_run_in`), and the
-- tenant's user namespace is made inside U1, so it holds nothing over the netns either.
-- Upstream sockets live in the host's netns and need no mark; `--link` is refused.
--
-- The policy lives in the process's registry (`corral.egress.registry`): the plane
-- registers it at `new`, forgets it at `close`, and follows its changes (a subscriber
-- that brings the ruleset's ports in line and clears the responder's cache).
-- @module corral.egress.plane
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"
local events = require "corral.egress.events"
local decision = require "corral.egress.decision"
local network_spec = require "corral.egress.network_spec"
local registry = require "corral.egress.registry"
local responder = require "corral.egress.responder"
local acceptor = require "corral.egress.acceptor"
local service = require "corral.egress.service"
local ruleset = require "corral.egress.ruleset"
local udp = require "corral.egress.udp"
local terminated = require "corral.egress.terminated"
local name_files = require "corral.name_files"

local M = {}
local Plane = {}
Plane.__index = Plane

M.MARK = core.nft.DEFAULT_MARK

--- Addresses lo holds besides 127.0.0.1, the sandbox's own: glibc's getaddrinfo with
-- AI_ADDRCONFIG for IPv4 (`getent ahostsv4`, Python's and Perl's IPv4 lookups, Node's
-- `family: 4`) answers "not found" unless an interface holds an IPv4 address other than
-- 127.0.0.1, and a sandbox's only interface is lo. 127.0.0.2 is loopback already. No
-- IPv6 one is added: a global IPv6 address would make every client try IPv6 first (RFC
-- 6724 ordering), where today IPv4 comes first; an IPv6-only lookup with AI_ADDRCONFIG
-- fails as on any IPv4-only host.
M.ADDRCONFIG_ADDRESSES = { { "127.0.0.2", 32 } }

--- The tenant's hostname under the built-in mechanisms (corral.name_files): the
-- responder answers it with the sandbox's loopback.
M.HOSTNAME = name_files.HOSTNAME

--- How often (seconds) the loop reads the ruleset's record of the SYNs it refused.
M.REFUSED_INTERVAL = 1

--- Creates and programs the plane for sandbox id with network (checked by
-- `corral.egress.network_spec.check`).
-- @tparam string id
-- @tparam[opt] table network
-- @treturn[1] table plane, with `netns` (fd userdata for the spawner), `dns_port`,
--   `acceptor_port`, `responder` and `acceptor`
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", what failed), or the
--   registry's `invalid_argument`
function M.new(id, network)
  network = network or {}
  local defaults = network_spec.DEFAULTS
  local self = setmetatable({ id = id, network = network, registry = registry.process,
    max_connections = network.max_connections or defaults.max_connections,
    idle = network.idle or defaults.idle, nft = core.nft,
    connect_timeout = network.connect_timeout or defaults.connect_timeout,
    attempt_delay = defaults.attempt_delay, udp_idle = network.udp_idle or defaults.udp_idle,
    max_udp_flows = network.max_udp_flows or defaults.max_udp_flows }, Plane)
  local function fail(what, err, errno)
    self:close()
    return nil, errors.cannot_enforce("network_restriction", what .. ": " .. tostring(err), errno)
  end
  -- The policy lives in the process-wide registry: allow/revoke apply to the next
  -- decision, and a tenant has no path to it.
  -- No list is not an empty list: `{decide = fn}` alone makes the hook the authority.
  local policy, perr = self.registry:set(id, network.allow, { decide = network.decide,
    budget = network.budget, internal = network.internal })
  if perr then return nil, perr end
  -- One allocator per sandbox, the registry's: what the responder hands out is what
  -- `corral.egress.address` and `lookup` report.
  self.synth = policy.synthetic
  local resolve_with = network.resolve
  if type(resolve_with) == "table" then
    resolve_with, perr = network_spec.resolve_table(resolve_with)
    if perr then
      self.registry:remove(id)
      return nil, perr
    end
  end
  local err, errno
  self.netns, err, errno, self.netns_owner = M.new_netns()
  if not self.netns then return fail("netns", err, errno) end
  local ok
  if network.link and self.netns_owner ~= "host" then
    return fail("--link", M.LINK_NEEDS_ROOT)
  end
  if network.link then
    ok, err, errno = self:attach_link(network.link)
    if not ok then return fail("link", err, errno) end
  else
    ok, err, errno = core.rtnl.lo_default_routes(self.netns)
    if not ok then return fail("lo and default routes", err, errno) end
    for _, a in ipairs(M.ADDRCONFIG_ADDRESSES) do
      ok, err, errno = core.rtnl.addr(self.netns, "lo", a[1], a[2])
      if not ok then return fail("lo address " .. a[1], err, errno) end
    end
  end
  local what
  self.responder, what, err = responder.new(self.netns, { id = id, synth = self.synth, registry = self.registry,
    ipv4_only = self.link ~= nil, hostname = M.HOSTNAME, learn = network.learn, secrets = network.secrets })
  if not self.responder then return fail(what, err) end
  self.dns_port = self.responder.port
  if network.secrets then
    local rq = network.requests or {}
    self.terminator, err = terminated.new(id, network.secrets, network.ca_file,
      { rules = rq.rules, methods = rq.methods, hook = network.request, budget = network.budget })
    if not self.terminator then return fail("TLS termination for --secret", err) end
  end
  self.acceptor, err = acceptor.new(self.netns, { id = id, synth = self.synth, registry = self.registry,
    resolve_with = resolve_with, link = self.link, mark = M.MARK, max_connections = self.max_connections,
    idle = self.idle, connect_timeout = self.connect_timeout, attempt_delay = self.attempt_delay,
    sni = network.sni, terminator = self.terminator, secrets = network.secrets,
    upstream_proxy = network.upstream_proxy })
  if not self.acceptor then return fail("acceptor", err) end
  self.acceptor_port = self.acceptor.port
  -- learn mode: every port reaches the acceptor, which records what was wanted (nil);
  -- else the policy's ports, false for none
  if not network.learn then self.tcp_ports = ruleset.tcp_ports(policy) end
  -- the UDP relay only for a policy that can use it: no other sandbox needs TPROXY
  self.udp_ports = false
  if network.learn then self.udp_ports = nil else self.udp_ports = ruleset.udp_ports(policy) end
  if self.udp_ports ~= false then
    ok, err = self:udp_enable()
    if not ok then return fail("UDP relay", err) end
  end
  local plan = ruleset.plan(self, self.tcp_ports)
  ok, err, errno = self.nft.apply(self.netns, plan)
  if not ok then return fail("nftables ruleset", err, errno) end
  -- Read back and compare: a ruleset that is not exactly ours is not enforcement.
  ok, err, errno = self.nft.verify(self.netns, plan)
  if not ok then return fail("nftables read-back", err, errno) end
  self.on_policy = self.registry:subscribe(function(changed, p)
    if changed == self.id then return self:policy_changed(p) end
    return true
  end)
  return self
end

--- Why `--link` is refused to a caller without privilege.
M.LINK_NEEDS_ROOT = "needs root: the link's far end goes into another network namespace, which a "
  .. "caller without CAP_NET_ADMIN over it cannot administer (run without --link: connections then "
  .. "leave from the host's own network namespace)"

--- A new, empty network namespace for a sandbox, owned by a user namespace in which the
-- tenant will hold no capability (docs/architecture.md, invariant 4). A caller that may
-- make one in its own user namespace (root) does, as it always has; one that may not
-- (EPERM: an unprivileged caller) makes it in a new user namespace of its own, which maps
-- only its own ids and which the tenant's user namespace is later made beneath.
-- @treturn[1] userdata the netns fd
-- @treturn[1] nil
-- @treturn[1] nil
-- @treturn[1] string "host" (owned by the caller's user namespace) or "caller" (by a
--   user namespace of the caller's own)
-- @return[2] nil
-- @treturn[2] string why (both attempts, when both failed)
-- @treturn[2] integer errno
function M.new_netns()
  local netns, err, errno = core.ns.new_net()
  if netns then return netns, nil, nil, "host" end
  if errno ~= core.errno.EPERM then return nil, err, errno end
  local owned, uerr, uerrno = core.ns.new_net_in_userns()
  if owned then return owned, nil, nil, "caller" end
  return nil, tostring(err) .. "; in a user namespace of the caller's own: " .. tostring(uerr), uerrno
end

--- Makes the UDP relay and its route in the netns (once).
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] string why
function Plane:udp_enable()
  if self.udp then return true end
  local err
  self.udp, err = udp.new(self.netns, { id = self.id, synth = self.synth, registry = self.registry, mark = M.MARK,
    idle = self.udp_idle, max_flows = self.max_udp_flows, link = self.link,
    host_env = function() return acceptor.host_env(self.link) end,
    resolve = function(name) return self.acceptor:resolve(name) end,
    eyeballs = function(addrs) return acceptor.eyeballs_order(addrs) end })
  if not self.udp then return nil, err end
  return true
end

--- Follows a change of the sandbox's policy (`allow`, `revoke`, `set`): the responder
-- forgets its cached verdicts and the ruleset's ports are brought in line.
-- @tparam table|nil policy
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce: the ruleset could not follow (see `corral.egress.ruleset.sync_ports`)
function Plane:policy_changed(policy)
  if self.responder then self.responder:forget() end
  if self.udp then self.udp:forget_denied() end
  return ruleset.sync_ports(self, policy)
end

--- Logs the connections the ruleset refused at their SYN since the last reading (no
-- entry names their port, so they never reached the acceptor), and the datagrams it
-- refused (no `udp:` entry names their port): one `connect` (or `udp`) deny per
-- destination and port, `by = "ruleset"`, `count` its SYNs (datagrams), the name mapped
-- back from its synthetic address and the reason the acceptor (the UDP relay) would have
-- given; past the ruleset's record (a port scan), one line counts the rest. The kernel
-- counts; the loop reads once a second (`tick`) and when the plane closes, so no packet
-- wakes it.
function Plane:read_refused()
  if not self.netns then return end
  local list, total = self.nft.refused(self.netns)
  if not list then return end
  local seen = self.refused_seen or {}
  self.refused_seen = seen
  local policy, env = self.registry:get(self.id), nil
  local itemised = 0
  for _, r in ipairs(list) do
    -- the ruleset's record holds packed addresses: text from here on
    local ip = address.packed_text(r.ip) or "?"
    local udp_refusal = r.proto == "udp"
    local key = (r.proto or "tcp") .. ip .. r.port
    local n = r.count - (seen[key] or 0)
    seen[key] = r.count
    if n > 0 then
      itemised = itemised + n
      local name = self.synth:lookup(ip)
      env = env or acceptor.host_env(self.link)
      local v = decision.decide({ sandbox = self.id, name = name, ip = (not name) and ip or nil, port = r.port,
        protocol = r.proto }, policy, env)
      local why = v.verdict == "deny" and v.reason
        or ("port " .. r.port .. " was not open to the " .. (udp_refusal and "UDP relay" or "acceptor")
          .. " when it came (the policy changed since)")
      events.emit({ sandbox = self.id, kind = udp_refusal and "udp" or "connect", protocol = r.proto, name = name,
        ip = ip, port = r.port, verdict = "deny", by = "ruleset", count = n, bytes = 0,
        reason = why .. (udp_refusal and " (refused by the ruleset)" or " (refused at the SYN by the ruleset)") })
    end
  end
  local more = total - (self.refused_total or 0) - itemised
  self.refused_total = total
  if more > 0 then
    events.emit({ sandbox = self.id, kind = "connect", verdict = "deny", by = "ruleset", count = more, bytes = 0,
      reason = string.format("%d more connections or datagrams refused by the ruleset (its record of %d "
        .. "destinations per family and protocol is full)", more, core.nft.REFUSED_SIZE) })
  end
end

--- The loop's periodic turn (see `corral.egress.loop.step`): reads the ruleset's
-- refusals at most every `REFUSED_INTERVAL` seconds.
-- @tparam number now `core.clock.monotime()`
function Plane:tick(now)
  if self.udp then self.udp:tick() end
  if not self:refuses() or now - (self.refused_at or 0) < M.REFUSED_INTERVAL then return end
  self.refused_at = now
  self:read_refused()
end

--- Whether the ruleset refuses anything it records: not when every TCP and every UDP
-- port reaches the acceptor and the relay (`--learn`).
function Plane:refuses()
  return self.tcp_ports ~= nil or self.udp_ports ~= nil
end

--- Inbound: serves `port` on the sandbox's loopback at a host port the kernel chooses
-- (`service_addr` reads it back; see `corral.egress.service`).
-- @tparam integer port
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", …)
function Plane:serve(port)
  local svc, err = service.new(self.netns, { id = self.id, mark = M.MARK, idle = self.idle }, port)
  if not svc then return nil, err end
  self.service, self.service_port, self.service_addr = svc, port, svc.addr
  return true
end

-- The sandbox's own routed link: a veth with one end in the sandbox netns (corral0) and
-- the other in the operator's namespace, a default route through it. Tenant traffic is
-- still redirected before it can use the route (nat/output sees the rerouted packet);
-- only the host's mark-checked upstream sockets leave through it.
function Plane:attach_link(link)
  local ok, err = core.rtnl.link_up(self.netns, "lo")
  if not ok then return nil, err end
  local peer
  peer, err = core.rtnl.netns_open(link.peer_netns)
  if not peer then return nil, err end
  local h = 0
  for i = 1, #self.id do h = (h * 31 + self.id:byte(i)) % 0xffffff end
  self.peer_ifname = string.format("crl%06x%03d", h, math.random(0, 999))
  ok, err = core.rtnl.veth(self.netns, "corral0", peer, self.peer_ifname)
  if ok then
    local addr, len = link.address:match("^(.*)/(%d+)$")
    ok, err = core.rtnl.addr(self.netns, "corral0", addr, tonumber(len))
  end
  if ok then ok, err = core.rtnl.link_up(self.netns, "corral0") end
  if ok and link.peer_address then
    local addr, len = link.peer_address:match("^(.*)/(%d+)$")
    ok, err = core.rtnl.addr(peer, self.peer_ifname, addr, tonumber(len))
  end
  if ok then ok, err = core.rtnl.link_up(peer, self.peer_ifname) end
  if ok then ok, err = core.rtnl.default_via(self.netns, link.gateway, "corral0") end
  peer:close()
  self.link = ok and link or nil
  return ok, err
end

--- The fds the loop polls for this plane, with their handlers: the responder's, the
-- acceptor's and the service's (each part that is still open). Each part says when its
-- list changes (`corral.egress.loop.changed`): the loop polls the list as built until then.
Plane.watch_notifies = true
function Plane:watch()
  local w = {}
  local function add(list) table.move(list, 1, #list, #w + 1, w) end
  if self.responder then add(self.responder:watch()) end
  if self.acceptor then add(self.acceptor:watch(self.port_key)) end
  if self.service then add(self.service:watch()) end
  if self.udp then add(self.udp:watch()) end
  if self.terminator then add(self.terminator:watch()) end
  return w
end

--- When the loop must look at the plane again at the latest (a held connection's wait
-- ends, see `corral.egress.sni_hold`; a DNS-over-TCP connection's silence, see
-- `corral.egress.responder`), monotonic seconds, or nil.
function Plane:deadline()
  local a = self.acceptor and self.acceptor:deadline()
  local r = self.responder and self.responder:deadline()
  if a and r then return math.min(a, r) end
  return a or r
end

--- Decides a destination again with the sandbox's current policy, as the acceptor (or
-- the UDP relay) did.
-- @tparam table dest `{name =, ip =, port =, protocol? =}` (ip only for an IP destination)
-- @treturn nil|string nil while allowed, else why not
function Plane:redecide(dest)
  local v = decision.decide({ sandbox = self.id, name = dest.name, ip = dest.ip, port = dest.port,
    protocol = dest.protocol }, self.registry:get(self.id), acceptor.host_env(self.link))
  if v.verdict ~= "allow" then return v.reason or "denied" end
end

--- Decides the open UDP flows again (see `redecide`) and cuts those no longer allowed.
-- @treturn integer how many were cut
function Plane:recheck_udp()
  if not self.udp then return 0 end
  return self.udp:recheck(function(dest) return self:redecide(dest) end)
end

--- Releases everything the plane holds; idempotent.
function Plane:close()
  if self.on_policy then
    self.registry:unsubscribe(self.on_policy)
    self.on_policy = nil
  end
  if self.netns and self:refuses() then pcall(self.read_refused, self) end
  if self.udp then pcall(self.udp.close, self.udp) end
  self.registry:remove(self.id)
  for _, k in ipairs({ "responder", "service", "acceptor", "terminator", "udp", "netns" }) do
    if self[k] then self[k]:close(); self[k] = nil end
  end
end

return M
