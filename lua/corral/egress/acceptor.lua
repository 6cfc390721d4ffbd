--- The acceptor of one sandbox: every redirected TCP connection is decided here. The
-- inbound service relay is `corral.egress.service`.
--
-- Outbound: SO_ORIGINAL_DST → synthetic address → name (or the literal IP) → decide →
-- deny: RST at once; allow: resolve on the host, refuse private/loopback/link-local/
-- CGNAT/metadata results and the host's own addresses unless `network.internal` lists
-- them, connect upstream from the host netns, and hand both ends to the loop's relay.
--
-- Every connection is handled under `pcall`, with tenant input: an error is that
-- connection's RST and a deny event naming the error, never the host's end.
--
-- The name the client meant (`network.sni`, default "match"): an allowed connection to a
-- name's synthetic address is first held until its first flight names its host
-- (`corral.egress.sni_hold`); only then is the upstream connected.
-- @module corral.egress.acceptor
local core = require "corral.core"
local address = require "corral.egress.address"
local decision = require "corral.egress.decision"
local events = require "corral.egress.events"
local fdlimit = require "corral.egress.fdlimit"
local hostaddr = require "corral.egress.hostaddr"
local loop = require "corral.egress.loop"
local refusal = require "corral.egress.refusal"
local relays = require "corral.egress.relays"
local sni_hold = require "corral.egress.sni_hold"
local upstream_proxy = require "corral.egress.upstream_proxy"

local M = {}

--- How long (seconds) the listener rests after this process ran out of fds.
M.FD_REST = 0.05

--- How long (seconds) a connection waits for the host's lookup of its name, and how
-- many of one sandbox's lookups may be under way at once (`core.lookup`: each on a
-- thread of its own, never on the loop that serves every sandbox; the process as a
-- whole runs at most `core.lookup.THREADS_MAX`). A lookup past either is that
-- connection's deny.
M.LOOKUP_TIMEOUT = 10
M.LOOKUPS_MAX = 16

local Acceptor = {}
Acceptor.__index = Acceptor

local deny, deny_after_error = refusal.deny, refusal.after_error

