--- The registry: each sandbox's egress policy, in the host process's memory.
--
-- A tenant has no path to it. A policy is a live table `{sandbox =, allowlist =,
-- decide =, budget =, internal =, synthetic =}`; `allow` and `revoke` change its
-- allowlist in place, so the next `decide` (which reads the policy afresh) sees the
-- change. Connections already relayed are not affected here: the registry holds policy
-- only; `corral.egress.revoke(sb, entry, {cut = true})` and `corral.egress.recheck` re-decide
-- and reset them on the data plane (`corral.egress.loop.recheck`). Whoever must follow a
-- change (a plane's ruleset) subscribes; the registry calls no module by name.
--
-- Epochs: each sandbox's policy carries `epoch`, 1 when first set and one more at every
-- change that took effect (`set`, `allow`, `revoke`), kept across `set`; every event
-- (`corral.egress.events`) carries the epoch its sandbox's policy had when it happened,
-- so a log line says which version of the policy decided it. A subscriber may refuse a
-- change by returning `nil, err` (a plane whose ruleset could not be updated; one that
-- raises refuses nothing): `set`
-- and `allow` are then undone — the previous policy, which the unchanged ruleset still
-- enforces, stays, with its epoch — and answer `nil, err`. A revocation is never
-- undone: it only narrows, and every connection is decided with the narrower policy
-- (the subscriber logs that its ruleset still lets the port reach the acceptor).
-- @module corral.egress.registry
local errors = require "corral.errors"
local allowlist = require "corral.egress.allowlist"
local grammar = require "corral.egress.grammar"
local decision = require "corral.egress.decision"
local hostaddr = require "corral.egress.hostaddr"
local ranges = require "corral.egress.ranges"
local synthetic = require "corral.egress.synthetic"

local M = {}

local Registry = {}
Registry.__index = Registry

--- An empty registry.
-- @treturn table
function M.new()
  return setmetatable({ policies = {}, subscribers = {}, epochs = {} }, Registry)
end

local function check_id(id)
  if type(id) ~= "string" or id == "" then
    error("registry: sandbox id must be a non-empty string, got " .. tostring(id), 3)
  end
end

--- Sets a sandbox's policy, replacing any previous one (its synthetic allocator is kept,
-- so names keep their addresses).
-- @tparam string id the sandbox id
-- @param list an allowlist (from `corral.egress.allowlist`), a list of entry strings,
-- or nil (then `opts.decide` is the sole authority, or everything is denied)
-- @tparam[opt] table opts `{decide = function, budget = integer, internal = {cidr,...},
-- synthetic_limit = integer}`
-- @treturn[1] table the policy
-- @return[2] nil
-- @treturn[2] table `invalid_argument` naming the field or entry
function Registry:set(id, list, opts)
  check_id(id)
  opts = opts or {}
  local al = list
  if al ~= nil and not allowlist.is_allowlist(al) then
    local err
    al, err = allowlist.parse(al)
    if not al then return nil, err end
  end
  if opts.decide ~= nil and type(opts.decide) ~= "function" then
    return nil, errors.invalid_argument("network.decide", "must be a function, got " .. type(opts.decide))
  end
  if opts.budget ~= nil and (math.type(opts.budget) ~= "integer" or opts.budget < 1) then
    return nil, errors.invalid_argument("network.budget", "must be a positive integer (instructions)")
  end
  local internal, ierr = ranges.parse_internal(opts.internal)
  if not internal then return nil, ierr end
  local old = self.policies[id]
  local policy = {
    sandbox = id,
    allowlist = al,
    decide = opts.decide,
    budget = opts.budget,
    internal = internal,
    synthetic = old and old.synthetic or synthetic.new(id, { limit = opts.synthetic_limit }),
    -- the epoch moves once the change has taken effect: what subscribers log while
    -- following it happened under the previous policy
    epoch = old and old.epoch or (self.epochs[id] or 0),
  }
  self.policies[id] = policy
  local ok, err = self:changed(id)
  if not ok and old then
    -- undone: the previous policy is what the (unchanged) ruleset enforces
    self.policies[id] = old
    self:changed(id)
    return nil, err
  end
  policy.epoch = policy.epoch + 1
  self.epochs[id] = policy.epoch
  return policy
end

--- A sandbox's policy epoch now (0 when it has no policy).
-- @tparam string id
-- @treturn integer
function Registry:epoch(id)
  local p = self.policies[id]
  return p and p.epoch or 0
end

