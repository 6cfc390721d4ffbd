--- A bundle's config.json as corral-runtime reads and rewrites it: its annotations, and,
-- for a container with an egress plane, the network namespace replaced by the plane's
-- (made and programmed before the container's first process exists: docs/architecture.md,
-- invariant 4), the capabilities that administer a network namespace or bind a port
-- below 1024 taken out of every set, and the `net.*` sysctls dropped: the netns is
-- corral's, and a sysctl the engine asks for (`net.ipv4.ip_unprivileged_port_start`)
-- would be written into it.
-- @module corral.runtime.bundle
local core = require "corral.core"
local errors = require "corral.errors"
local json = require "corral.json"

local M = {}

--- Capabilities a container with a plane never holds: with any of them a tenant could
-- rewrite its ruleset, mark its sockets, open raw sockets or bind below 1024.
M.STRIPPED = { "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE", "CAP_SYS_ADMIN", "CAP_BPF",
  "CAP_SYS_MODULE", "CAP_SYS_PTRACE", "CAP_PERFMON" }

--- Reads `<bundle>/config.json`.
-- @treturn[1] table the config
-- @return[2] nil
-- @treturn[2] table invalid_argument naming --bundle
function M.read(bundle)
  local path = bundle .. "/config.json"
  local text, err = core.fs.read(path)
  if not text then return nil, errors.invalid_argument("--bundle", path .. ": " .. tostring(err)) end
  local config, _, derr = json.decode(text)
  if type(config) ~= "table" then
    return nil, errors.invalid_argument("--bundle", path .. ": not a JSON object (" .. tostring(derr) .. ")")
  end
  local why = M.misshapen(config)
  if why then return nil, errors.invalid_argument("--bundle", path .. ": " .. why) end
  return config
end

-- dkjson marks what it decodes `__jsontype` "object" or "array"
local function jsontype(v) return type(v) == "table" and (getmetatable(v) or {}).__jsontype end
local function is_object(v) return type(v) == "table" and jsontype(v) ~= "array" end
local function is_array(v) return type(v) == "table" and jsontype(v) ~= "object" end

-- The members corral reads or rewrites, by the shape each must have when present.
local SHAPES = {
  { "annotations", is_object, "an object" },
  { "linux", is_object, "an object" },
  { "linux.namespaces", is_array, "an array" },
  { "linux.sysctl", is_object, "an object" },
  { "process", is_object, "an object" },
  { "process.capabilities", is_object, "an object" },
}

--- What in config does not have the shape corral reads it as (nil when all does): the
-- OCI runtime spec's, for the members `confine` and the annotations touch.
-- @tparam table config decoded by corral.json
-- @treturn string|nil
function M.misshapen(config)
  for _, s in ipairs(SHAPES) do
    local v, parent = config, nil
    for k in s[1]:gmatch("[^.]+") do
      parent, v = v, is_object(v) and v[k] or nil
    end
    if v ~= nil and is_object(parent) and not s[2](v) then return s[1] .. " must be " .. s[3] end
  end
  for _, n in ipairs(config.linux and config.linux.namespaces or {}) do
    if not is_object(n) then return "linux.namespaces must hold objects" end
  end
  local caps = config.process and config.process.capabilities or {}
  for k, list in pairs(caps) do
    if not is_array(list) then return "process.capabilities." .. tostring(k) .. " must be an array" end
  end
end

local function drop(list, set)
  if type(list) ~= "table" then return list end
  local out = setmetatable({}, { __jsontype = "array" })
  for _, c in ipairs(list) do
    if not set[c] then out[#out + 1] = c end
  end
  return out
end

--- The config with the plane's netns joined and the network capabilities and sysctls out.
-- @tparam table config (changed in place)
-- @tparam string netns_path
-- @treturn table what was taken out `{caps = {...}, sysctls = {...}}`
function M.confine(config, netns_path)
  config.linux = config.linux or {}
  local ns = config.linux.namespaces or setmetatable({}, { __jsontype = "array" })
  config.linux.namespaces = ns
  local found
  for _, n in ipairs(ns) do
    if n.type == "network" then n.path, found = netns_path, true end
  end
  if not found then ns[#ns + 1] = { type = "network", path = netns_path } end
  local removed = { caps = {}, sysctls = {} }
  local set = {}
  for _, c in ipairs(M.STRIPPED) do set[c] = true end
  local caps = config.process and config.process.capabilities
  if type(caps) == "table" then
    for _, which in ipairs({ "bounding", "effective", "inheritable", "permitted", "ambient" }) do
      for _, c in ipairs(caps[which] or {}) do
        if set[c] and not removed.caps[c] then removed.caps[c] = true end
      end
      caps[which] = drop(caps[which], set)
    end
  end
  for k in pairs(config.linux.sysctl or {}) do
    if k:sub(1, 4) == "net." then
      removed.sysctls[#removed.sysctls + 1] = k
      config.linux.sysctl[k] = nil
    end
  end
  return removed
end

--- Writes the config back to `<bundle>/config.json` (a new file renamed over it); the
-- decoded tables carry dkjson's array and object marks, so `[]` and `{}` stay what they were.
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", …)
function M.write(bundle, config)
  local path = bundle .. "/config.json"
  local tmp = path .. ".corral-runtime"
  local f, err = io.open(tmp, "w")
  if f then
    f:write(json.encode(config))
    f:close()
    local ok
    ok, err = os.rename(tmp, path)
    if ok then return true end
    os.remove(tmp)
  end
  return nil, errors.cannot_enforce("network_restriction", "rewriting " .. path .. ": " .. tostring(err))
end

return M
