--- The UDP side of one sandbox: every datagram flow to a port some `udp:` entry names,
-- decided once and relayed (`core.udprelay`), with each decision and each flow's end
-- logged.
--
-- The ruleset marks such a datagram; the mark routes it to lo (`core.rtnl.mark_local`),
-- where TPROXY hands it to the relay's socket with its destination as the tenant wrote
-- it (an nft redirect would rewrite the destination, and UDP has no SO_ORIGINAL_DST). A
-- flow is the tenant's address and port and that destination. Its first datagram is
-- decided as a TCP connection is (`corral.egress.decision`, protocol "udp"): the synthetic
-- address maps back to its name, the name is resolved on the host, refused ranges apply,
-- and an allowed flow gets a connected upstream socket on the host; replies go back to
-- the tenant from the address and port it wrote to. A denied flow's datagrams never
-- leave: the first is logged, the rest are dropped without waking the loop until the
-- flow has been silent for `DENY_HOLD` seconds (or the policy changes).
--
-- A flow ends after `network.udp_idle` seconds without a datagram either way (default
-- `corral.egress.network_spec.DEFAULTS.udp_idle`); at most `network.max_udp_flows` are
-- relayed at once. DNS is never here: port 53 stays the sandbox's own responder.
--
-- Events (`corral.egress.events`), each with `protocol = "udp"`: `udp` for each flow's
-- decision (allow or deny, bytes 0; a datagram the ruleset refused because no `udp:`
-- entry names its port is one too, `by = "ruleset"`, with its `count`); `udp_closed` for
-- an allowed flow's end (bytes each way, datagrams in `count`), `cut` when `recheck`
-- ended it.
-- @module corral.egress.udp
local core = require "corral.core"
local decision = require "corral.egress.decision"
local events = require "corral.egress.events"
local loop = require "corral.egress.loop"

local M = {}
local Udp = {}
Udp.__index = Udp

--- The mark the ruleset puts on a datagram for the relay, and the routing table that
-- mark selects (a local default route through lo). Both live only in the sandbox's
-- netns; the mark differs from the host's own (`corral.egress.plane.MARK`).
M.ROUTE_MARK = 43
M.ROUTE_TABLE = 43

--- Seconds a denied flow stays denied while it keeps sending (its datagrams dropped
-- without a decision, and without a log line each): conntrack's own limit for an
-- unanswered UDP flow (nf_conntrack_udp_timeout).
M.DENY_HOLD = 30

--- Flows (of every state: allowed, undecided, denied) one sandbox's relay remembers
-- beyond `max_udp_flows`: denied ones are kept so that their datagrams stay quiet.
M.DENIED_ROOM = 4096

