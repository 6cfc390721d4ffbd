--- The egress decision: may this sandbox open this connection?
--
-- `decide(ctx, policy)` is pure: no I/O, no events (the `corral.egress` facade emits
-- them). The order, first refusal wins:
--
-- 1. The context must name a port (1-65535) and a destination: `name`, the name the
--    synthetic address maps to, or else `ip`, the address the tenant connected to. An
--    address inside the synthetic ranges that maps to no name is refused: it is never a
--    real destination.
-- 2. With an allowlist, a name must match a name or wildcard entry on that port, and an
--    IP must match an address or network entry on that port (IP entries never grant a
--    name and name entries never grant an IP).
-- 3. An IP destination is checked against `corral.egress.ranges` with `policy.internal`,
--    the matching entries and the host's own addresses (`env.host`): `0.0.0.0/0:443`
--    reaches the Internet, never 10.x, 169.254.169.254 or the host itself, while
--    `10.20.0.0/16:5432`, inside 10/8, does reach 10.20.x. (A name's destination is
--    checked the same way, without entries, once the host has resolved it:
--    `check_resolved`.)
-- 4. With a `decide` hook, the hook is asked, once per connection (or UDP flow), always
--    with a port: it is never asked at DNS time (`resolvable`). **With an allowlist,
--    the hook can only narrow:** it is asked only about connections the list allows, so
--    no hook bug can open what the operator did not write down. **Without an
--    allowlist, the hook is the sole authority** (`network = {decide = fn}` is an
--    allowlist written as code): every valid name then resolves to a synthetic address
--    and the hook decides the connection; a bare IP it allows has passed step 3 with
--    no entry, so a hook alone cannot open a private, loopback or metadata address by IP.
-- 5. Neither list nor hook: refused.
--
-- The protocol is `ctx.protocol` ("tcp" when absent, or "udp" for a datagram flow), and
-- only entries of that protocol grant it. UDP needs an allowlist entry (`udp:…`): a hook
-- alone never opens UDP (a hook written for connections would otherwise start passing
-- datagrams it was never asked about), and with a list it narrows UDP as it narrows TCP,
-- seeing `protocol` in its context.
--
-- The hook runs on a deep copy of the context (plus `entry`, the canonical text of the
-- matching entry, if any) inside a coroutine with a count hook: after `budget`
-- instructions (default 100,000) every further instruction raises, so a loop, even one
-- that catches errors, ends promptly. It answers `true`/`false` or `"allow"`/`"deny"`,
-- optionally followed by a reason string. An error, a yield, an exhausted budget, or
-- any other answer is a deny whose reason says which. Limits: the budget counts Lua
-- instructions, so one long C call (a huge `string.rep`) is not interrupted, and memory
-- is not bounded; the hook is the operator's code, and the budget guards the event loop
-- against its mistakes, not against a hook that removes the count hook itself.
-- @module corral.egress.decision
local allowlist = require "corral.egress.allowlist"
local grammar = require "corral.egress.grammar"
local address = require "corral.egress.address"
local ranges = require "corral.egress.ranges"
local synthetic = require "corral.egress.synthetic"

local M = {}

--- Default instruction budget of a decide hook.
M.DEFAULT_BUDGET = 100000

local REASON_MAX = 200

local function verdict(v, reason, by, entry)
  return { verdict = v, reason = reason, by = by, entry = entry and entry.text }
end

local function deny(reason, by, entry) return verdict("deny", reason, by or "policy", entry) end

local function copy(v, seen)
  if type(v) ~= "table" then return v end
  seen = seen or {}
  if seen[v] then return seen[v] end
  local t = {}
  seen[v] = t
  for k, x in pairs(v) do t[copy(k, seen)] = copy(x, seen) end
  return t
end

local function describe(x)
  if type(x) == "string" then return string.format("%q", x:sub(1, 40)) end
  return type(x) == "table" and "a table" or tostring(x)
end

