--- The mechanism behaviour: how a sandbox is built, as a plain Lua table.
--
-- Required callbacks: provision, start, exec, stop, destroy, status. Optional: address
-- (→ true, nil | "host:port"), required_capabilities(sb), constructed_capabilities(sb).
-- Any table, or a .lua file returning one, is a mechanism; built in: native, bwrap, oci.
--
-- Returns (each may instead fail with `nil, err`, err a corral.errors error):
-- provision/start/stop/destroy → true; exec → `{code = 0..255, how = "exited"|"killed"?,
-- limit = "wall"|"memory"?, usage = table?, error = string?}`; status → "absent" |
-- "provisioned" | "running" | "stopped". `call` checks every result against this and
-- names a broken mechanism.
--
-- The gate: a sandbox flag the mechanism neither constructs nor asks the host for is
-- refused by name (`--memory` needs resource_limits); what a mechanism requires, minus
-- what it constructs itself, is asked of the host probe; a refusal names the absent
-- capability. It never fails open: a probe that errors, or a capability nobody can
-- establish, refuses. Around any mechanism `corral run` applies --wall, the forwarded
-- signals (corral.mechanism.watch) and the environment filter, and a destroy that fails
-- makes it exit 122 (TEARDOWN). The full contract, with what the host applies and what
-- the mechanism must construct: docs/mechanisms.md, `corral help mechanisms`, and two
-- worked examples in scripts/examples/.
-- @module corral.mechanism
local errors = require "corral.errors"
local probe = require "corral.probe"

local M = {}

M.REQUIRED = { "provision", "start", "exec", "stop", "destroy", "status" }
M.OPTIONAL = { "address", "required_capabilities", "constructed_capabilities" }

-- What a file-loaded mechanism is called in messages: its file's name.
local labels = setmetatable({}, { __mode = "k" })

M.BUILTIN = { native = "corral.mechanism.native", bwrap = "corral.mechanism.bwrap",
              oci = "corral.mechanism.oci" }

--- Whether `mech` is built in (the host's own code, which applies --wall and forwards
-- signals itself).
-- @tparam table mech
-- @treturn boolean
function M.is_builtin(mech)
  -- by its own name first: only the built-in of that name is loaded to compare
  local module = type(mech) == "table" and M.BUILTIN[mech.name]
  if not module then return false end
  return rawequal(require(module), mech)
end

