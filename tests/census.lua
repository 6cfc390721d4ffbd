-- The census floors of tests/census-baseline.txt, and the check every spec that runs the
-- conformance suite against a mechanism makes with them: the census equals the floor.
--
-- The file keeps its history: one `NAME N` line per value a floor has had, oldest first,
-- each followed by at least one `reason: ...` line saying why it moved. A floor's current
-- value is its last line. An entry that repeats the previous value records no change and
-- is refused, as is a value without a reason.
local assert = require "luassert" -- busted's assert: this module is not loaded as a spec

local M = {}

M.PATH = "tests/census-baseline.txt"

--- Parses baseline text into entries, oldest first.
-- @tparam string text
-- @treturn {table,...} `{name =, value =, reasons = {string,...}, line =}`, or nil and what is wrong
function M.parse(text)
  local entries, last = {}, {}
  local n = 0
  local function unreasoned()
    local e = entries[#entries]
    if e and #e.reasons == 0 then
      return string.format("line %d: %s %d has no reason line", e.line, e.name, e.value)
    end
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local name, value = line:match("^([%w_]+) (%d+)$")
    local reason = line:match("^reason: (%S.*)$")
    if name then
      local why = unreasoned()
      if why then return nil, why end
      value = tonumber(value)
      if last[name] == value then
        return nil, string.format("line %d: %s %d repeats its previous value: a new entry records a change", n, name,
          value)
      end
      last[name] = value
      entries[#entries + 1] = { name = name, value = value, reasons = {}, line = n }
    elseif reason then
      if #entries == 0 then return nil, string.format("line %d: a reason before any floor", n) end
      table.insert(entries[#entries].reasons, reason)
    elseif not (line:match("^%s*$") or line:match("^#")) then
      return nil, string.format("line %d: neither `NAME N`, `reason: ...`, a comment nor blank: %s", n, line)
    end
  end
  local why = unreasoned()
  if why then return nil, why end
  return entries
end

--- The current floors, `{[name] = value}`, of the baseline file (a parse error fails the test).
function M.floors()
  local f = assert(io.open(M.PATH, "rb"))
  local text = f:read("a")
  f:close()
  local entries, err = M.parse(text)
  assert.truthy(entries, M.PATH .. ": " .. tostring(err))
  local floors = {}
  for _, e in ipairs(entries) do floors[e.name] = e.value end
  return floors
end

--- Fails unless `report`'s census equals the floor of `name`: a fall is a lost guarantee, a
-- rise a floor that lags (either is recorded in the baseline with its reason).
-- @tparam string name the mechanism's name in the baseline
-- @tparam table report a conformance report
function M.assert_floor(name, report)
  local floor = M.floors()[name]
  assert.truthy(floor, "no floor for " .. name .. " in " .. M.PATH)
  local not_held = {}
  for _, r in ipairs(report.results) do
    if r.outcome ~= "held" then not_held[#not_held + 1] = r.id .. " " .. r.outcome .. ": " .. r.detail end
  end
  assert.are.equal(floor, report.census.held, string.format("%s holds %d, its floor in %s is %d: add a line `%s %d` " ..
    "with its reason there. Not held:\n%s", name, report.census.held, M.PATH, floor, name, report.census.held,
    table.concat(not_held, "\n")))
end

return M
