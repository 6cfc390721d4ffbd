-- JSON that corral prints or logs comes out with its keys in the same order on every run:
-- each object's declared keys first, the rest sorted. Every corral process seeds its
-- string hashes afresh, so an order left to `pairs` changes between two calls.
local h = require "helpers"
local json = require "dkjson"

-- The keys of every object of one JSON text, in the order the text has them: a list of
-- {path =, keys =} in document order (path: the keys and indices leading to it).
local function object_keys(text)
  local objects, pos = {}, 1
  local function skip_ws() pos = text:find("[^ \t\r\n]", pos) or #text + 1 end
  local value
  local function string_at()
    local i = pos + 1
    while true do
      local c = text:sub(i, i)
      if c == "\\" then
        i = i + 2
      elseif c == '"' then
        break
      elseif c == "" then
        error("unterminated string at " .. pos)
      else
        i = i + 1
      end
    end
    local s = json.decode(text:sub(pos, i))
    pos = i + 1
    return s
  end
  function value(path)
    skip_ws()
    local c = text:sub(pos, pos)
    if c == "{" then
      local keys = {}
      objects[#objects + 1] = { path = path, keys = keys }
      pos = pos + 1
      skip_ws()
      if text:sub(pos, pos) == "}" then pos = pos + 1 return end
      repeat
        skip_ws()
        local k = string_at()
        keys[#keys + 1] = k
        skip_ws()
        assert(text:sub(pos, pos) == ":", "':' expected at " .. pos)
        pos = pos + 1
        value(path .. "." .. k)
        skip_ws()
        c = text:sub(pos, pos)
        pos = pos + 1
      until c == "}"
    elseif c == "[" then
      pos = pos + 1
      skip_ws()
      if text:sub(pos, pos) == "]" then pos = pos + 1 return end
      local i = 0
      repeat
        i = i + 1
        value(path .. "[" .. i .. "]")
        skip_ws()
        c = text:sub(pos, pos)
        pos = pos + 1
      until c == "]"
    elseif c == '"' then
      string_at()
    else
      pos = text:find("[,%]}%s]", pos) or #text + 1
    end
  end
  value("$")
  return objects
end

-- The objects' key lists alone, one line each (what two runs must share).
local function shape(objects)
  local lines = {}
  for _, o in ipairs(objects) do lines[#lines + 1] = o.path .. ": " .. table.concat(o.keys, ",") end
  return table.concat(lines, "\n")
end

-- The shape of a's objects, each with only the keys the same object of b has too: where
-- two runs' contents differ (a result cached or probed afresh), their order must not.
local function common_shape(a, b)
  local in_b = {}
  for _, o in ipairs(b) do
    in_b[o.path] = {}
    for _, k in ipairs(o.keys) do in_b[o.path][k] = true end
  end
  local out = {}
  for _, o in ipairs(a) do
    if in_b[o.path] then
      local keys = {}
      for _, k in ipairs(o.keys) do
        if in_b[o.path][k] then keys[#keys + 1] = k end
      end
      out[#out + 1] = { path = o.path, keys = keys }
    end
  end
  return shape(out)
end

local function is_sorted(keys)
  for i = 2, #keys do
    if keys[i - 1] >= keys[i] then return false end
  end
  return true
end

-- Whether keys follow `declared` (those of them present, in its order), then the rest sorted.
local function follows(keys, declared)
  local rank = {}
  for i, k in ipairs(declared) do rank[k] = i end
  local i, last = 1, 0
  while i <= #keys and rank[keys[i]] do
    if rank[keys[i]] <= last then return false end
    last, i = rank[keys[i]], i + 1
  end
  local rest = { table.unpack(keys, i) }
  for _, k in ipairs(rest) do
    if rank[k] then return false end
  end
  return is_sorted(rest)
end

describe("corral.json", function()
  it("reads back what it scans: the scanner itself tells two orders apart", function()
    local objects = object_keys('{"b":1,"a":{"d":[{"y":1,"x":2}],"c":"}{\\""}}')
    assert.are.same({ "b", "a" }, objects[1].keys)
    assert.are.same({ "d", "c" }, objects[2].keys)
    assert.are.same({ "y", "x" }, objects[3].keys)
    assert.are.equal("$.a.d[1]", objects[3].path)
  end)

  it("prints the same bytes in two processes, each object's keys sorted after the declared ones", function()
    local code = [[
      local t = { nested = {} }
      for i = 1, 40 do t["k" .. i] = i; t.nested["n" .. i] = { i, i } end
      io.write(require("corral.json").encode(t, { keyorder = { "nested", "k7" } }))]]
    local a = h.capture({ h.host, "-e", code })
    local b = h.capture({ h.host, "-e", code })
    assert.are.equal(a, b)
    local objects = object_keys(a)
    assert.is_true(follows(objects[1].keys, { "nested", "k7" }), table.concat(objects[1].keys, ","))
    assert.is_true(is_sorted(objects[2].keys), table.concat(objects[2].keys, ","))
    assert.are.equal(40, #objects[2].keys)
  end)
end)

describe("JSON the CLI prints has a stable key order", function()
  it("corral probe --json: every object, the nested extra too", function()
    local a, status = h.corral("probe", "--json")
    assert.are.equal(0, status, a)
    local b = h.corral("probe", "--json")
    local oa, ob = object_keys(a), object_keys(b)
    assert.is_true(#oa > 5, a)
    assert.are.equal(common_shape(oa, ob), common_shape(ob, oa))
    local nested = 0
    for _, o in ipairs(oa) do
      assert.is_true(is_sorted(o.keys), o.path .. ": " .. table.concat(o.keys, ","))
      if o.path:match("%.extra$") then nested = nested + 1 end
    end
    assert.is_true(nested > 0, "no nested object to check: " .. shape(oa))
  end)
end)

describe("JSON the CLI prints has a stable key order #root", function()
  local RECEIPT = { "tier", "mechanism", "commitment", "cmd", "exit", "result", "failure", "wall_s", "cpu_s",
    "max_rss", "energy", "joules", "method", "model", "probe", "control", "attempts", "attempt", "denied",
    "errno", "control_after", "grants", "read", "write", "exec", "net", "subprocess", "env", "clock",
    "random", "residue", "s2" }
  local dir
  before_each(function() dir = h.tmpdir("json-order") end)
  after_each(function() h.rmrf(dir) end)

  it("corral step --json: the receipt in its declared order, its s2 and failure objects sorted", function()
    if require("corral.tier.probe").check().tier ~= "S1" then
      pending("S2 needs S1, which this host did not earn")
      return
    end
    h.write(dir .. "/code.lua", 'print("p") error("stop")')
    local a, status = h.corral("step", "--s2", dir .. "/code.lua", "--json")
    assert.are.equal(1, status, a)
    local b = h.corral("step", "--s2", dir .. "/code.lua", "--json")
    local oa = object_keys(a)
    assert.are.equal(shape(oa), shape(object_keys(b)))
    local seen = {}
    for _, o in ipairs(oa) do
      seen[o.path] = true
      assert.is_true(follows(o.keys, RECEIPT), o.path .. ": " .. table.concat(o.keys, ","))
    end
    assert.is_true(seen["$.s2"] and seen["$.failure"], shape(oa))
  end)

  it("corral conformance --json: the report and every result", function()
    local command = require("corral.shell").join({ h.host, "conformance", "--mechanism",
      "tests/fixtures/mechanisms/leak_env.lua", "--only", "credentials", "--json" }) .. " 2>/dev/null"
    local a, b = h.sh(command), h.sh(command)
    local oa = object_keys(a)
    assert.is_true(#oa > 3, a)
    assert.are.equal(shape(oa), shape(object_keys(b)))
    for _, o in ipairs(oa) do
      assert.is_true(is_sorted(o.keys), o.path .. ": " .. table.concat(o.keys, ","))
    end
  end)

  it("corral run --log-json: each line's fields in one order, the same on every run", function()
    local function logged(n)
      local log = dir .. "/log" .. n
      local out, status = h.corral("run", "--allow", "api.test:443", "--log-json", log, "--", "sh", "-c",
        "getent hosts evil.test; getent hosts api.test")
      assert.are.equal(0, status, out)
      local lines = {}
      for line in h.read(log):gmatch("[^\n]+") do
        local o = object_keys(line)[1]
        lines[#lines + 1] = json.decode(line).name .. " " .. table.concat(o.keys, ",")
      end
      table.sort(lines)
      return lines
    end
    local a, b = logged(1), logged(2)
    assert.is_true(#a >= 2, table.concat(a, "\n"))
    assert.are.same(a, b)
    local fields = require("corral.egress.events").LOG_FIELDS
    for _, line in ipairs(a) do
      local keys = {}
      for k in line:match(" (.*)$"):gmatch("[^,]+") do
        for i, f in ipairs(fields) do
          if f == k then keys[#keys + 1] = i end
        end
      end
      assert.are.equal(#fields, #keys, line)
      assert.is_true(is_sorted(keys), line)
    end
  end)
end)