--- Makes the routes and the relay in the sandbox's netns.
-- @tparam userdata netns
-- @tparam table sandbox `{id =, synth =, registry =, mark = the host's mark, idle =,
--   max_flows =, link = network.link|nil, host_env = function() → env for decisions,
--   resolve = function(name) → {addr, …} | nil, why, eyeballs = function(addrs) →
--   ordered addrs}`
-- @treturn[1] table the UDP side, with `port` (the relay's, for the ruleset)
-- @return[2] nil
-- @treturn[2] string what failed, and why
function M.new(netns, sandbox)
  local ok, err = core.rtnl.mark_local(netns, M.ROUTE_MARK, M.ROUTE_TABLE)
  if not ok then return nil, "UDP route to the relay: " .. tostring(err) end
  local relay, port = core.udprelay.new(netns, { mark = sandbox.mark,
    max_entries = sandbox.max_flows + M.DENIED_ROOM,
    upstream_netns = sandbox.link and netns or nil, upstream_mark = sandbox.link and sandbox.mark or nil })
  if not relay then return nil, "UDP relay (IP_TRANSPARENT in the sandbox's netns): " .. tostring(port) end
  return setmetatable({ id = sandbox.id, synth = sandbox.synth, registry = sandbox.registry, relay = relay,
    port = port, idle = sandbox.idle, max_flows = sandbox.max_flows, host_env = sandbox.host_env,
    resolve = sandbox.resolve, eyeballs = sandbox.eyeballs, flows = {}, denied = {} }, Udp)
end

local function loopback(ip)
  return ip:match("^127%.") ~= nil or ip == "::1"
end

-- The decision's event for one flow, completed by `decide`.
local function flow_event(self, ev, name)
  return { sandbox = self.id, kind = "udp", protocol = "udp", name = name, ip = ev.dst, port = ev.dport, bytes = 0 }
end

-- `by` as a connection's (corral.egress.acceptor): the decision's, else `policy`.
function Udp:deny(ev, ctx, reason, by)
  self.relay:deny(ev.id, M.DENY_HOLD)
  self.denied[ev.id] = true
  ctx.verdict, ctx.reason, ctx.by = "deny", reason, by or "policy"
  events.emit(ctx)
end

-- A new flow: decided, then relayed or denied. Whatever goes wrong is its deny.
function Udp:decide(ev)
  local name = self.synth:lookup(ev.dst)
  local ctx = flow_event(self, ev, name)
  -- Loopback is never marked for the relay: a datagram to it came to the relay's own
  -- port on the tenant's loopback.
  if loopback(ev.dst) then return self:deny(ev, ctx, "direct datagram to the UDP relay") end
  local policy = self.registry:get(self.id)
  local env = self.host_env()
  local v = decision.decide({ sandbox = self.id, name = name, ip = (not name) and ev.dst or nil, port = ev.dport,
    protocol = "udp" }, policy, env)
  if v.verdict ~= "allow" then
    ctx.entry = v.entry
    return self:deny(ev, ctx, v.reason, v.by)
  end
  if self.relay:count() >= self.max_flows then
    return self:deny(ev, ctx, string.format("UDP flow cap reached (%d; --max-udp-flows)", self.max_flows))
  end
  local addrs = { ev.dst }
  if name then
    local got, rerr = self.resolve(name)
    if not got then return self:deny(ev, ctx, "cannot resolve " .. name .. " on the host: " .. tostring(rerr)) end
    local good, why = {}, nil
    for _, a in ipairs(got) do
      local ok, r = decision.check_resolved(a, policy, env)
      if ok then good[#good + 1] = a else why = a .. ": " .. tostring(r) end
    end
    if #good == 0 then return self:deny(ev, ctx, "resolved into a refused range (" .. why .. ")") end
    addrs = self.eyeballs(good)
  end
  local used, uerr = self.relay:allow(ev.id, addrs, ev.dport, self.idle)
  if not used then
    return self:deny(ev, ctx, "upstream: " .. tostring(uerr) .. " (" .. table.concat(addrs, ", ") .. ")")
  end
  ctx.verdict, ctx.reason, ctx.entry, ctx.upstream, ctx.by = "allow", v.reason, v.entry, addrs[used], v.by
  self.flows[ev.id] = { ctx = ctx, dest = { name = name, ip = (not name) and ev.dst or nil, port = ev.dport,
    protocol = "udp" } }
  events.emit(ctx)
end

local WHY = { idle = "idle", cut = "cut", closed = "the sandbox ended" }

-- An allowed flow's end: its decision again, with the bytes and datagrams it moved.
function Udp:ended(ev)
  self.denied[ev.id] = nil
  local flow = self.flows[ev.id]
  self.flows[ev.id] = nil
  if not flow then return end
  local ctx = flow.ctx
  local why = ev.why == "idle" and string.format("idle for %g s", self.idle) or WHY[ev.why]
  if ev.why == "cut" then why = "cut: " .. tostring(flow.cut or "cut") end
  if ev.err ~= 0 then why = why .. "; upstream: " .. tostring(ev.msg) end
  events.emit({ sandbox = self.id, kind = ev.why == "cut" and "cut" or "udp_closed", protocol = "udp",
    name = ctx.name, ip = ctx.ip, port = ctx.port, upstream = ctx.upstream, entry = ctx.entry,
    verdict = ev.why == "cut" and "deny" or "allow", reason = why, bytes_up = ev.up, bytes_down = ev.down,
    bytes = ev.up + ev.down, count = ev.sent + ev.received, dropped = ev.dropped > 0 and ev.dropped or nil })
end

--- Moves what the relay has ready, and decides and logs what it reports.
function Udp:run()
  if not self.relay then return end
  for _, ev in ipairs(self.relay:run() or {}) do
    if ev.kind == "new" then
      local ok, err = pcall(self.decide, self, ev)
      if not ok then
        pcall(self.relay.deny, self.relay, ev.id, M.DENY_HOLD)
        events.emit({ sandbox = self.id, kind = "udp", protocol = "udp", ip = ev.dst, port = ev.dport, bytes = 0,
          verdict = "deny", by = "policy", reason = "internal error: " .. tostring(err):sub(1, 200) })
      end
    elseif ev.kind == "end" then
      self:ended(ev)
    else
      events.emit({ sandbox = self.id, kind = "udp", protocol = "udp", verdict = "deny", bytes = 0, by = "policy",
        count = ev.dropped, reason = string.format("%d datagrams of new UDP flows dropped: the sandbox's flow "
          .. "table is full (%d flows, allowed or recently denied)", ev.dropped, self.max_flows + M.DENIED_ROOM) })
    end
  end
end

--- The loop's periodic turn: ends the flows idle past their limit.
function Udp:tick()
  self:run()
end

--- Forgets the denied flows, so that their next datagram is decided again: the policy
-- changed.
function Udp:forget_denied()
  if not self.relay then return end
  for id in pairs(self.denied) do self.relay:cut(id) end
  self.denied = {}
end

--- Decides every open flow again with `redecide(dest)` (nil while allowed, else why
-- not), and cuts those no longer allowed; each is logged as a `cut` event.
-- @tparam function redecide
-- @treturn integer how many flows were cut
function Udp:recheck(redecide)
  local n = 0
  local ids = {}
  for id in pairs(self.flows) do ids[#ids + 1] = id end
  table.sort(ids)
  for _, id in ipairs(ids) do
    local flow = self.flows[id]
    local ok, why = pcall(redecide, flow.dest)
    if not ok then why = "re-decision failed: " .. tostring(why):sub(1, 200) end
    if why then
      flow.cut = why
      if self.relay:cut(id) then n = n + 1 end
    end
  end
  self:run()
  return n
end

--- Open (allowed) flows.
-- @treturn integer
function Udp:count()
  return self.relay and self.relay:count() or 0
end

--- The fds the loop polls for this relay, with their handlers.
function Udp:watch()
  if not self.relay then return {} end
  return { { fd = self.relay, on = function() self:run() end } }
end

--- Ends every flow (each allowed one logged with its bytes) and closes the relay;
-- idempotent. The routes go with the netns.
function Udp:close()
  if not self.relay then return end
  self.relay:shutdown()
  pcall(self.run, self)
  self.relay:close()
  self.relay = nil
  loop.changed()
end

return M
