--- The conformance suite: every guarantee a mechanism claims, shown by a breach stopped.
--
-- Each check makes ONE breach attempt from inside a sandbox provisioned through the public
-- life cycle, then a control in the same sandbox that must succeed (docs/architecture.md,
-- invariant 2). Outcomes: `held`, `breached` (with evidence the tenant could not forge),
-- `unavailable` (the guarantee cannot be shown here, and why), `void` (the control failed,
-- so the refusal distinguished nothing). Liveness is never probed before the attempt: a
-- mechanism that lets everything through is breached, never unavailable.
-- @module corral.conformance
local core = require "corral.core"
local leftovers = require "corral.leftovers"
local mechanism = require "corral.mechanism"
local sandbox = require "corral.sandbox"
local world = require "corral.conformance.world"

local M = {}

--- The guarantee groups, in report order; each is `corral.conformance.<group>`.
M.GROUPS = { "filesystem", "credentials", "process", "privilege", "resources", "network", "egress",
             "secrets", "cross_sandbox" }

--- The four outcomes.
M.OUTCOMES = { "held", "breached", "unavailable", "void" }

--- A random hex token (from the kernel's generator).
-- @treturn string 24 hex digits
M.token = world.token

-- The name of a check's scratch (its maker's pid captured); the dialer a box runs.
M.SCRATCH_PATTERN, M.DIAL = world.SCRATCH_PATTERN, world.DIAL

-- What the mechanism claims (constructs plus requires), asked with limits and a network set.
local function claims(mech)
  local sb = sandbox.new({ id = "claims", storage_root = leftovers.base(),
    limits = { memory = "64M", pids = 16, cpu = 0.5, disk = "64M" }, network = { allow = { "claims.test:1" } } })
  local set = { constructed = {}, required = {} }
  for _, fn in ipairs({ "constructed", "required" }) do
    local f = mech[fn .. "_capabilities"]
    if f then
      local ok, list = pcall(f, sb)
      if ok and type(list) == "table" then
        for _, c in ipairs(list) do set[fn][c] = true end
      end
    end
  end
  return set
end

local function result(check, outcome, attempt, control, detail)
  return { id = check.id, group = check.group, outcome = outcome, guarantee = check.guarantee,
           attempt = attempt or check.attempt, control = control or check.control, detail = detail or "" }
end

-- A check's one outcome: evidence first, then a target that cannot be shown, then the control.
local function judge(check, seen)
  if type(seen) ~= "table" then return result(check, "void", nil, nil, "check returned nothing") end
  if seen.evidence then return result(check, "breached", seen.attempt, seen.control, seen.evidence) end
  if seen.unavailable then return result(check, "unavailable", seen.attempt, seen.control, seen.unavailable) end
  if not seen.control_ok then
    return result(check, "void", seen.attempt, seen.control, seen.control_detail or "the control failed")
  end
  return result(check, "held", seen.attempt, seen.control, seen.control_detail or "")
end

local function run_check(check, mech, claimed, opts)
  for _, cap in ipairs(check.needs or {}) do
    if not (claimed.constructed[cap] or claimed.required[cap]) then
      local why = type(mech.OMITTED) == "table" and mech.OMITTED[cap]
      return result(check, "unavailable", nil, nil, "the mechanism does not claim " .. cap ..
        (why and (": " .. why) or " (not in its constructed_capabilities)"))
    end
  end
  for _, tool in ipairs(check.tools or {}) do
    if not world.World.tool(tool) then
      return result(check, "unavailable", nil, nil, "no " .. tool .. " in the runtime to attempt it with")
    end
  end
  local w, err = world.new(mech, opts)
  if not w then return result(check, "void", nil, nil, "cannot make a storage root: " .. tostring(err)) end
  w.tools = check.tools
  local ok, seen = xpcall(check.run, debug.traceback, w, opts)
  w:close()
  if w.stopped then return nil, w.stopped end
  if not ok then return result(check, "void", nil, nil, "check error: " .. tostring(seen)) end
  if type(seen) == "table" and not seen.evidence and w.missing then
    return result(check, "unavailable", seen.attempt, seen.control, "no " .. table.concat(w.missing, ", ") ..
      " inside the sandbox to attempt it with (a refusal by a missing tool distinguishes nothing)")
  end
  -- A sandbox the gate refused shows nothing: the capability is absent here.
  if type(seen) == "table" and seen.refused then
    local e = seen.refused
    if type(e) == "table" and e.code == "cannot_enforce" then
      return result(check, "unavailable", nil, nil, "absent on this host: " .. tostring(e))
    end
    return result(check, "void", nil, nil, "could not provision: " .. tostring(e))
  end
  return judge(check, seen)
