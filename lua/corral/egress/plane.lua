--- The egress data plane of one sandbox: its network namespace, ruleset, DNS
-- responder and acceptor, driven by one process-wide loop (see corral.egress.loop).
--
-- Ownership order (DESIGN invariant 4): the host creates the netns (owned by the host's
-- user namespace, in which the tenant holds no capability), brings lo up with default
-- routes via lo, binds the responder and acceptor inside it from setns threads, programs
-- and verifies the nftables table — all before the tenant exists. The tenant then joins
-- the netns from the spawner before its own user namespace is made.
--
-- DNS: names on the allowlist are answered with a synthetic address (stable per name per
-- sandbox); every other name is NXDOMAIN; other query types REFUSED. Nothing the tenant
-- asks is ever forwarded, and no upstream DNS response is ever parsed. When the sandbox's
-- synthetic table is full (`corral.egress.synthetic`, `limit`), a new allowed name is
-- answered SERVFAIL and logged as a deny naming the exhaustion: SERVFAIL says "this server
-- cannot answer now", which is true, where NXDOMAIN would deny that an allowed name exists
-- (and be cached as such) and REFUSED is this responder's answer to a policy refusal.
-- Acceptor: SO_ORIGINAL_DST → synthetic address → name (or the literal IP) → decide →
-- deny: RST at once; allow: resolve on the host, refuse private/loopback/link-local/
-- CGNAT/metadata results and the host's own addresses unless `network.internal` lists
-- them, connect upstream from the host netns, relay both ways.
--
-- Every handler runs on the host's one loop, with tenant input: each query and each
-- connection is handled under `pcall`, so an error in one is that query's SERVFAIL or
-- that connection's RST plus a deny event naming the error, never the host's end.
-- @module corral.egress.plane
local core = require "corral.core"
local errors = require "corral.errors"
local egress = require "corral.egress"
local allowlist = require "corral.egress.allowlist"
local decision = require "corral.egress.decision"
local ranges = require "corral.egress.ranges"
local events = require "corral.egress.events"
local hostaddr = require "corral.egress.hostaddr"

local M = {}
local Plane = {}
Plane.__index = Plane