--- Calls fn(id, policy) after every change of a sandbox's policy through this registry
-- (`set`, `allow`, `revoke`), for whoever must follow it (a data plane's ruleset).
-- Subscribing the same function twice has no effect.
-- @tparam function fn
-- @treturn function fn (the token for `unsubscribe`)
function Registry:subscribe(fn)
  if type(fn) ~= "function" then error("registry: subscribe expects a function, got " .. type(fn), 2) end
  for _, s in ipairs(self.subscribers) do
    if s == fn then return fn end
  end
  self.subscribers[#self.subscribers + 1] = fn
  return fn
end

--- Stops calling fn.
-- @tparam function fn
-- @treturn boolean whether it was subscribed
function Registry:unsubscribe(fn)
  for i, s in ipairs(self.subscribers) do
    if s == fn then
      table.remove(self.subscribers, i)
      return true
    end
  end
  return false
end

-- Tells every subscriber, each protected: one that raises neither undoes the change nor
-- keeps the others from hearing of it (a bug in a subscriber is not a refusal). A copy
-- is walked, so a subscriber may unsubscribe. Answers true, or false and the first
-- refusal (a subscriber that answered nil, err).
function Registry:changed(id)
  local policy = self.policies[id]
  local first
  for _, fn in ipairs(table.move(self.subscribers, 1, #self.subscribers, 1, {})) do
    local ok, res, err = pcall(fn, id, policy)
    if first == nil and ok and res == nil and err ~= nil then first = err end
  end
  if first == nil then return true end
  if type(first) ~= "table" then first = errors.cannot_enforce("network_restriction", tostring(first)) end
  return false, first
end

--- Allows one more destination for a sandbox (creating its policy if it has none).
-- @tparam string id
-- @tparam string entry as in an allowlist
-- @treturn[1] table the entry
-- @return[2] nil
-- @treturn[2] table `invalid_argument` naming the entry and the reason
function Registry:allow(id, entry)
  check_id(id)
  local e, err = grammar.parse_entry(entry)
  if not e then return nil, err end
  local policy = self.policies[id]
  if not policy then
    policy = assert(self:set(id, allowlist.new()))
  elseif policy.allowlist == nil then
    policy.allowlist = allowlist.new()
  end
  local before = #policy.allowlist
  local added, aerr = policy.allowlist:add(e)
  if added and #policy.allowlist > before then
    local ok, cerr = self:changed(id)
    if not ok then
      policy.allowlist:remove(added)
      self:changed(id)
      return nil, cerr
    end
    policy.epoch = policy.epoch + 1
    self.epochs[id] = policy.epoch
  end
  return added, aerr
end

--- Removes every entry equal to `entry` (same canonical text) from a sandbox's list.
-- @tparam string id
-- @tparam string entry
-- @treturn[1] integer how many were removed (0 when the sandbox has no list)
-- @return[2] nil
-- @treturn[2] table `invalid_argument` naming the entry
function Registry:revoke(id, entry)
  check_id(id)
  local e, err = grammar.parse_entry(entry)
  if not e then return nil, err end
  local policy = self.policies[id]
  if not policy or not policy.allowlist then return 0 end
  local n = policy.allowlist:remove(e)
  if n and n > 0 then
    self:changed(id)
    policy.epoch = policy.epoch + 1
    self.epochs[id] = policy.epoch
  end
  return n
end

--- A sandbox's live policy.
-- @tparam string id
-- @treturn table|nil
function Registry:get(id)
  check_id(id)
  return self.policies[id]
end

--- Forgets a sandbox.
-- @tparam string id
-- @treturn boolean whether it was registered
function Registry:remove(id)
  check_id(id)
  local had = self.policies[id] ~= nil
  self.policies[id] = nil
  return had
end

--- Every registered sandbox, sorted by id.
-- @treturn {table,...} `{sandbox =, entries = {canonical text,...}|nil, decide = boolean,
-- internal = {text,...}, names = number of synthetic addresses given}`
function Registry:list()
  local out = {}
  for id, p in pairs(self.policies) do
    local internal = {}
    for i, n in ipairs(p.internal) do internal[i] = n.text end
    out[#out + 1] = { sandbox = id, entries = p.allowlist and p.allowlist:texts(), decide = p.decide ~= nil,
      internal = internal, names = p.synthetic:count() }
  end
  table.sort(out, function(a, b) return a.sandbox < b.sandbox end)
  return out
end

--- Decides a connection with the sandbox's current policy (`ctx.sandbox` is its id) and
-- the host's own addresses, as the data plane does.
-- @tparam table ctx as for `corral.egress.decision.decide`
-- @treturn table the verdict
function Registry:decide(ctx)
  local id = type(ctx) == "table" and ctx.sandbox
  local policy = type(id) == "string" and self.policies[id] or nil
  return decision.decide(ctx, policy, hostaddr.env())
end

--- The process's registry: the one `corral.egress` serves and every data plane reads.
M.process = M.new()

return M