--- Runs a decide hook under an instruction budget.
-- @tparam function fn the hook
-- @tparam table ctx what it is given (already a copy)
-- @tparam[opt] integer budget instructions (default `DEFAULT_BUDGET`)
-- @tparam[opt] string label the hook's name in reasons ("decide" unless given)
-- @treturn[1] boolean true to allow
-- @treturn string the hook's reason, or why its answer counts as a deny
function M.run_hook(fn, ctx, budget, label)
  budget = budget or M.DEFAULT_BUDGET
  label = label or "decide"
  if math.type(budget) ~= "integer" or budget < 1 then
    return false, label .. " hook budget must be a positive integer, got " .. tostring(budget)
  end
  local co = coroutine.create(fn)
  local exhausted = false
  local function on_count()
    if not exhausted then
      exhausted = true
      -- from here on every instruction raises, so a pcall around a loop cannot outlast it
      debug.sethook(co, on_count, "", 1)
    end
    error("instruction budget exhausted", 0)
  end
  debug.sethook(co, on_count, "", budget)
  local res = table.pack(coroutine.resume(co, ctx))
  local status = coroutine.status(co)
  coroutine.close(co)
  if exhausted then
    return false, string.format("%s hook exceeded its budget of %d instructions", label, budget)
  end
  if not res[1] then return false, label .. " hook failed: " .. tostring(res[2]):sub(1, REASON_MAX) end
  if status ~= "dead" then return false, label .. " hook yielded; it must return an answer" end
  local answer, reason = res[2], res[3]
  if type(reason) ~= "string" then reason = nil else reason = reason:sub(1, REASON_MAX) end
  if answer == true or answer == "allow" then return true, reason or ("allowed by the " .. label .. " hook") end
  if answer == false or answer == "deny" then return false, reason or ("denied by the " .. label .. " hook") end
  return false, string.format("%s hook returned %s; it must return true/false or \"allow\"/\"deny\"", label,
    describe(answer))
end

