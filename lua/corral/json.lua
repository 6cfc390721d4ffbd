--- JSON text in a stable key order: the same value prints the same bytes on every run.
--
-- dkjson writes the keys its `keyorder` names first and every other key in `pairs`
-- order, which each Lua state's hash seed reshuffles. Here the order handed to dkjson
-- names every key the value holds: the caller's declared order first, then the rest
-- sorted (numbers before strings).
-- @module corral.json
local found, dkjson = pcall(require, "dkjson")
-- only a missing dkjson is named so: any other error (a Ctrl-C while it loads) is raised as it is
if not found and not tostring(dkjson):find("module 'dkjson' not found", 1, true) then error(dkjson, 0) end
if not found then error("JSON needs dkjson (Debian: lua-dkjson)", 0) end

local M = { null = dkjson.null, decode = dkjson.decode }

local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  return a < b
end

-- Whether dkjson writes t as an array (its own rule: positive integer keys, and an
-- optional count `n`, with few holes); only an object's number keys need an order.
local function is_array(t)
  if (getmetatable(t) or {}).__jsontype == "array" then return true end
  local max, n, count = 0, 0, 0
  for k, v in pairs(t) do
    if k == "n" and type(v) == "number" then
      count = v
    elseif math.type(k) ~= "integer" or k < 1 then
      return false
    else
      n, max = n + 1, math.max(max, k)
    end
  end
  return not (max > 10 and max > count and max > n * 2)
end

-- Every object key of every table in value, once.
local function collect(value, keys, seen)
  if type(value) ~= "table" or seen[value] then return end
  seen[value] = true
  local array = is_array(value)
  for k, v in pairs(value) do
    if type(k) == "string" or (type(k) == "number" and not array) then keys[k] = true end
    collect(v, keys, seen)
  end
end

--- The key order dkjson is handed: `declared`, then every other key of `value` sorted.
-- @param value what will be encoded
-- @tparam[opt] {string,...} declared keys that come first, in this order
-- @treturn {string|number,...}
function M.keyorder(value, declared)
  local keys = {}
  collect(value, keys, {})
  local order, listed = {}, {}
  for _, k in ipairs(declared or {}) do
    order[#order + 1], listed[k] = k, true
  end
  local rest = {}
  for k in pairs(keys) do
    if not listed[k] then rest[#rest + 1] = k end
  end
  table.sort(rest, key_less)
  return table.move(rest, 1, #rest, #order + 1, order)
end

--- Encodes a value as JSON text with every object's keys in a stable order.
-- @param value
-- @tparam[opt] table state dkjson's state (`exception`, `indent` ...); its `keyorder`
--   is the declared order that comes first
-- @treturn string
function M.encode(value, state)
  local st = {}
  for k, v in pairs(state or {}) do st[k] = v end
  st.keyorder = M.keyorder(value, state and state.keyorder)
  return dkjson.encode(value, st)
end

return M
