--- Egress allowlists: a list of entries (their grammar is `corral.egress.grammar`) and
-- matching a destination against it, through an index built on first use.
-- @module corral.egress.allowlist
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"
local grammar = require "corral.egress.grammar"

local inet = core.inet

local M = {}

local Allowlist = {}
Allowlist.__index = Allowlist

--- An empty allowlist.
-- @treturn table
function M.new()
  return setmetatable({ list = {}, index = nil }, Allowlist)
end

--- Parses a list of entries into an allowlist.
-- @tparam {string,...} list
-- @treturn table the allowlist, or nil and `invalid_argument` naming the first bad entry
function M.parse(list)
  if type(list) ~= "table" or getmetatable(list) ~= nil then
    return nil, errors.invalid_argument(grammar.ARGUMENT, "must be a list of strings, got " .. type(list))
  end
  local al = M.new()
  for i = 1, #list do
    local _, err = al:add(list[i])
    if err then return nil, err end
  end
  for k in pairs(list) do
    if math.type(k) ~= "integer" or k < 1 or k > #list then
      return nil, errors.invalid_argument(grammar.ARGUMENT, "must be a list (array) of strings; found key "
        .. tostring(k))
    end
  end
  return al
end

--- Whether `x` is an allowlist built by this module.
-- @param x
-- @treturn boolean
function M.is_allowlist(x)
  return getmetatable(x) == Allowlist
end

local function as_entry(e)
  if type(e) == "table" and e.text and e.kind then return e end
  return grammar.parse_entry(e)
end

--- Adds an entry (a string or a `parse_entry` table), once per canonical text.
-- @tparam string|table e
-- @treturn table the entry in the list, or nil and `invalid_argument`
function Allowlist:add(e)
  local entry, err = as_entry(e)
  if not entry then return nil, err end
  for _, have in ipairs(self.list) do
    if have.text == entry.text then return have end
  end
  self.list[#self.list + 1] = entry
  self.index = nil
  return entry
end

--- Removes every entry of the same canonical text (`pypi.org:443,80` is `PyPI.org.:80,443`).
-- @tparam string|table e
-- @treturn integer how many were removed, or nil and `invalid_argument`
function Allowlist:remove(e)
  local entry, err = as_entry(e)
  if not entry then return nil, err end
  local kept, n = {}, 0
  for _, have in ipairs(self.list) do
    if have.text == entry.text then n = n + 1 else kept[#kept + 1] = have end
  end
  self.list = kept
  self.index = nil
  return n
end

--- The entries, in the order they were added (a new list; the entries are shared).
-- @treturn {table,...}
function Allowlist:entries()
  return table.move(self.list, 1, #self.list, 1, {})
end

--- The canonical texts of the entries.
-- @treturn {string,...}
function Allowlist:texts()
  local t = {}
  for i, e in ipairs(self.list) do t[i] = e.text end
  return t
end

function Allowlist:__len()
  return #self.list
end

function Allowlist:__tostring()
  return "allowlist{" .. table.concat(self:texts(), " ") .. "}"
end

local function build_index(al)
  local idx = { names = {}, wildcards = {}, nets = {} }
  for _, e in ipairs(al.list) do
    local bucket
    if e.kind == "name" then
      bucket = idx.names[e.name] or {}
      idx.names[e.name] = bucket
    elseif e.kind == "wildcard" then
      bucket = idx.wildcards[e.suffix] or {}
      idx.wildcards[e.suffix] = bucket
    else
      bucket = idx.nets
    end
    bucket[#bucket + 1] = e
  end
  al.index = idx
  return idx
end

local function port_ok(e, port)
  if e.ports == nil or port == nil then return true end
  for _, r in ipairs(e.ports) do
    if port >= r[1] and port <= r[2] then return true end
  end
  return false
end

-- An entry serves a query's protocol: its own (`proto = nil` asks for either).
local function proto_ok(e, proto)
  return proto == nil or (e.proto or "tcp") == proto
end

local function first(bucket, port, proto)
  if not bucket then return nil end
  for _, e in ipairs(bucket) do
    if port_ok(e, port) and proto_ok(e, proto) then return e end
  end
  return nil
end

local function match_name(idx, name, port, proto)
  local e = first(idx.names[name], port, proto)
  if e then return e end
  -- every proper suffix on a label boundary, longest first: a.b.example.com tries
  -- b.example.com, example.com, com; "evilexample.com" never yields "example.com"
  local pos = name:find(".", 1, true)
  while pos do
    e = first(idx.wildcards[name:sub(pos + 1)], port, proto)
    if e then return e end
    pos = name:find(".", pos + 1, true)
  end
  return nil
end

local function match_ip(idx, bytes, port, proto)
  for _, e in ipairs(idx.nets) do
    if #e.bytes == #bytes and inet.in_cidr(bytes, e.bytes, e.prefix) and port_ok(e, port) and proto_ok(e, proto) then
      return e
    end
  end
  return nil
end

--- Matches a destination: a name an exact entry or a wildcard below its suffix, an IP an
-- address or network of its family; the name first. `port = nil` asks for any port,
-- `proto = nil` for either protocol (what the DNS responder asks); `"tcp"` or `"udp"`
-- only the entries of that protocol.
-- @tparam table q `{name =, ip = address text, port =, proto =}`
-- @treturn table|nil the first entry that matches
function Allowlist:match(q)
  local idx = self.index or build_index(self)
  local port, proto = q.port, q.proto
  if port ~= nil and math.type(port) ~= "integer" then return nil end
  if q.name ~= nil then
    local name = address.normalize_name(q.name)
    local e = name and match_name(idx, name, port, proto)
    if e then return e end
  end
  if q.ip ~= nil then
    local bytes = address.parse_address(q.ip)
    if bytes then return match_ip(idx, bytes, port, proto) end
  end
  return nil
end

--- Every entry that matches a destination, in list order (`match` returns the first).
-- @tparam table q `{name =, ip = address text, port =, proto =}`
-- @treturn {table,...}
function Allowlist:match_all(q)
  local out = {}
  for _, e in ipairs(self.list) do
    if M.matches(e, q) then out[#out + 1] = e end
  end
  return out
end

--- Whether one entry matches a destination (as `match`, without the index).
-- @tparam table e an entry
-- @tparam table q `{name =, ip = address text, port =, proto =}`
-- @treturn boolean
function M.matches(e, q)
  if q.port ~= nil and math.type(q.port) ~= "integer" then return false end
  if not port_ok(e, q.port) or not proto_ok(e, q.proto) then return false end
  if e.kind == "name" or e.kind == "wildcard" then
    local name = q.name ~= nil and address.normalize_name(q.name)
    if not name then return false end
    if e.kind == "name" then return name == e.name end
    return #name > #e.suffix + 1 and name:sub(-#e.suffix - 1) == "." .. e.suffix
  end
  local b = q.ip ~= nil and address.parse_address(q.ip)
  return b and #b == #e.bytes and inet.in_cidr(b, e.bytes, e.prefix) or false
end

--- Whether a name is allowed on any port (the DNS responder's question).
-- @tparam table allowlist
-- @tparam string name
-- @treturn table|nil the first matching name or wildcard entry
function M.match_name(allowlist, name)
  return allowlist:match({ name = name })
end

--- `allowlist:match(q)` as a function.
-- @tparam table allowlist
-- @tparam table q
-- @treturn table|nil
function M.match(allowlist, q)
  return allowlist:match(q)
end

return M
