--- The `oci` mechanism under corral-runtime (`config.runtime`): a sandbox's egress
-- `network` rendered as the `corral.dev/*` annotations corral-runtime reads
-- (corral.runtime.annotations), so that the plane is the runtime's keeper's, never one
-- in this process. What the annotations cannot carry is refused (fail closed), never
-- dropped: a resolver function is asked once, here, for each name the allowlist names
-- exactly (a table the keeper resolves from, never the host's resolver); a wildcard name
-- with a resolver function, a link, learn mode or a connection budget is refused.
-- @module corral.mechanism.oci.annotate
local errors = require "corral.errors"
local grammar = require "corral.egress.grammar"

local M = {}

-- network fields the annotations carry, by annotation; the rest are refused when set
local ONE = { sni = "sni", idle = "idle" }
local CARRIED = { allow = true, internal = true, resolve = true, sni = true, idle = true }

-- a duration in seconds as the annotation writes it
local FORMAT = { idle = function(v) return tostring(math.tointeger(v) or v) .. "s" end }

local function refuse(detail)
  return nil, errors.cannot_enforce("network_restriction", "under the OCI runtime " .. detail)
end

-- "NAME=ADDR" lines of a resolve table or of a resolver asked for each allowed name.
local function resolve_lines(network)
  local r, lines = network.resolve, {}
  if r == nil then return lines end
  local function add(name, v)
    for _, a in ipairs(type(v) == "table" and v or { v }) do lines[#lines + 1] = name .. "=" .. tostring(a) end
  end
  if type(r) == "table" then
    for name, v in pairs(r) do add(name, v) end
    table.sort(lines)
    return lines
  end
  local asked = {}
  for _, text in ipairs(network.allow or {}) do
    local e = grammar.parse_entry(text)
    if e and e.suffix then return refuse("a resolver function cannot answer for " .. text .. " ahead of time") end
    if e and e.name and not asked[e.name] then
      asked[e.name] = true
      local ok, v = pcall(r, e.name)
      if not ok or v == nil then return refuse("the resolver gave no address for " .. e.name) end
      add(e.name, v)
    end
  end
  return lines
end

--- The engine flags (`--annotation KEY=VALUE`, ...) carrying `network` to corral-runtime.
-- @tparam table network a sandbox's `network`
-- @treturn[1] {string,...}
-- @return[2] nil
-- @treturn[2] table cannot_enforce naming what cannot be carried
function M.flags(network)
  for k, v in pairs(network) do
    if not CARRIED[k] and v ~= nil and v ~= false then
      return refuse("network." .. tostring(k) .. " has no corral.dev/ annotation")
    end
  end
  local out = {}
  local function add(key, list)
    if list and #list > 0 then
      out[#out + 1] = "--annotation"
      out[#out + 1] = "corral.dev/" .. key .. "=" .. table.concat(list, "\n")
    end
  end
  -- the annotation splits its entries at commas too
  for _, list in ipairs({ network.allow or {}, network.internal or {} }) do
    for _, text in ipairs(list) do
      if type(text) ~= "string" or text:find(",", 1, true) then
        return refuse("the entry " .. tostring(text) .. " cannot be written as a corral.dev/ annotation (a comma)")
      end
    end
  end
  add("allow", network.allow)
  add("internal", network.internal)
  local lines, err = resolve_lines(network)
  if not lines then return nil, err end
  add("resolve", lines)
  for key, field in pairs(ONE) do
    local v = network[field]
    if v ~= nil then add(key, { (FORMAT[key] or tostring)(v) }) end
  end
  return out
end

return M
