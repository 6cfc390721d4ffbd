--- corral.egress: egress allowlists, decisions and events, for operators and the REPL.
--
-- The policy half of the egress data path. Policies live in the process-wide registry;
-- `allow` and `revoke` apply to the next decision, and `revoke(sb, entry, {cut = true})`
-- (or `recheck`) also resets open connections no longer allowed. `decide` decides one
-- connection and emits its event.
--
--     local egress = require "corral.egress"
--     assert(egress.set(sb, { "pypi.org:443", "*.pythonhosted.org:443" }))
--     egress.allow(sb, "api.example.com:443")
--     egress.revoke(sb, "api.example.com:443", { cut = true }) -- and reset what it allowed
--     egress.subscribe(assert(egress.events.json_lines_writer("/var/log/corral-egress.jsonl")))
--
-- @module corral.egress
local allowlist = require "corral.egress.allowlist"
local grammar = require "corral.egress.grammar"
local decision = require "corral.egress.decision"
local events = require "corral.egress.events"
local hostaddr = require "corral.egress.hostaddr"
local loop = require "corral.egress.loop"
local ranges = require "corral.egress.ranges"
local registry = require "corral.egress.registry"
local synthetic = require "corral.egress.synthetic"

local M = {
  allowlist = allowlist,
  decision = decision,
  events = events,
  hostaddr = hostaddr,
  ranges = ranges,
  synthetic = synthetic,
}

--- The process-wide registry every data plane of this process reads.
M.registry = registry.process

local function sandbox_id(sb)
  if type(sb) == "table" then sb = sb.id end
  if type(sb) ~= "string" or sb == "" then
    error("corral.egress: expected a sandbox (a table with id) or its id, got " .. tostring(sb), 3)
  end
  return sb
end

--- Parses an allowlist (see `corral.egress.allowlist`).
-- @tparam {string,...} list
-- @treturn table the allowlist, or nil and `invalid_argument`
function M.parse(list)
  return allowlist.parse(list)
end

--- Parses one allowlist entry (see `corral.egress.grammar`).
-- @tparam string entry
-- @treturn table the entry, or nil and `invalid_argument`
function M.parse_entry(entry)
  return grammar.parse_entry(entry)
end

--- Sets a sandbox's policy (see `registry:set`).
-- @param sb sandbox or id
-- @param list allowlist, list of entries, or nil
-- @tparam[opt] table opts `{decide =, budget =, internal =}`
-- @treturn table the policy, or nil and `invalid_argument`
function M.set(sb, list, opts)
  return M.registry:set(sandbox_id(sb), list, opts)
end

--- Sets a sandbox's policy from its `network` table (`allow`, `decide`, `budget`, `internal`).
-- @tparam table sb a sandbox with `id` and `network`
-- @treturn table the policy, or nil and `invalid_argument`
function M.configure(sb)
  local net = type(sb) == "table" and sb.network or {}
  return M.registry:set(sandbox_id(sb), net.allow, { decide = net.decide, budget = net.budget,
    internal = net.internal })
end

--- Allows one more destination for a sandbox; applies to the next decision and bumps
-- the policy's epoch (see `corral.egress.registry`).
-- @param sb sandbox or id
-- @tparam string entry
-- @treturn[1] table the entry
-- @return[2] nil
-- @treturn[2] table `invalid_argument` naming the entry, or `cannot_enforce` when the
--   sandbox's ruleset could not follow (the entry is then not added: the previous
--   policy and ruleset stay)
function M.allow(sb, entry)
  return M.registry:allow(sandbox_id(sb), entry)
end

--- Revokes every entry equal to `entry`, for the next decision. With `opts.cut`, open
-- connections are decided again (`recheck`) and those no longer allowed reset.
-- @param sb sandbox or id
-- @tparam string entry
-- @tparam[opt] table opts `{cut = boolean}`
-- @treturn integer entries removed, and with `cut` connections reset; or nil and `invalid_argument`
function M.revoke(sb, entry, opts)
  local id = sandbox_id(sb)
  if opts ~= nil and (type(opts) ~= "table" or (opts.cut ~= nil and type(opts.cut) ~= "boolean")) then
    error("corral.egress.revoke: opts must be a table {cut = boolean}", 2)
  end
  local n, err = M.registry:revoke(id, entry)
  if not n then return nil, err end
  if opts and opts.cut then return n, M.recheck(id) end
  return n