local function port_list(al, q)
  local seen = {}
  for _, e in ipairs(al:entries()) do
    if allowlist.matches(e, q) then seen[#seen + 1] = grammar.ports_text(e) end
  end
  return table.concat(seen, ",")
end

local PROTO_TEXT = { tcp = "TCP", udp = "UDP" }

-- Why no entry grants a destination on this port and protocol: the ports its own
-- protocol's entries name, else the other protocol's, else that nothing names it.
local function refusal(al, q, where, dest, proto)
  local ports = port_list(al, { name = q.name, ip = q.ip, proto = proto })
  if ports ~= "" then
    return string.format("%s: %s is allowed only on ports %s", where, dest, ports)
  end
  local other = proto == "udp" and "tcp" or "udp"
  ports = port_list(al, { name = q.name, ip = q.ip, proto = other })
  if ports ~= "" then
    return string.format("%s: %s is allowed only for %s (ports %s), not %s", where, dest, PROTO_TEXT[other],
      ports, PROTO_TEXT[proto])
  end
  return string.format("%s: %s is not in the allowlist", where, dest)
end

-- The host's local networks for a check: env.host, or a refusal when it could not be read.
local function host_set(env)
  if type(env) ~= "table" then return {} end
  if env.host_error then return nil, env.host_error end
  return env.host or {}
end

--- Decides one connection.
-- @tparam table ctx `{sandbox =, name? =, ip? = address text, port =, family? =, protocol? = "tcp"|"udp"}`
-- @tparam table policy `{allowlist? = allowlist or list of strings, decide? = function,
-- budget? = integer, internal? = list of CIDRs}` (nil: deny)
-- @tparam[opt] table env `{host = the host's local networks (corral.egress.hostaddr.get()),
-- host_error = why they could not be read (then every IP destination is refused)}`
-- @treturn table `{verdict = "allow"|"deny", reason = string, by =
-- "allowlist"|"hook"|"policy", entry = canonical text of the matching entry or nil}`
function M.decide(ctx, policy, env)
  if type(ctx) ~= "table" then return deny("no connection context") end
  if type(policy) ~= "table" then return deny("no egress policy for this sandbox") end
  local port = ctx.port
  if math.type(port) ~= "integer" or port < 1 or port > 65535 then
    return deny("bad destination port " .. tostring(port))
  end
  local proto = ctx.protocol or "tcp"
  if not PROTO_TEXT[proto] then return deny("bad protocol " .. describe(proto)) end

  local q, dest = { port = port, proto = proto }
  if ctx.name ~= nil then
    local name, why = address.normalize_name(ctx.name)
    if not name then return deny(string.format("bad name %s: %s", describe(ctx.name), why)) end
    q.name, dest = name, name
  elseif ctx.ip ~= nil then
    dest = address.address_text(ctx.ip)
    if not dest then return deny(select(2, address.parse_address(ctx.ip))) end
    if synthetic.is_synthetic(dest) then
      return deny(string.format("%s is a synthetic address that no name maps to", dest))
    end
    q.ip = dest
  else
    return deny("no destination: neither a name nor an address")
  end
  local where = string.format("%s%s port %d", proto == "udp" and "udp to " or "", dest, port)

  local al, entry = policy.allowlist, nil
  if al ~= nil then
    if not allowlist.is_allowlist(al) then
      local parsed, err = allowlist.parse(al)
      if not parsed then return deny("the allowlist is invalid: " .. tostring(err)) end
      al = parsed
    end
    entry = al:match(q)
    if not entry then return deny(refusal(al, q, where, dest, proto), "allowlist") end
  elseif policy.decide == nil then
    return deny(string.format("%s: no allowlist and no decide hook", where))
  elseif proto == "udp" then
    return deny(string.format("%s: UDP is relayed only for udp: allowlist entries (a decide hook alone opens "
      .. "TCP only)", where))
  end
  if q.ip then
    local host, herr = host_set(env)
    if not host then return deny(string.format("%s: %s", where, herr)) end
    local ok, why, unlocked = ranges.check(q.ip, policy.internal,
      { entries = entry and al:match_all(q) or nil, host = host })
    if not ok then return deny(string.format("%s: %s", where, why), entry and "allowlist" or "policy", entry) end
    entry = unlocked or entry
  end

  if policy.decide ~= nil then
    if type(policy.decide) ~= "function" then return deny("the decide hook is not a function") end
    local hctx = copy(ctx)
    hctx.entry = entry and entry.text
    local ok, reason = M.run_hook(policy.decide, hctx, policy.budget)
    return verdict(ok and "allow" or "deny", reason, "hook", entry)
  end
  return verdict("allow", string.format("%s: allowed by %s", where, entry.text), "allowlist", entry)
end

--- Whether the DNS responder should answer a name with a synthetic address: with an
-- allowlist, when a name entry matches it on some port; with only a decide hook, every
-- valid hostname. The hook is never asked at DNS time: no port is known there, and the
-- hook's contract is one call per connection with its port (see the module's comment
-- and docs/boundary.md). Names never leave the host either way.
-- @tparam string name
-- @tparam table policy as for `decide` (nil: no)
-- @treturn[1] boolean true
-- @return[2] nil
-- @treturn[2] string why not
function M.resolvable(name, policy)
  local n, why = address.normalize_name(name)
  if not n then return nil, why end
  if type(policy) ~= "table" then return nil, "no egress policy for this sandbox" end
  local al = policy.allowlist
  if al ~= nil then
    if not allowlist.is_allowlist(al) then
      al = allowlist.parse(al)
      if not al then return nil, "the allowlist is invalid" end
    end
    if al:match({ name = n }) then return true end
    return nil, n .. " is not in the allowlist"
  end
  if type(policy.decide) == "function" then return true end
  return nil, "no allowlist and no decide hook"
end

--- Checks a host-side resolution of an allowed name against the special ranges, the
-- host's own addresses and the policy's `internal` list (see `corral.egress.ranges.check`).
-- @tparam string ip address text
-- @tparam[opt] table policy
-- @tparam[opt] table env as for `decide`
-- @treturn[1] boolean true
-- @return[2] nil
-- @treturn[2] string why not
function M.check_resolved(ip, policy, env)
  local host, herr = host_set(env)
  if not host then return nil, herr end
  local ok, why = ranges.check(ip, policy and policy.internal, { host = host })
  return ok, why
end

return M