--- The host's own local networks, and, with a link, the sandbox's own address on it
-- (upstream sockets are then made in the sandbox's netns, where that address is local).
-- @tparam[opt] table link the sandbox's routed link (`network.link`)
-- @treturn table env for `corral.egress.decision`
function M.host_env(link)
  local extra = {}
  if link and link.address then
    local b, p = address.parse_cidr((link.address:gsub("/%d+$", "")))
    if b then extra[1] = { bytes = b, prefix = p, text = link.address } end
  end
  return hostaddr.env(extra)
end

--- At most this many decisions are remembered per acceptor (see `Acceptor:decide`).
M.MEMO_MAX = 4096

--- The order a name's addresses are tried in (RFC 8305 section 4): IPv6 first, then the
-- families alternate, each keeping the resolver's order; at most `max` of them.
-- @tparam {string,...} addrs textual addresses
-- @tparam[opt=12] integer max
-- @treturn {string,...}
function M.eyeballs_order(addrs, max)
  local v6, v4 = {}, {}
  for _, a in ipairs(addrs) do
    local list = a:find(":", 1, true) and v6 or v4
    list[#list + 1] = a
  end
  local out, i = {}, 1
  while (v6[i] or v4[i]) and #out < (max or 12) do
    if v6[i] then out[#out + 1] = v6[i] end
    if v4[i] and #out < (max or 12) then out[#out + 1] = v4[i] end
    i = i + 1
  end
  return out
end

--- Binds the acceptor inside netns, on a port the kernel chooses.
-- @tparam userdata netns the sandbox's network namespace
-- @tparam table sandbox `{id =, synth = its synthetic allocator, registry = where its
--   policy lives, resolve_with = the operator's resolver (a function, or name → {addr,...};
--   nil: the host's), link = network.link | nil, mark = the host's mark, max_connections =,
--   idle =, connect_timeout =, upstream_proxy = (corral.egress.upstream_proxy) | nil}`
-- @treturn[1] table the acceptor, with `port`
-- @return[2] nil
-- @treturn[2] string why
function M.new(netns, sandbox)
  local self = setmetatable({ id = sandbox.id, synth = sandbox.synth, registry = sandbox.registry,
    resolve_with = sandbox.resolve_with, link = sandbox.link, mark = sandbox.mark,
    max_connections = sandbox.max_connections, idle = sandbox.idle, connect_timeout = sandbox.connect_timeout,
    attempt_delay = sandbox.attempt_delay, netns = netns, sni = sandbox.sni or sni_hold.SNI_DEFAULT,
    terminator = sandbox.terminator, secrets = sandbox.secrets, upstream_proxy = sandbox.upstream_proxy,
    held = {}, n_held = 0, resolving = {}, n_resolving = 0 }, Acceptor)
  -- as many connections as this process's fds can hold (see corral.egress.fdlimit)
  if self.max_connections then
    self.asked_connections = self.max_connections
    self.max_connections, self.cap_note = fdlimit.fit(self.max_connections)
  end
  self.fd, self.port = core.listen.in_netns(netns, "tcp", "::", 0)
  if not self.fd then return nil, self.port end
  -- any change of a policy (allow and revoke change it in place) forgets every decision
  -- remembered (see memo)
  if self.registry and self.registry.subscribe then
    self.on_policy = self.registry:subscribe(function() self.memo = nil end)
  end
  return self
end

-- The decision env (the host's own networks), the same table for as long as the host's
-- set is (corral.egress.hostaddr reads it again after REFRESH seconds).
function Acceptor:env()
  local base = hostaddr.get() or false
  if self.env_base ~= base or not self.env_cached then
    self.env_cached, self.env_base = M.host_env(self.link), base
  end
  return self.env_cached
end

-- decision.decide and check_resolved are pure: their answers are remembered for as long
-- as the policy is unchanged (the registry tells of every change, and set makes a new
-- table, allow and revoke a new epoch) and the host's set is the same one. Measured
-- here at ~28 and ~40 us a connection before (the host's 38 local networks and the
-- special ranges walked each time). A decide hook is never remembered: it may answer
-- differently each time.
local function memo(self, policy, env)
  local m = self.memo
  if not m or m.policy ~= policy or m.epoch ~= policy.epoch or m.env ~= env or m.n >= M.MEMO_MAX then
    m = { policy = policy, epoch = policy.epoch, env = env, n = 0, decided = {}, resolved = {} }
    self.memo = m
  end
  return m
end

function Acceptor:decide(name, ip, port, policy, env)
  local ctx = { sandbox = self.id, name = name, ip = (not name) and ip or nil, port = port }
  if type(policy) ~= "table" or policy.decide ~= nil then return decision.decide(ctx, policy, env) end
  local m = memo(self, policy, env)
  local key = (name or ip) .. "\0" .. port
  local v = m.decided[key]
  if not v then
    v = decision.decide(ctx, policy, env)
    m.decided[key], m.n = v, m.n + 1
  end
  return v
end

function Acceptor:check_resolved(addr, policy, env)
  local m = memo(self, policy, env)
  local r = m.resolved[addr]
  if not r then
    r = table.pack(decision.check_resolved(addr, policy, env))
    m.resolved[addr], m.n = r, m.n + 1
  end
  return r[1], r[2]
end

-- The host-side addresses for a permitted name: the operator's resolver, else the host's.
-- Answers a non-empty list of strings, or nil and why.
function Acceptor:resolve(name)
  local r, v = self.resolve_with
  if type(r) == "table" then
    v = r[name]
    if not v then return nil, "no address for " .. name .. " in the operator's table" end
  elseif type(r) == "function" then
    local ok, res = pcall(r, name)
    if not ok then return nil, "resolver error: " .. tostring(res):sub(1, 200) end
    v = res
  else
    local err
    v, err = core.lookup.host(name)
    if not v then return nil, err end
  end
  return M.addresses(v)
end

--- A resolver's answer as a non-empty list of strings, or nil and why.
-- @param v a string, a list of strings, or anything a resolver returned
-- @treturn[1] {string,...}
-- @return[2] nil
-- @treturn[2] string why
function M.addresses(v)
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

--- Accepts one redirected connection and decides it. Whatever goes wrong after the
-- accept is this connection's RST and deny event, never an error in the loop.
-- @tparam[opt] string port_key the sandbox's source-port slice (see core.relay)
function Acceptor:accept(port_key)
  local client, msg, errno = core.sock.accept(self.fd, 0)
  if not client then
    if relays.out_of_fds(errno) then
      -- The connection stays in the listen queue; the listener rests a moment rather
      -- than wake the loop at once again for what it cannot take.
      self.resting = core.clock.monotime() + M.FD_REST
      loop.changed()
      events.emit({ sandbox = self.id, kind = "connect", verdict = "deny", bytes = 0, by = "policy",
        reason = relays.fd_shortage(msg) })
    end
    return
  end
  local ctx = { sandbox = self.id, kind = "connect" }
  local ok, err = pcall(self.connect, self, client, ctx, port_key)
  if not ok then deny_after_error(client, ctx, err) end
end

function Acceptor:connect(client, ctx, port_key)
  local ip, port = core.sock.original_dst(client)
  ctx.ip, ctx.port = ip, port
  if not ip then return deny(client, ctx, "no original destination: " .. tostring(port)) end
  -- Loopback destinations are never redirected (the ruleset returns them), so a
  -- loopback original destination is a tenant dialling the acceptor itself (measured:
  -- SO_ORIGINAL_DST then reads 127.0.0.1:<acceptor port>, not ENOENT). Never relayed,
  -- whatever the allowlist says.
  if ip:match("^127%.") or ip == "::1" or ip:match("^::ffff:127%.") then
    return deny(client, ctx, "direct connection to the acceptor")
  end
  local name = self.synth:lookup(ip)
  ctx.name = name
  local policy = self.registry:get(self.id)
  local env = self:env()
  local verdict = self:decide(name, ip, port, policy, env)
  if verdict.verdict ~= "allow" then
    ctx.entry = verdict.entry
    return deny(client, ctx, verdict.reason, verdict.by)
  end
  if relays.count(self.id) + self.n_held + self.n_resolving >= self.max_connections then
    return deny(client, ctx, "connection cap reached (" .. self.max_connections .. (self.cap_note and
      (", lowered from " .. self.asked_connections .. ": " .. self.cap_note) or "") .. ")")
  end
  if name and self.sni ~= "off" then
    -- held until its first flight names its host (see corral.egress.sni_hold)
    return sni_hold.hold(self, client, { ctx = ctx, name = name, ip = ip, port = port, port_key = port_key,
      verdict = verdict, policy = policy, env = env })
  end
  return self:relay(client, ctx, name, ip, port, port_key, verdict, policy, env)
end

--- The earliest moment a held connection's wait, or a lookup's, ends (monotonic
-- seconds), or nil.
function Acceptor:deadline()
  local d = self.resting
  for _, h in pairs(self.held) do
    if not d or h.deadline < d then d = h.deadline end
  end
  for _, w in pairs(self.resolving) do
    if not d or w.deadline < d then d = w.deadline end
  end
  return d
end

-- Resolves an allowed connection's name on the host and hands both ends to the relay;
-- with `guard` (the held state of a silent client) the client's bytes stay held until
-- `corral.egress.sni_hold.check_held` passes them. The host's own resolver answers later
-- (`resolve_later`); the operator's (a table, or a function of its Lua) at once.
function Acceptor:relay(client, ctx, name, ip, port, port_key, verdict, policy, env, guard)
  local w = { client = client, ctx = ctx, name = name, ip = ip, port = port, port_key = port_key,
    verdict = verdict, policy = policy, env = env, guard = guard }
  if name and self.resolve_with == nil then return self:resolve_later(w) end
  local addrs, rerr
  if name then addrs, rerr = self:resolve(name) end
  return self:upstream(w, addrs, rerr)
end

-- Starts the host's lookup of w.name on a thread of its own; the loop polls the pool
-- and `resolved` carries the connection on, or `watch` denies it past LOOKUP_TIMEOUT.
function Acceptor:resolve_later(w)
  local why = "cannot resolve " .. w.name .. " on the host: "
  if not self.pool then
    local pool, perr = core.lookup.pool()
    if not pool then return deny(w.client, w.ctx, why .. tostring(perr)) end
    self.pool = pool
  end
  local id, err, errno = self.pool:submit(w.name, M.LOOKUPS_MAX)
  if not id then
    return deny(w.client, w.ctx, why .. (errno == core.errno.EAGAIN and string.format("too many lookups under "
      .. "way (%d for a sandbox, %d for corral)", M.LOOKUPS_MAX, core.lookup.THREADS_MAX) or tostring(err)))
  end
  w.deadline, w.epoch = core.clock.monotime() + M.LOOKUP_TIMEOUT, type(w.policy) == "table" and w.policy.epoch
  self.resolving[id] = w
  self.n_resolving = self.n_resolving + 1
  loop.changed()
end

-- The pool has finished lookups: each waiting connection goes on (or is denied); the
-- results of lookups no connection waits for any more (timed out) are dropped.
function Acceptor:resolved()
  for _, r in ipairs(self.pool:collect()) do
    local w = self.resolving[r.id]
    if w then
      self.resolving[r.id] = nil
      self.n_resolving = self.n_resolving - 1
      loop.changed()
      local ok, err = pcall(self.after_lookup, self, w, r)
      if not ok then deny_after_error(w.client, w.ctx, err) end
    end
  end
end

-- A lookup's result r for the waiting connection w. A policy changed meanwhile (a revoke
-- while the host looked the name up) decides the connection again: what it no longer
-- allows never reaches the relay.
function Acceptor:after_lookup(w, r)
  local policy = self.registry:get(self.id)
  if policy ~= w.policy or (type(policy) == "table" and policy.epoch ~= w.epoch) then
    local env = self:env()
    local v = self:decide(w.name, w.ip, w.port, policy, env)
    if v.verdict ~= "allow" then return deny(w.client, w.ctx, v.reason, v.by) end
    w.verdict, w.policy, w.env = v, policy, env
  end
  local addrs, rerr
  if r.addrs then addrs, rerr = M.addresses(r.addrs) else rerr = w.name .. ": " .. tostring(r.err) end
  return self:upstream(w, addrs, rerr)
end

-- With the name's addresses (or why there are none), checks them and hands both ends of
-- the connection w to the relay.
function Acceptor:upstream(w, addrs, rerr)
  local client, ctx, name, ip, port = w.client, w.ctx, w.name, w.ip, w.port
  local policy, env, guard = w.policy, w.env, w.guard
  local upstream = ip
  if name then
    if not addrs then
      return deny(client, ctx, "cannot resolve " .. name .. " on the host: " .. tostring(rerr))
    end
    -- Every address the name resolved to that the policy admits is raced (RFC 8305), as
    -- the client itself would have tried them: one refusing address is not the name's end.
    local good_addrs, why = {}, nil
    for _, a in ipairs(addrs) do
      local good, r = self:check_resolved(a, policy, env)
      if good then good_addrs[#good_addrs + 1] = a else why = a .. ": " .. tostring(r) end
    end
    if #good_addrs == 0 then return deny(client, ctx, "resolved into a refused range (" .. why .. ")") end
    upstream = M.eyeballs_order(good_addrs)
  end
  ctx.upstream = type(upstream) == "table" and upstream[1] or upstream
  ctx.upstreams = type(upstream) == "table" and upstream or nil
  -- A host a secret is bound to: TLS is terminated here and the relay carries the
  -- terminator's own TLS to the server (corral.egress.terminated).
  if self.terminator and self.terminator:bound(name, port) then
    local inner, terr = self.terminator:terminate(client, name, port)
    if not inner then
      -- the terminator took the client and reset it
      ctx.verdict, ctx.reason, ctx.bytes, ctx.by = "deny", "TLS termination: " .. tostring(terr), 0, "policy"
      return events.emit(ctx)
    end
    client, guard, ctx.terminated = inner, nil, true
  end
  -- Upstream from the host's netns, or — with a link — from the sandbox's own netns
  -- through a mark-checked socket (mark written, read back and compared; no fd otherwise),
  -- which the ruleset's mark rules exempt from the redirect.
  -- The connection joins its destination's relay (`corral.egress.relays`), which is what
  -- `recheck` cuts when the policy stops allowing the destination.
  local to, to_port, preface = upstream, port, nil
  if self.upstream_proxy then
    to, to_port, preface = upstream_proxy.route(self.upstream_proxy, upstream, port)
    ctx.proxy = self.upstream_proxy.text
  end
  local id, cerr, cerrno = relays.connect(client, to, to_port, {
    timeout = self.connect_timeout, idle = self.idle, key = self.id, max_per_key = self.max_connections,
    port_key = w.port_key, attempt_delay = self.attempt_delay, preface = preface,
    mark = self.link and self.mark or nil, netns = self.link and self.netns or nil,
    on_held = guard and function(cid) sni_hold.check_held(self, cid, guard) end or nil },
    { name = name, ip = (not name) and ip or nil, port = port }, ctx)
  if not id then
    return deny(client, ctx, relays.out_of_fds(cerrno) and relays.fd_shortage(cerr)
      or ("upstream: " .. tostring(cerr)))
  end
  -- the loop holds ctx from here: its end is logged as this decision, with its bytes
  local v = w.verdict
  ctx.verdict, ctx.reason, ctx.entry, ctx.bytes, ctx.by = "allow", v.reason, v.entry, 0, v.by
  events.emit(ctx)
end

--- The fds the loop polls for this acceptor, with their handlers. It changes only with
-- `corral.egress.loop.changed`, or at `deadline` (a held connection's wait, the rest).
-- @tparam[opt] string port_key passed to each `accept`
function Acceptor:watch(port_key)
  local now = core.clock.monotime()
  if self.resting and now >= self.resting then self.resting = nil end
  local w = {}
  if not self.resting then w[1] = { fd = self.fd, on = function() self:accept(port_key) end } end
  for client, h in pairs(self.held) do
    if now >= h.deadline then
      local ok, err = pcall(sni_hold.check, self, client, true)
      if not ok then
        if self.held[client] then
          self.held[client], self.n_held = nil, self.n_held - 1
          loop.changed()
        end
        deny_after_error(client, h.ctx, err)
      end
    else
      w[#w + 1] = { fd = client, conn = true, owner = self.id, on = function() sni_hold.check(self, client) end }
    end
  end
  for id, r in pairs(self.resolving) do
    if now >= r.deadline then
      self.resolving[id], self.n_resolving = nil, self.n_resolving - 1
      loop.changed()
      pcall(deny, r.client, r.ctx, string.format("cannot resolve %s on the host: no answer within %g s", r.name,
        M.LOOKUP_TIMEOUT))
    end
  end
  if self.n_resolving > 0 then w[#w + 1] = { fd = self.pool, on = function() self:resolved() end } end
  return w
end

--- Closes the listener and resets the connections still held; idempotent.
function Acceptor:close()
  for client in pairs(self.held) do pcall(core.sock.reset, client) end
  self.held, self.n_held = {}, 0
  for _, w in pairs(self.resolving) do pcall(core.sock.reset, w.client) end
  self.resolving, self.n_resolving = {}, 0
  if self.pool then self.pool:close(); self.pool = nil end
  loop.changed()
  if self.on_policy then
    self.registry:unsubscribe(self.on_policy)
    self.on_policy = nil
  end
  if self.fd then self.fd:close(); self.fd = nil end
end

return M