end

--- Every check of a group, in order.
-- @tparam string group one of `GROUPS`
-- @treturn {table,...} `{id =, group =, guarantee =, attempt =, control =, needs =, run =}`
function M.checks(group)
  local list = require("corral.conformance." .. group)
  for _, c in ipairs(list) do c.group = group end
  return list
end

--- Every check id with its guarantee, in report order.
-- @treturn {table,...} `{id =, group =, guarantee =}`
function M.ids()
  local out = {}
  for _, g in ipairs(M.GROUPS) do
    for _, c in ipairs(M.checks(g)) do out[#out + 1] = { id = c.id, group = g, guarantee = c.guarantee } end
  end
  return out
end

--- The census of a list of results: each outcome counted per group and overall.
-- @tparam {table,...} results
-- @treturn table `{groups = {[group] = counts}, held =, breached =, unavailable =, void =, total =}`
function M.census(results)
  local c = { groups = {}, held = 0, breached = 0, unavailable = 0, void = 0, total = 0 }
  for _, r in ipairs(results) do
    local g = c.groups[r.group]
    if not g then
      g = { held = 0, breached = 0, unavailable = 0, void = 0, total = 0 }
      c.groups[r.group] = g
    end
    g[r.outcome] = g[r.outcome] + 1
    g.total = g.total + 1
    c[r.outcome] = c[r.outcome] + 1
    c.total = c.total + 1
  end
  return c
end

--- Runs the suite against a mechanism.
-- @param which the mechanism: a built-in name, a path to a .lua file, or a table
-- @tparam[opt] table opts `only` (groups), `ids` (a set), `credentials` (probe hook), `progress`,
--   `signals` (a core.signal.fd the caller holds: one that arrives ends the check running,
--   its sandboxes, targets and scratch removed, and the run with it)
-- @treturn table report `{mechanism =, results =, census =, seconds =, planned =, stopped = signal?}`
--   (a stopped run's results are the checks that ended before the signal), or nil and an error
function M.run(which, opts)
  opts = opts or {}
  local mech, err = mechanism.load(which)
  if not mech then return nil, err end
  local groups = opts.only or M.GROUPS
  if type(groups) == "string" then groups = { groups } end
  local known = {}
  for _, g in ipairs(M.GROUPS) do known[g] = true end
  local list = {}
  for _, g in ipairs(groups) do
    if not known[g] then
      return nil, require("corral.errors").invalid_argument("group", "no group " .. tostring(g) ..
        " (" .. table.concat(M.GROUPS, ", ") .. ")")
    end
    for _, c in ipairs(M.checks(g)) do
      if not opts.ids or opts.ids[c.id] then list[#list + 1] = c end
    end
  end
  world.sweep()
  local t0 = core.clock.monotime()
  local claimed = claims(mech)
  local results, stopped = {}, nil
  for i, c in ipairs(list) do
    stopped = opts.signals and core.signal.read(opts.signals)
    if stopped then break end
    local r, sig = run_check(c, mech, claimed, opts)
    if not r then
      stopped = sig
      break
    end
    results[i] = r
    if opts.progress then opts.progress(r, i, #list) end
  end
  local name = type(which) == "string" and which or (mech.name or "table")
  return { mechanism = name, results = results, census = M.census(results), seconds = core.clock.monotime() - t0,
           planned = #list, stopped = stopped or nil }
end

M.World = world.World

return setmetatable(M, { __call = function(_, ...) return M.run(...) end })