M.MARK = 42
M.TTL = 60
M.TCP_DNS_MAX = 32
M.TCP_DNS_IDLE = 5
-- Queries answered on one DNS-over-TCP connection (pipelined, RFC 7766 6.2.1.1), after
-- which it is closed. Each answer is at most 301 bytes framed (the codec's largest), so
-- 16 fit in the 16 KiB a new TCP socket may send before the tenant reads (tcp_wmem's
-- default): the responder's blocking write can never wait on a tenant that only writes.
M.TCP_DNS_QUERIES = 16
-- Largest query accepted over TCP (the length prefix): the UDP size of RFC 1035; larger
-- closes the connection.
M.TCP_DNS_MSG_MAX = 512
local KNOWN = { allow = true, decide = true, internal = true, resolve = true, budget = true,
                max_connections = true, idle = true, connect_timeout = true, link = true }
local LINK = { peer_netns = true, address = true, peer_address = true, gateway = true }

local function bad(detail)
  return nil, errors.invalid_argument("network", detail)
end

local function deny(_, client, ctx, reason)
  core.reset(client)
  ctx.verdict, ctx.reason, ctx.bytes = "deny", reason, 0
  events.emit(ctx)
end

-- After an error: the connection is reset and closed however far it got, and the deny
-- is logged even if the reset itself fails.
local function deny_after_error(client, ctx, err)
  pcall(core.reset, client)
  pcall(function() client:close() end)
  ctx.verdict, ctx.reason, ctx.bytes = "deny", "internal error: " .. tostring(err):sub(1, 200), 0
  pcall(events.emit, ctx)
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
    local name, why = allowlist.normalize_name(k)
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

--- Validates `sandbox.network` once (a malformed entry refuses the sandbox).
-- @tparam table network `{allow = {...}, decide = fn?, internal = {cidr...}?,
--   resolve = fn|table?, budget = n?, max_connections = n?, idle = s?, connect_timeout = s?}`
-- @treturn table the network table, checked
-- @return[2] nil
-- @treturn[2] table error naming the entry and the reason
function M.policy(network)
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
    local l = network.link
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
  end
  for _, k in ipairs({ "max_connections", "budget" }) do
    if network[k] ~= nil and (math.type(network[k]) ~= "integer" or network[k] < 1) then
      return bad(k .. " must be a positive integer")
    end
  end
  return network
end

--- Creates and programs the plane for sandbox id with policy (from M.policy).
-- @treturn table plane, with `netns` (fd userdata for the spawner)
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", what failed)
function M.new(id, network)
  network = network or {}
  local self = setmetatable({ id = id, network = network, tcp_dns = {}, names = {}, names_n = 0,
    max_connections = network.max_connections or 256, idle = network.idle or 300,
    connect_timeout = network.connect_timeout or 10 }, Plane)
  local function fail(what, err)
    self:close()
    return nil, errors.cannot_enforce("network_restriction", what .. ": " .. tostring(err))
  end
  -- The policy lives in the process-wide registry: allow/revoke apply to the next
  -- decision, and a tenant has no path to it.
  local policy, perr = egress.registry:set(id, network.allow or {}, { decide = network.decide,
    budget = network.budget, internal = network.internal })
  if perr then return nil, perr end
  -- One allocator per sandbox, the registry's: what the responder hands out is what
  -- `corral.egress.address` and `lookup` report.
  self.synth = policy.synthetic
  if type(network.resolve) == "table" then
    self.resolve_names, perr = M.resolve_table(network.resolve)
    if perr then
      egress.registry:remove(id)
      return nil, perr
    end
  end
  local err
  self.netns, err = core.ns.new_net()
  if not self.netns then return fail("netns", err) end
  local ok
  if network.link then
    ok, err = self:attach_link(network.link)
    if not ok then return fail("link", err) end
  else
    ok, err = core.rtnl.lo_default_routes(self.netns)
    if not ok then return fail("lo and default routes", err) end
  end
  -- The responder holds port 53 itself, so a resolver configured at a loopback address
  -- (127.0.0.53, 127.0.0.1) reaches it directly, and any other :53 is redirected to it.
  self.dns_udp, self.dns_port = core.listen_in_netns(self.netns, "udp", "::", 53)
  if not self.dns_udp then return fail("DNS responder (udp)", self.dns_port) end
  self.dns_tcp, err = core.listen_in_netns(self.netns, "tcp", "::", 53)
  if not self.dns_tcp then return fail("DNS responder (tcp)", err) end
  self.acceptor, self.acceptor_port = core.listen_in_netns(self.netns, "tcp", "::", 0)
  if not self.acceptor then return fail("acceptor", self.acceptor_port) end
  self.tcp_ports = M.tcp_ports(policy)
  local plan = M.ruleset_plan(self, self.tcp_ports)
  ok, err = core.nft.apply(self.netns, plan)
  if not ok then return fail("nftables ruleset", err) end
  -- Read back and compare: a ruleset that is not exactly ours is not enforcement.
  ok, err = core.nft.verify(self.netns, plan)
  if not ok then return fail("nftables read-back", err) end
  egress.registry:watch(id, function(p)
    self.names, self.names_n = {}, 0
    self:sync_ports(p)
  end)
  return self
end

--- The nftables plan for a plane with these redirected ports (see `tcp_ports`).
function M.ruleset_plan(plane, ports)
  return { dns_port = plane.dns_port, acceptor_port = plane.acceptor_port, mark = M.MARK,
    tcp_ports = ports or nil, no_tcp = ports == false }
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
    if not e.ports then return nil end
    for _, r in ipairs(e.ports) do spans[#spans + 1] = { r[1], r[2] } end
  end
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
  if #merged > 16 then return nil end
  return merged
end

--- Brings the ruleset's redirected ports in line with the policy after `allow`,
-- `revoke` or `set`: the table is replaced in one transaction (never a moment without
-- it) and read back. On failure the old ruleset stays, which only ever refuses more.
-- @tparam table|nil policy
function Plane:sync_ports(policy)
  local want = M.tcp_ports(policy)
  if same_ports(want, self.tcp_ports) or not self.netns then return end
  local plan = M.ruleset_plan(self, want)
  local ok, err = core.nft.apply(self.netns, setmetatable({ replace = true }, { __index = plan }))
  if ok then ok, err = core.nft.verify(self.netns, plan) end
  if ok then
    self.tcp_ports = want
  else
    events.emit({ sandbox = self.id, kind = "error", verdict = "deny", bytes = 0,
      reason = "ruleset not updated for the new policy (it keeps refusing what it did): " .. tostring(err) })
  end
end

--- Inbound: the host listens on 127.0.0.1 at a port the kernel chooses and relays each
-- connection to `port` on the sandbox's own loopback. Two provisions can never be handed
-- the same port: the kernel allocates it, and `address` reads back what it allocated.
function Plane:serve(port)
  local fd, bound = core.tcp_listen("127.0.0.1", 0)
  if not fd then return nil, errors.cannot_enforce("network_restriction", "service listener: " .. tostring(bound)) end
  self.service, self.service_port, self.service_addr = fd, port, "127.0.0.1:" .. bound
  return true
end

function Plane:service_accept(loop)
  local client = core.tcp_accept(self.service, 0)
  if not client then return end
  local ctx = { sandbox = self.id, kind = "inbound", port = self.service_port }
  local ok, err = pcall(self.service_relay, self, loop, client, ctx)
  if not ok then deny_after_error(client, ctx, err) end
end

function Plane:service_relay(loop, client, ctx)
  -- A socket made inside the sandbox's netns reaches its loopback; the mark exempts it
  -- from the redirect like every host-made socket there. The relay connects it without
  -- blocking: a tenant that listens and never accepts (its backlog full, the SYN dropped)
  -- would otherwise hold the host's one loop, and every other sandbox, for the timeout.
  -- A failure arrives as the connection's "failed" event.
  local id, err = loop.relay:add_connect(client, "127.0.0.1", self.service_port, { mark = M.MARK,
    netns = self.netns, timeout = 2, idle = self.idle, key = self.id .. "/inbound" })
  if not id then return deny(self, client, ctx, "service port: " .. tostring(err)) end
  ctx.verdict, ctx.reason, ctx.bytes = "allow", "service port " .. self.service_port, 0
  loop.pending[id] = ctx
  events.emit(ctx)
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

--- The fds the loop polls for this plane, with their handlers.
function Plane:watch()
  local w = {
    { fd = self.dns_udp, on = function() self:dns_udp_ready() end },
    { fd = self.dns_tcp, on = function() self:dns_tcp_accept() end },
    { fd = self.acceptor, on = function(loop) self:accept(loop) end },
  }
  if self.service then
    w[#w + 1] = { fd = self.service, on = function(loop) self:service_accept(loop) end }
  end
  self:dns_tcp_reap(core.monotime())
  for conn in pairs(self.tcp_dns) do
    w[#w + 1] = { fd = conn, conn = true, owner = self.id, on = function() self:dns_tcp_read(conn) end }
  end
  return w
end

-- A name as the tenant sent it, safe to log. The codec hands it back in presentation
-- form, every byte outside hostname characters already written \ddd (as dig does, so a
-- label "api.rt2" is api\046rt2): that is kept as it is. Anything else that could reach
-- here (a backslash not starting \ddd, a control byte) is escaped, once.
local function printable(name)
  if type(name) ~= "string" then return nil end
  name = name:sub(1, 1024)
  if not name:find("[^%w%.%-_*]") then return name end
  local out, i = {}, 1
  while i <= #name do
    local c = name:sub(i, i)
    if c == "\\" and name:find("^%d%d%d", i + 1) then
      out[#out + 1] = name:sub(i, i + 3)
      i = i + 4
    else
      out[#out + 1] = c:find("[^%w%.%-_*]") and string.format("\\%03d", c:byte()) or c
      i = i + 1
    end
  end
  return table.concat(out)
end
M.printable = printable

-- Why a query the codec refused is malformed, for the log: the codec says only "Bad
-- message"; the header and the question's shape say which rule it broke (the rules of
-- core/lib/dns.c, read again here only to name them).
local function malformed(msg)
  if #msg < 12 then return string.format("%d bytes: shorter than a DNS header", #msg) end
  local flags, qd, an, ns, ar = string.unpack(">I2I2I2I2I2", msg, 3)
  if flags & 0x8000 ~= 0 then return "a response (QR set), not a query: not answered" end
  if flags & 0x7800 ~= 0 then return string.format("opcode %d: only QUERY (0) is answered", (flags >> 11) & 15) end
  if qd ~= 1 then return string.format("QDCOUNT %d: exactly one question is answered", qd) end
  if an ~= 0 or ns ~= 0 then return string.format("ANCOUNT %d, NSCOUNT %d: a query carries neither", an, ns) end
  if ar > 1 then return string.format("ARCOUNT %d: at most one (OPT) record", ar) end
  local o, wire = 13, 0
  while true do
    local l = msg:byte(o)
    if not l then return "the question's name is truncated" end
    wire = wire + 1 + l
    if l == 0 then break end
    if l >= 0xc0 then return "a compression pointer in the question's name" end
    if l > 63 then return string.format("label type or length %d in the question's name", l) end
    if wire + 1 > 255 then return "the question's name is longer than 255 octets" end
    if o + l > #msg then return "the question's name is truncated" end
    o = o + 1 + l
  end
  o = o + 1
  if #msg < o + 3 then return "the question is truncated (no QTYPE/QCLASS)" end
  o = o + 4
  if ar == 1 then
    if #msg < o + 10 or msg:byte(o) ~= 0 or string.unpack(">I2", msg, o + 1) ~= 41 then
      return "the additional record is not an OPT record"
    end
    o = o + 11 + string.unpack(">I2", msg, o + 9)
    if o - 1 > #msg then return "the OPT record is truncated" end
  end
  if #msg > o - 1 then return string.format("%d bytes after the question", #msg - (o - 1)) end
  return "malformed"
end
M.malformed = malformed

local ANSWER_OF = { [core.dns.FORMERR] = "formerr", [core.dns.NOTIMP] = "notimp" }

-- The answer to one DNS query: synthetic for allowed names, NXDOMAIN otherwise. A query
-- the codec refuses is answered as its contract says (FORMERR, NOTIMP, or dropped) and
-- logged as a deny with the reason.
function Plane:answer(query)
  local q, perr, errno = core.dns.parse(query)
  if not q then
    local rcode = errno and core.dns.error_rcode(errno)
    events.emit({ sandbox = self.id, kind = "dns", answer = ANSWER_OF[rcode] or "dropped", verdict = "deny",
      reason = "malformed query: " .. malformed(query) .. " (" .. tostring(perr) .. ")", bytes = 0 })
    if not rcode then return nil end
    return core.dns.answer(query, rcode)
  end
  local name = q.name
  local policy = egress.registry:get(self.id)
  local allowed, why, entry = nil, "not a hostname", nil
  if q.hostname then
    local v = self:name_verdict(name, policy)
    allowed, why, entry = v.allowed, v.why, v.entry
  end
  local verdict, rcode, addr, reason, ip
  if not allowed then
    rcode, verdict, reason = core.dns.NXDOMAIN, "nxdomain", why
  elseif q.qclass ~= 1 or (q.qtype ~= core.dns.A and q.qtype ~= core.dns.AAAA) then
    rcode, verdict = core.dns.REFUSED, "refused"
  elseif q.qtype == core.dns.AAAA and self.link then
    -- A link has an IPv4 route only: answer AAAA with no address (NODATA) so that
    -- clients go straight to the IPv4 synthetic address instead of an unroutable one.
    rcode, verdict = core.dns.NOERROR, "nodata"
    reason = "no IPv6 route on the sandbox's link (allowed by " .. entry .. ")"
  else
    local text, bytes = self.synth:address(name, q.qtype == core.dns.A and "inet" or "inet6")
    -- `address` answers nil and an error table on failure: only a text address and its
    -- 4 or 16 bytes are an answer.
    if type(text) == "string" and type(bytes) == "string" and (#bytes == 4 or #bytes == 16) then
      addr, rcode, verdict, ip = bytes, core.dns.NOERROR, "answered", text
      reason = "allowed by " .. entry
    else
      rcode, verdict = core.dns.SERVFAIL, "servfail"
      reason = tostring(text == nil and bytes or "no synthetic address")
    end
  end
  -- A query type nobody answers is refused even for names not allowed (TXT, ANY):
  -- a tenant learns nothing from it either way.
  if q.qtype ~= core.dns.A and q.qtype ~= core.dns.AAAA then
    rcode, verdict, reason = core.dns.REFUSED, "refused", "only A and AAAA queries are answered"
  elseif q.qclass ~= 1 and allowed then
    reason = "only class IN is answered"
  end
  -- verdict is allow/deny like every decision; `answer` says what the responder sent.
  events.emit({ sandbox = self.id, kind = "dns", name = printable(name), ip = ip, qtype = q.qtype, answer = verdict,
    verdict = verdict == "answered" and "allow" or "deny", reason = reason, bytes = 0 })
  return core.dns.answer(query, rcode, addr, M.TTL)
end

--- What the policy says of a name for DNS — `{allowed =, why =, entry =}` — cached until
-- the policy changes through the registry (its watcher clears the cache): deciding and
-- finding the entry again cost ~6 of the ~14 µs an answer took (measured with a loop
-- over Plane:answer). At most 4096 names are kept; a full cache starts over. A policy
-- table changed behind the registry's back (`registry:get(id).decide = …`) may then be
-- answered from the cache, but every connection is still decided live by the acceptor.
function Plane:name_verdict(name, policy)
  local v = self.names[name]
  if v then return v end
  local allowed, why = decision.resolvable(name, policy)
  v = { allowed = allowed, why = why, entry = allowed and M.entry_of(name, policy) or nil }
  if self.names_n >= 4096 then self.names, self.names_n = {}, 0 end
  self.names[name] = v
  self.names_n = self.names_n + 1
  return v
end

--- What made a name resolvable, for the log: the allowlist entry that matches it, or
-- the decide hook (which decides each connection).
-- @tparam string name
-- @tparam table policy
-- @treturn string
function M.entry_of(name, policy)
  local al = type(policy) == "table" and policy.allowlist
  local n = allowlist.normalize_name(name)
  if n and al and allowlist.is_allowlist(al) then
    local e = al:match({ name = n })
    if e then return e.text end
  end
  if type(policy) == "table" and policy.decide then return "the decide hook (asked at connect)" end
  return "the policy"
end

-- One query, protected: an error answers SERVFAIL (when the query can be answered at
-- all) and is logged as a deny, never raised into the loop.
function Plane:answer_safely(query)
  local ok, reply = pcall(self.answer, self, query)
  if ok then return reply end
  local q = select(2, pcall(core.dns.parse, query))
  events.emit({ sandbox = self.id, kind = "dns", name = type(q) == "table" and printable(q.name) or nil,
    answer = "servfail", verdict = "deny", reason = "responder error: " .. tostring(reply):sub(1, 200), bytes = 0 })
  local ok2, fallback = pcall(core.dns.answer, query, core.dns.SERVFAIL)
  return ok2 and fallback or nil
end

function Plane:dns_udp_ready()
  for _ = 1, 64 do
    local msg, addr, port, localaddr = core.udp_recv(self.dns_udp)
    if not msg then return end
    local reply = self:answer_safely(msg)
    if reply then core.udp_send(self.dns_udp, reply, addr, port, localaddr) end
  end
end

function Plane:dns_tcp_drop(conn)
  if self.tcp_dns[conn] then
    self.tcp_dns[conn] = nil
    conn:close()
  end
end

-- Closes the DNS-over-TCP connections silent for TCP_DNS_IDLE seconds (since the accept
-- or the last answer); answers how many remain.
function Plane:dns_tcp_reap(now)
  local n = 0
  for conn, st in pairs(self.tcp_dns) do
    if now - st.last > M.TCP_DNS_IDLE then self:dns_tcp_drop(conn) else n = n + 1 end
  end
  return n
end

function Plane:dns_tcp_accept()
  local c = core.tcp_accept(self.dns_tcp, 0)
  if not c then return end
  -- Bounded: a tenant holding connections open must not exhaust the host's fds, so past
  -- the cap, and past a few seconds of silence, DNS over TCP is closed.
  local now = core.monotime()
  if self:dns_tcp_reap(now) >= M.TCP_DNS_MAX then c:close() return end
  self.tcp_dns[c] = { buf = "", last = now, served = 0 }
end

-- DNS over TCP: each message a 2-byte length, then the message. Queries pipelined on one
-- connection are answered in order (RFC 7766 6.2.1.1), up to TCP_DNS_QUERIES; then, or
-- on a query longer than TCP_DNS_MSG_MAX, at the client's end, or after TCP_DNS_IDLE
-- seconds of silence, the connection is closed.
function Plane:dns_tcp_read(conn)
  local st = self.tcp_dns[conn]
  if not st then return end
  local chunk, _, errno = core.read(conn, 4096)
  if not chunk and errno == core.errno.EAGAIN then return end
  if not chunk or chunk == "" then return self:dns_tcp_drop(conn) end
  local buf = st.buf .. chunk
  while #buf >= 2 do
    local len = buf:byte(1) * 256 + buf:byte(2)
    if len > M.TCP_DNS_MSG_MAX then return self:dns_tcp_drop(conn) end
    if #buf < 2 + len then break end
    local reply = self:answer_safely(buf:sub(3, 2 + len))
    buf = buf:sub(3 + len)
    st.served, st.last = st.served + 1, core.monotime()
    if reply then
      local framed = string.char(#reply // 256, #reply % 256) .. reply
      if core.write(conn, framed) ~= #framed then return self:dns_tcp_drop(conn) end
    end
    if st.served >= M.TCP_DNS_QUERIES then return self:dns_tcp_drop(conn) end
  end
  st.buf = buf
end

-- The host-side addresses for a permitted name: the operator's resolver, else the host's.
-- Answers a non-empty list of strings, or nil and why.
function Plane:resolve(name)
  local r, v = self.network.resolve
  if type(r) == "table" then
    v = (self.resolve_names or {})[name]
    if not v then return nil, "no address for " .. name .. " in the operator's table" end
  elseif type(r) == "function" then
    local ok, res = pcall(r, name)
    if not ok then return nil, "resolver error: " .. tostring(res):sub(1, 200) end
    v = res
  else
    local err
    v, err = core.resolve_host(name)
    if not v then return nil, err end
  end
  if type(v) == "string" then v = { v } end
  if type(v) ~= "table" or #v == 0 then
    return nil, "the resolver answered " .. (type(v) == "table" and "no address" or type(v))
  end
  local out = {}
  for i, a in ipairs(v) do
    if type(a) ~= "string" then return nil, "the resolver answered a " .. type(a) .. " among its addresses" end
    out[i] = a
  end
  return out
end

-- The host's own local networks, and, with a link, the sandbox's own address on it
-- (upstream sockets are then made in the sandbox's netns, where that address is local).
function Plane:host_env()
  local extra = {}
  if self.link and self.link.address then
    local b, p = allowlist.parse_cidr((self.link.address:gsub("/%d+$", "")))
    if b then extra[1] = { bytes = b, prefix = p, text = self.link.address } end
  end
  return hostaddr.env(extra)
end

--- Accepts one redirected connection and decides it. Whatever goes wrong after the
-- accept is this connection's RST and deny event, never an error in the loop.
function Plane:accept(loop)
  local client = core.tcp_accept(self.acceptor, 0)
  if not client then return end
  local ctx = { sandbox = self.id, kind = "connect" }
  local ok, err = pcall(self.connect, self, loop, client, ctx)
  if not ok then deny_after_error(client, ctx, err) end
end

function Plane:connect(loop, client, ctx)
  local ip, port = core.original_dst(client)
  ctx.ip, ctx.port = ip, port
  if not ip then return deny(self, client, ctx, "no original destination: " .. tostring(port)) end
  -- Loopback destinations are never redirected (the ruleset returns them), so a
  -- loopback original destination is a tenant dialling the acceptor itself (measured:
  -- SO_ORIGINAL_DST then reads 127.0.0.1:<acceptor port>, not ENOENT). Never relayed,
  -- whatever the allowlist says.
  if ip:match("^127%.") or ip == "::1" or ip:match("^::ffff:127%.") then
    return deny(self, client, ctx, "direct connection to the acceptor")
  end
  local name = self.synth:lookup(ip)
  ctx.name = name
  local policy = egress.registry:get(self.id)
  local env = self:host_env()
  local verdict = decision.decide({ sandbox = self.id, name = name, ip = (not name) and ip or nil, port = port },
    policy, env)
  if verdict.verdict ~= "allow" then return deny(self, client, ctx, verdict.reason) end
  if loop.relay:count(self.id) >= self.max_connections then
    return deny(self, client, ctx, "connection cap reached (" .. self.max_connections .. ")")
  end
  local upstream = ip
  if name then
    local addrs, rerr = self:resolve(name)
    if not addrs then
      return deny(self, client, ctx, "cannot resolve " .. name .. " on the host: " .. tostring(rerr))
    end
    upstream = nil
    local why
    for _, a in ipairs(addrs) do
      local good, r = decision.check_resolved(a, policy, env)
      if good then upstream = a; break end
      why = a .. ": " .. tostring(r)
    end
    if not upstream then return deny(self, client, ctx, "resolved into a refused range (" .. why .. ")") end
  end
  ctx.upstream = upstream
  -- Upstream from the host's netns, or — with a link — from the sandbox's own netns
  -- through a mark-checked socket (mark written, read back and compared; no fd otherwise),
  -- which the ruleset's mark rules exempt from the redirect.
  -- The connection joins its destination's relay (`corral.egress.loop`), which is what
  -- `recheck` cuts when the policy stops allowing the destination.
  local id, cerr = loop.relay:add_connect(client, upstream, port, {
    timeout = self.connect_timeout, idle = self.idle, key = self.id, max_per_key = self.max_connections,
    port_key = self.port_key,
    mark = self.link and M.MARK or nil, netns = self.link and self.netns or nil },
    { name = name, ip = (not name) and ip or nil, port = port })
  if not id then return deny(self, client, ctx, "upstream: " .. tostring(cerr)) end
  ctx.verdict, ctx.reason, ctx.entry, ctx.bytes = "allow", verdict.reason, verdict.entry, 0
  loop.pending[id] = ctx
  events.emit(ctx)
end

--- Decides a destination again with the sandbox's current policy, as `connect` did.
-- @tparam table dest `{name =, ip =, port =}` (ip only for an IP destination)
-- @treturn nil|string nil while allowed, else why not
function Plane:redecide(dest)
  local v = decision.decide({ sandbox = self.id, name = dest.name, ip = dest.ip, port = dest.port },
    egress.registry:get(self.id), self:host_env())
  if v.verdict ~= "allow" then return v.reason or "denied" end
end

--- Releases everything the plane holds; idempotent.
function Plane:close()
  egress.registry:remove(self.id)
  for conn in pairs(self.tcp_dns or {}) do conn:close() end
  self.tcp_dns = {}
  for _, k in ipairs({ "service", "acceptor", "dns_tcp", "dns_udp", "netns" }) do
    if self[k] then self[k]:close(); self[k] = nil end
  end
end

return M
