--- The mechanism behaviour: how a sandbox is built, as a plain Lua table.
--
-- Required callbacks: provision, start, exec, stop, destroy, status. Optional: address
-- (→ true, nil | "host:port"), required_capabilities(sb), constructed_capabilities(sb).
-- Any table, or a .lua file returning one, is a mechanism; built in: native, bwrap, oci.
--
-- The gate: what a mechanism requires for a sandbox, minus what it constructs itself,
-- is asked of the host probe; a refusal names the absent capability. It never fails
-- open: a probe that errors, or a capability nobody can establish, refuses.
-- @module corral.mechanism
local errors = require "corral.errors"
local capability = require "corral.capability"

local M = {}

M.REQUIRED = { "provision", "start", "exec", "stop", "destroy", "status" }
M.OPTIONAL = { "address", "required_capabilities", "constructed_capabilities" }

M.BUILTIN = { native = "corral.mechanism.native", bwrap = "corral.mechanism.bwrap", oci = "corral.mechanism.oci" }

--- Checks a table against the behaviour.
-- @tparam table mech
-- @treturn[1] table mech
-- @return[2] nil
-- @treturn[2] table invalid_argument naming every missing callback
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

--- Loads a mechanism by built-in name, from a .lua file returning a table, or checks
-- a table given directly.
-- @param name_or_path string or table
-- @treturn[1] table the mechanism
-- @return[2] nil
-- @treturn[2] table error
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
  return M.check(mech)
end

local function list(mech, fn, sb)
  if not mech[fn] then return {} end
  local ok, r = pcall(mech[fn], sb)
  if not ok then return nil, tostring(r) end
  if type(r) ~= "table" then return nil, fn .. " must return a list" end
  return r
end

--- The gate: required − constructed, each asked of the host probe.
-- @tparam table mech
-- @tparam table sb
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce naming the first absent capability
function M.gate(mech, sb)
  local required, rerr = list(mech, "required_capabilities", sb)
  if not required then return nil, errors.cannot_enforce("mechanism", rerr) end
  local constructed, cerr = list(mech, "constructed_capabilities", sb)
  if not constructed then return nil, errors.cannot_enforce("mechanism", cerr) end
  local built = {}
  for _, c in ipairs(constructed) do built[c] = true end
  for _, cap in ipairs(required) do
    if not built[cap] then
      local ok, result = pcall(capability.check, cap)
      if not ok then
        return nil, errors.cannot_enforce(cap, "no probe establishes it: " .. tostring(result))
      end
      if not result.holds then return nil, errors.cannot_enforce(cap, result.detail) end
    end
  end
  return true
end

return M
