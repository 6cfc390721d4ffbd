-- The shape of the Lua tree: no module reaches another through a cycle of requires,
-- counting the requires made inside functions (an edge hidden there is still an edge),
-- and none peeks into package.loaded (a module that must hear of a change subscribes).
local h = require "helpers"

-- Every module under lua/ and the modules it requires, wherever in the file.
local function require_graph(root)
  local graph = {}
  local list = io.popen("find " .. h.quote(root) .. " -name '*.lua' | sort")
  for path in list:lines() do
    local name = path:sub(#root + 2, -5):gsub("/", ".")
    name = name:gsub("%.init$", "")
    local text = h.read(path)
    local edges = {}
    for _, pattern in ipairs({ 'require%s*%(?%s*"([%w_.]+)"', "require%s*%(?%s*'([%w_.]+)'",
      'pcall%(%s*require%s*,%s*"([%w_.]+)"' }) do
      for target in text:gmatch(pattern) do edges[target] = true end
    end
    graph[name] = edges
  end
  list:close()
  return graph
end

-- The strongly connected components of more than one module (Tarjan), each sorted.
local function cycles(graph)
  local index, low, stack, on, out, n = {}, {}, {}, {}, {}, 0
  local function visit(v)
    n = n + 1
    index[v], low[v] = n, n
    stack[#stack + 1], on[v] = v, true
    for w in pairs(graph[v]) do
      if graph[w] then
        if not index[w] then
          visit(w)
          low[v] = math.min(low[v], low[w])
        elseif on[w] then
          low[v] = math.min(low[v], index[w])
        end
      end
    end
    if low[v] == index[v] then
      local component = {}
      repeat
        local w = table.remove(stack)
        on[w] = nil
        component[#component + 1] = w
      until w == v
      if #component > 1 then
        table.sort(component)
        out[#out + 1] = "{" .. table.concat(component, ", ") .. "}"
      end
    end
  end
  local names = {}
  for v in pairs(graph) do names[#names + 1] = v end
  table.sort(names)
  for _, v in ipairs(names) do if not index[v] then visit(v) end end
  return out
end

describe("the Lua modules' requires", function()
  it("form no cycle, deferred requires counted; control: a cycle hidden in a function is found", function()
    -- control first: a two-module tree whose only edge back is inside a function
    local dir = h.tmpdir("shape")
    assert(os.execute("mkdir -p " .. h.quote(dir .. "/corral")))
    h.write(dir .. "/corral/a.lua", 'local b = require "corral.b"\nreturn {}\n')
    h.write(dir .. "/corral/b.lua", 'local function f() return require("corral.a") end\nreturn { f = f }\n')
    local found = cycles(require_graph(dir))
    h.rmrf(dir)
    assert.are.same({ "{corral.a, corral.b}" }, found)
    local graph = require_graph("lua")
    assert.truthy(graph["corral.cli"] and graph["corral.egress.allowlist"], "the tree was not read")
    assert.are.same({}, cycles(graph))
  end)

  it("never reach another module through package.loaded", function()
    local hits = h.sh("grep -rn 'package\\.loaded' lua || true")
    assert.are.equal("", hits)
    -- control: the search finds the phrase where it is
    assert.matches("package%.loaded", h.sh("grep -rn 'package\\.loaded' tests/shape_spec.lua"))
  end)
end)