end

--- Decides every open outbound connection and UDP flow of a sandbox again (by
-- destination, without resolving again) and resets both ways the connections no longer
-- allowed, and ends such flows, each a `cut` event.
-- @param sb sandbox or id
-- @treturn integer how many connections and flows were cut
function M.recheck(sb)
  local id = sandbox_id(sb)
  local n = loop.recheck(id)
  for _, plane in ipairs(loop.planes()) do
    if plane.id == id and plane.recheck_udp then n = n + plane:recheck_udp() end
  end
  return n
end

--- A sandbox's live policy, or nil.
-- @param sb sandbox or id
-- @treturn table|nil
function M.policy(sb)
  return M.registry:get(sandbox_id(sb))
end

--- Forgets a sandbox's policy.
-- @param sb sandbox or id
-- @treturn boolean
function M.remove(sb)
  return M.registry:remove(sandbox_id(sb))
end

--- Every registered sandbox (see `registry:list`).
-- @treturn {table,...}
function M.list()
  return M.registry:list()
end

--- Decides one connection and emits its event.
-- @tparam table ctx `{sandbox = sandbox or id, name? =, ip? =, port =, family? =}`
-- @tparam[opt] table policy (default: the sandbox's policy in the registry)
-- @treturn table the verdict `{verdict =, reason =, by =, entry =}`
function M.decide(ctx, policy)
  local id = type(ctx) == "table" and ctx.sandbox
  if type(id) == "table" then id = id.id end
  if policy == nil and type(id) == "string" and id ~= "" then policy = M.registry:get(id) end
  local c = ctx
  if type(ctx) == "table" and ctx.sandbox ~= id then
    c = {}
    for k, v in pairs(ctx) do c[k] = v end
    c.sandbox = id
  end
  local v = decision.decide(c, policy, hostaddr.env())
  local ev = { sandbox = id, kind = "connect", verdict = v.verdict, reason = v.reason, entry = v.entry, by = v.by,
    bytes_up = 0, bytes_down = 0, bytes = 0 }
  if type(ctx) == "table" then
    ev.name, ev.ip, ev.port, ev.family = ctx.name, ctx.ip, ctx.port, ctx.family
  end
  events.emit(ev)
  return v
end

--- Whether the DNS responder should give `name` a synthetic address in this sandbox.
-- @param sb sandbox or id
-- @tparam string name
-- @treturn true, or nil and why not
function M.resolvable(sb, name)
  return decision.resolvable(name, M.registry:get(sandbox_id(sb)))
end

--- The synthetic address of an allowed name in this sandbox.
-- @param sb sandbox or id
-- @tparam string name
-- @tparam[opt="inet"] string family
-- @treturn string text and bytes, or nil and why not
function M.address(sb, name, family)
  local policy = M.registry:get(sandbox_id(sb))
  local ok, why = decision.resolvable(name, policy)
  if not ok then return nil, why end
  return policy.synthetic:address(name, family)
end

--- The name a synthetic address of this sandbox was given to.
-- @param sb sandbox or id
-- @tparam string ip address text
-- @treturn string|nil
function M.lookup(sb, ip)
  local policy = M.registry:get(sandbox_id(sb))
  return policy and policy.synthetic:lookup(ip)
end

--- Checks a host-side resolution against the special ranges, the host's own addresses
-- and the sandbox's `internal` list.
-- @param sb sandbox or id
-- @tparam string ip
-- @treturn true, or nil and why not
function M.check_resolved(sb, ip)
  return decision.check_resolved(ip, M.registry:get(sandbox_id(sb)), hostaddr.env())
end

--- Subscribes to every egress event (see `corral.egress.events`).
-- @tparam function fn
-- @treturn function fn
function M.subscribe(fn)
  return events.subscribe(fn)
end

--- Unsubscribes.
-- @tparam function fn
-- @treturn boolean
function M.unsubscribe(fn)
  return events.unsubscribe(fn)
end

--- The most recent events, oldest first.
-- @tparam[opt] integer n
-- @treturn {table,...}
function M.recent(n)
  return events.recent(n)
end

return M
