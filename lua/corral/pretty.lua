--- Values as a person reads them: tables written out as Lua table constructors, one
-- entry per line when they do not fit on one, keys sorted (the list part first, in
-- order), a table met again on its own path shown as `<cycle>`, nesting cut at a depth,
-- long tables cut at a count. The REPL prints its results through it.
--
--     pretty.format({ id = "tenant", limits = { pids = 64 } })
--     --> { id = "tenant", limits = { pids = 64 } }
-- @module corral.pretty
local M = {}

--- Defaults of `format`'s options.
M.DEFAULTS = { depth = 6, width = 96, items = 200, indent = "  " }

local KEYWORDS = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or
  repeat return then true until while]]):gmatch("%a+") do KEYWORDS[w] = true end

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil and not KEYWORDS[k]
end

local function scalar(v)
  local t = type(v)
  if t == "string" then return (string.format("%q", v):gsub("\\\n", "\\n")) end
  return tostring(v)
end

local function key_text(k)
  if is_identifier(k) then return k end
  return "[" .. scalar(k) .. "]"
end

-- Numbers first (in order), then strings, then any other key by its text.
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    if ta == "number" then return true end
    if tb == "number" then return false end
    if ta == "string" then return true end
    if tb == "string" then return false end
    return tostring(a) < tostring(b)
  end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

-- A table's own __tostring (an allowlist, an error) says it better than its fields.
local function custom_text(t)
  local mt = getmetatable(t)
  if type(mt) == "table" and rawget(mt, "__tostring") then
    local ok, s = pcall(tostring, t)
    if ok and type(s) == "string" then return s end
  end
end

local function render(v, opts, level, path)
  if type(v) ~= "table" then return scalar(v) end
  local custom = custom_text(v)
  if custom then return custom end
  if path[v] then return "<cycle: " .. tostring(v) .. ">" end
  if level >= opts.depth then return next(v) == nil and "{}" or "{…}" end
  path[v] = true
  local n = #v
  local keys = {}
  for k in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  local parts, shown = {}, 0
  local total = n + #keys
  for i = 1, n do
    if shown >= opts.items then break end
    parts[#parts + 1] = render(v[i], opts, level + 1, path)
    shown = shown + 1
  end
  for _, k in ipairs(keys) do
    if shown >= opts.items then break end
    parts[#parts + 1] = key_text(k) .. " = " .. render(v[k], opts, level + 1, path)
    shown = shown + 1
  end
  if shown < total then parts[#parts + 1] = string.format("… (%d more)", total - shown) end
  path[v] = nil
  if #parts == 0 then return "{}" end
  local one = "{ " .. table.concat(parts, ", ") .. " }"
  local room = opts.width - #opts.indent * level
  if #one <= room and not one:find("\n", 1, true) then return one end
  local pad = opts.indent:rep(level + 1)
  local lines = { "{" }
  for _, p in ipairs(parts) do lines[#lines + 1] = pad .. p .. "," end
  lines[#lines + 1] = opts.indent:rep(level) .. "}"
  return table.concat(lines, "\n")
end

--- A value as text: a table as a Lua constructor (see the module), anything else as
-- `%q` (strings) or `tostring`.
-- @param v
-- @tparam[opt] table opts `{depth =, width =, items =, indent =}` (see `DEFAULTS`)
-- @treturn string
function M.format(v, opts)
  local o = {}
  for k, d in pairs(M.DEFAULTS) do o[k] = opts and opts[k] or d end
  return render(v, o, 0, {})
end

--- What the REPL shows for its results: each value as `format` writes it, except a
-- string, shown as itself (as `print` does), separated by tabs.
-- @param ... the values
-- @treturn string
function M.results(...)
  local out = {}
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    out[i] = type(v) == "string" and v or M.format(v)
  end
  return table.concat(out, "\t")
end

return M