--- Checks a table against the behaviour.
-- @tparam table mech
-- @treturn table mech, or nil and invalid_argument naming every missing callback
function M.check(mech)
  if type(mech) ~= "table" then
    return nil, errors.invalid_argument("mechanism", "must be a table, got " .. type(mech))
  end
  local missing = {}
  for _, name in ipairs(M.REQUIRED) do
    if type(mech[name]) ~= "function" then missing[#missing + 1] = name end
  end
  for _, name in ipairs(M.OPTIONAL) do
    if mech[name] ~= nil and type(mech[name]) ~= "function" then
      return nil, errors.invalid_argument("mechanism", name .. " must be a function when present")
    end
  end
  if #missing > 0 then
    return nil, errors.invalid_argument("mechanism", "missing callbacks: " .. table.concat(missing, ", "))
  end
  return mech
end

--- Loads a mechanism by built-in name or .lua file, or checks a table given directly.
-- @param name_or_path string or table
-- @treturn table the mechanism, or nil and an error
function M.load(name_or_path)
  if type(name_or_path) == "table" then return M.check(name_or_path) end
  if type(name_or_path) ~= "string" then
    return nil, errors.invalid_argument("mechanism", "must be a name, a path or a table")
  end
  local module = M.BUILTIN[name_or_path]
  if module then return M.check(require(module)) end
  if not name_or_path:match("%.lua$") then
    return nil, errors.invalid_argument("mechanism", "no built-in mechanism " .. name_or_path ..
      " (native, bwrap, oci) and not a .lua file")
  end
  local chunk, err = loadfile(name_or_path, "t")
  if not chunk then return nil, errors.invalid_argument("mechanism", err) end
  local ok, mech = pcall(chunk)
  if not ok then return nil, errors.invalid_argument("mechanism", name_or_path .. ": " .. tostring(mech)) end
  local checked, cerr = M.check(mech)
  if not checked then
    return nil, errors.invalid_argument("mechanism " .. name_or_path:match("[^/]*$"), cerr.detail)
  end
  labels[checked] = labels[checked] or name_or_path:match("[^/]*$")
  return checked
end

--- The name a broken mechanism is reported by: its file's name, its `name`, or "(table)".
-- @tparam table mech
-- @treturn string
function M.label(mech)
  return labels[mech] or (type(mech) == "table" and type(mech.name) == "string" and mech.name) or "(table)"
end

-- A broken mechanism is the --mechanism argument's fault: reported by name, exit 2.
local function broken(mech, detail)
  return errors.invalid_argument("mechanism " .. M.label(mech), detail)
end

local STATUSES = { absent = true, provisioned = true, running = true, stopped = true }
local HOWS = { exited = true, killed = true }
local LIMITS = { wall = true, memory = true }

-- Each callback's result shape per the contract: nil when `r` conforms, else what is wrong.
local SHAPES = {}
local function truthy(r) if r ~= true then return "returned " .. type(r) .. " instead of true" end end
SHAPES.provision, SHAPES.start, SHAPES.stop, SHAPES.destroy = truthy, truthy, truthy, truthy
function SHAPES.status(r)
  if not STATUSES[r] then
    return "returned " .. (type(r) == "string" and string.format("%q", r) or type(r)) ..
      " instead of absent, provisioned, running or stopped"
  end
end
function SHAPES.exec(r)
  if type(r) ~= "table" then return "returned " .. type(r) .. " instead of a result table" end
  if math.type(r.code) ~= "integer" then return "returned a table without code (an integer exit status)" end
  if r.code < 0 or r.code > 255 then return "returned code " .. r.code .. ", outside 0-255" end
  if r.how ~= nil and not HOWS[r.how] then return "returned how = " .. tostring(r.how) .. " (exited or killed)" end
  if r.limit ~= nil and not LIMITS[r.limit] then
    return "returned limit = " .. tostring(r.limit) .. " (wall or memory)"
  end
  if r.error ~= nil and type(r.error) ~= "string" then return "returned error as " .. type(r.error) end
  if r.usage ~= nil and type(r.usage) ~= "table" then return "returned usage as " .. type(r.usage) end
end

--- Calls a callback of `mech` and checks its result against the contract; one that
-- raises, returns nil without an error, or the wrong shape is reported as
-- `invalid_argument("mechanism NAME", …)`, never passed on.
-- @tparam table mech a checked mechanism
-- @tparam string name the callback
-- @param ... its arguments
-- @return the value, or `nil, err`
function M.call(mech, name, ...)
  local res = table.pack(pcall(mech[name], ...))
  if not res[1] then return nil, broken(mech, name .. " raised: " .. tostring(res[2])) end
  local r, err = res[2], res[3]
  if r == nil or r == false then
    if err == nil then return nil, broken(mech, name .. " returned " .. tostring(r) .. " without an error") end
    if errors.is(err) then return nil, err end
    return nil, broken(mech, name .. " failed: " .. tostring(err))
  end
  local wrong = SHAPES[name] and SHAPES[name](r)
  if wrong then return nil, broken(mech, name .. " " .. wrong) end
  return table.unpack(res, 2, res.n)
end

-- The callbacks that build or run something: the gate comes first.
local GATED = { provision = true, start = true, exec = true }

--- A host's call of a mechanism's callback, as `corral.provision` … `corral.status` make
-- it: the mechanism loaded (`M.load`), for `provision`, `start` and `exec` the sandbox
-- checked and the gate passed (`M.gate`) before the mechanism builds anything, then the
-- result checked (`M.call`).
-- @param m a built-in name, a path to a .lua file, or a table
-- @tparam string name the callback
-- @tparam table sb a sandbox from `corral.sandbox`
-- @param ... the callback's further arguments
-- @return the callback's values, or `nil, err`
function M.host_call(m, name, sb, ...)
  local mech, err = M.load(m)
  if not mech then return nil, err end
  if GATED[name] then
    if type(sb) ~= "table" or type(sb.id) ~= "string" then
      return nil, errors.invalid_argument("sandbox", "must be a sandbox from corral.sandbox{}")
    end
    local ok, gerr = M.gate(mech, sb)
    if not ok then return nil, gerr end
    local r = table.pack(M.call(mech, name, sb, ...))
    -- past the gate, a capability that cannot be enforced contradicts its probe: the
    -- host changed, and what the probes kept for it goes (the refusal stands)
    if r[1] == nil and errors.is(r[2], "cannot_enforce") then probe.failed(r[2].capability) end
    return table.unpack(r, 1, r.n)
  end
  return M.call(mech, name, sb, ...)
end

local function list(mech, fn, sb)
  if not mech[fn] then return {} end
  local ok, r = pcall(mech[fn], sb)
  if not ok then return nil, M.label(mech) .. ": " .. fn .. " raised: " .. tostring(r) end
  if type(r) ~= "table" then return nil, M.label(mech) .. ": " .. fn .. " must return a list" end
  for _, c in ipairs(r) do
    if type(c) ~= "string" then return nil, M.label(mech) .. ": " .. fn .. " must return a list of names" end
  end
  return r
end

-- What only a mechanism can give, by sandbox field, and the capability names a
-- mechanism may list for it (constructed, or required of the host via corral.resources).
local FLAGS = {
  { field = "limits.memory", needs = { "resource_limits" } },
  { field = "limits.pids", needs = { "resource_limits" } },
  { field = "limits.cpu", needs = { "resource_limits" } },
  { field = "limits.fsize", needs = { "rlimits", "resource_limits" } },
  { field = "limits.nofile", needs = { "rlimits", "resource_limits" } },
  -- a directory bound at /workspace: only the mechanism can put it in its root
  { field = "workspace_path", needs = { "workspace" } },
  { field = "limits.disk", needs = { "disk_quota" } },
  { field = "network", needs = { "nftables", "egress" } },
  -- the egress plane's inbound relay, or an engine that publishes the port itself (oci)
  { field = "service_port", needs = { "nftables", "egress", "published_port" } },
}

local function field_of(sb, path)
  local v = sb
  for k in path:gmatch("[^.]+") do v = type(v) == "table" and v[k] or nil end
  return v
end

--- What the host applies around `mech` for `sb`: each capability it requires and does
-- not construct, as a set (`resource_limits` there: the host's cgroup and rlimits hold
-- every limit, corral.mechanism.watch). Nil and a message when a list is broken.
-- @tparam table mech
-- @tparam table sb
-- @treturn table set of names
function M.host_applied(mech, sb)
  local required, rerr = list(mech, "required_capabilities", sb)
  if not required then return nil, rerr end
  local constructed, cerr = list(mech, "constructed_capabilities", sb)
  if not constructed then return nil, cerr end
  local set = {}
  for _, c in ipairs(required) do set[c] = true end
  for _, c in ipairs(constructed) do set[c] = nil end
  return set
end

--- The tenant profile's guarantees: a mechanism claiming none of them, built or
-- required, runs what it runs as the caller, on the host.
M.ISOLATION = { "filesystem_confinement", "privilege_separation", "network_restriction" }

--- Whether `mech` claims none of `ISOLATION` for `sb`, in either list.
-- @tparam table mech
-- @tparam table sb
-- @treturn boolean
function M.claims_nothing(mech, sb)
  local required = list(mech, "required_capabilities", sb) or {}
  local constructed = list(mech, "constructed_capabilities", sb) or {}
  local named = {}
  for _, c in ipairs(required) do named[c] = true end
  for _, c in ipairs(constructed) do named[c] = true end
  for _, c in ipairs(M.ISOLATION) do
    if named[c] then return false end
  end
  return true
end

--- The gate: every flag the sandbox sets must be one the mechanism builds or requires
-- (a `--memory` is refused, never silently dropped); then required − constructed, each
-- asked of the host probe.
-- @tparam table mech
-- @tparam table sb
-- @treturn true, or nil and cannot_enforce naming the first absent capability (`resource`
--   when its probe is not known: a resource ran out while probing)
function M.gate(mech, sb)
  local required, rerr = list(mech, "required_capabilities", sb)
  if not required then return nil, errors.cannot_enforce("mechanism", rerr) end
  local constructed, cerr = list(mech, "constructed_capabilities", sb)
  if not constructed then return nil, errors.cannot_enforce("mechanism", cerr) end
  local built, named = {}, {}
  for _, c in ipairs(constructed) do built[c], named[c] = true, true end
  for _, c in ipairs(required) do named[c] = true end
  for _, flag in ipairs(FLAGS) do
    if field_of(sb, flag.field) ~= nil then
      local ok = false
      for _, c in ipairs(flag.needs) do ok = ok or named[c] == true end
      if not ok then
        -- in the caller's words (the flag, via detail_format), not the callbacks' names:
        -- a built-in's user cannot change its lists; an author is pointed at the contract
        local format = string.format("mechanism %s neither builds %s itself nor has the host apply it " ..
          "around it, so %%s cannot be honoured%s", (M.label(mech):gsub("%%", "%%%%")),
          table.concat(flag.needs, " or "), M.is_builtin(mech) and "" or " (`corral help mechanisms`)")
        return nil, errors.new("cannot_enforce", { capability = flag.needs[1], argument = flag.field,
          detail = string.format(format, flag.field), detail_format = format })
      end
    end
  end
  for _, cap in ipairs(required) do
    if not built[cap] then
      local ok, result = pcall(probe.check, cap)
      if not ok then
        return nil, errors.cannot_enforce(cap, "no probe establishes it: " .. tostring(result))
      end
      if not result.holds then return nil, probe.refusal(result) end
    end
  end
  return true
end

return M
