-- Documentation stays honest: every backticked file path or module name in README.md
-- and docs/*.md resolves in this tree (or is declared removed, with its history, on a
-- line "Removed: `name` — why"), every conformance id is explained in
-- docs/requirement-ids.md, and the published contract (docs/boundary.md) is found at run
-- time in the source tree and in an installed rock.
local h = require "helpers"

local TOP = { core = true, lua = true, tests = true, scripts = true, docs = true, rockspec = true }

local function docs()
  local files = { "README.md" }
  for name in h.sh("ls docs/*.md"):gmatch("[^\n]+") do files[#files + 1] = name end
  return files
end

-- Whether `name` (corral.x.y…) is a module, or a field reachable from the longest
-- module prefix of it.
local function resolves_module(name)
  local parts = {}
  for p in name:gmatch("[^.]+") do parts[#parts + 1] = p end
  for n = #parts, 1, -1 do
    local mod = table.concat(parts, ".", 1, n)
    if mod == "corral.core" or package.searchpath(mod, "lua/?.lua;lua/?/init.lua") then
      local v = require(mod)
      for i = n + 1, #parts do
        if type(v) ~= "table" then return false end
        v = v[parts[i]]
      end
      return v ~= nil
    end
  end
  return false
end

local function pointers(text)
  local out = {}
  for span in text:gmatch("`([^`\n]+)`") do
    if span:match("^corral%.[%w_.]+$") then
      out[#out + 1] = { kind = "module", name = (span:gsub("%.$", "")) }
    elseif not span:find("[%s$*{}<>|=]") and span:match("^[%w_.-]+/[%w_./-]*$")
        and (TOP[span:match("^([^/]+)/")] or span:match("%.%a+$")) then
      out[#out + 1] = { kind = "path", name = span }
    end
  end
  return out
end

-- The rows of docs/requirement-ids.md: `{[id] = {group =, guarantee =, needs = {...}}}`.
local function requirement_rows(text)
  local rows, group = {}, nil
  for line in text:gmatch("[^\n]+") do
    group = line:match("^## (%S+)$") or group
    local id, guarantee, needs = line:match("^| `([%w_.]+)` | (.-) | (.-) |$")
    if id then
      local list = {}
      for c in needs:gmatch("`([%w_.]+)`") do list[#list + 1] = c end
      assert.is_nil(rows[id], id .. " is listed twice")
      rows[id] = { group = group, guarantee = guarantee, needs = list }
    end
  end
  return rows
end

describe("documentation pointers", function()
  it("resolve in the tree, or are declared removed", function()
    local removed, checked = {}, 0
    for _, file in ipairs(docs()) do
      for name in h.read(file):gmatch("Removed: `([^`]+)` — [^\n]+") do removed[name] = true end
    end
    for _, file in ipairs(docs()) do
      for _, p in ipairs(pointers(h.read(file))) do
        checked = checked + 1
        local ok
        if p.kind == "module" then ok = resolves_module(p.name)
        else ok = io.open((p.name:gsub("/$", ""))) ~= nil end
        assert.truthy(ok or removed[p.name], file .. ": `" .. p.name .. "` resolves to nothing in the tree")
      end
    end
    assert.truthy(checked > 10, "control: the pointers were found at all (" .. checked .. ")")
  end)

  it("flags a pointer at nothing (control)", function()
    local found = pointers("see `lua/corral/nothing_here.lua` and `corral.no_such_module`")
    assert.are.equal(2, #found)
    assert.is_nil(io.open(found[1].name))
    assert.is_false(resolves_module(found[2].name))
  end)

  it("explain every conformance id in docs/requirement-ids.md, and name no id the suite lacks", function()
    local conformance = require "corral.conformance"
    local rows = requirement_rows(h.read("docs/requirement-ids.md"))
    local ids = conformance.ids()
    assert.truthy(#ids > 40)
    local in_code = {}
    for _, g in ipairs(conformance.GROUPS) do
      for _, c in ipairs(conformance.checks(g)) do
        in_code[c.id] = true
        local row = rows[c.id]
        assert.truthy(row, c.id .. " is not in docs/requirement-ids.md")
        assert.are.equal(g, row.group, c.id)
        assert.are.equal(c.guarantee, row.guarantee, c.id)
        assert.are.same(c.needs or {}, row.needs, c.id .. ": the claims it needs")
      end
    end
    -- doc to code: every id the document lists is a check of the suite
    local n = 0
    for id in pairs(rows) do
      n = n + 1
      assert.truthy(in_code[id], "docs/requirement-ids.md lists " .. id .. ", which the suite does not have")
    end
    assert.are.equal(#ids, n)
  end)

  it("reads a requirement row, and catches an id the suite lacks (control)", function()
    local rows = requirement_rows("## network\n\n| id | guarantee | needs claimed |\n|---|---|---|\n" ..
      "| `net.nosuch` | a guarantee | `network_restriction`, `nftables` |\n| `net.none` | another | — |\n")
    assert.are.same({ group = "network", guarantee = "a guarantee", needs = { "network_restriction", "nftables" } },
      rows["net.nosuch"])
    assert.are.same({}, rows["net.none"].needs)
    local known = {}
    for _, c in ipairs(require("corral.conformance").ids()) do known[c.id] = true end
    assert.is_nil(known["net.nosuch"])
  end)
end)

describe("docs/boundary.md names every error code and exit status", function()
  local text = h.read("docs/boundary.md")

  -- The body of the section under the heading `## title`.
  local function section(title)
    local body = text:match("\n## " .. title .. "\n(.-)\n## ") or text:match("\n## " .. title .. "\n(.*)$")
    return assert(body, "no section " .. title)
  end

  it("every code of corral.errors.codes, in its Errors section", function()
    local errors_section = section("Errors")
    local n = 0
    for code in pairs(require("corral.errors").codes) do
      n = n + 1
      assert.truthy(errors_section:find("`" .. code .. "`", 1, true), code .. " is not in boundary.md's Errors")
    end
    assert.truthy(n >= 3, "control: the codes were read (" .. n .. ")")
  end)

  it("every status of core/lib/exitcodes.h, with its number, and no other", function()
    local in_header = {}
    for name, code in h.read("core/lib/exitcodes.h"):gmatch("X%((%u[%u_]*), (%d+)%)") do
      in_header[name] = tonumber(code)
    end
    local in_doc = {}
    for code, name in section("Exit statuses"):gmatch("\n| (%d+) | `(%u[%u_]*)` |") do in_doc[name] = tonumber(code) end
    assert.truthy(in_header.WALL, "control: the header was read")
    for name, code in pairs(in_header) do
      assert.are.equal(code, in_doc[name], name .. " (" .. code .. ") is not in boundary.md's Exit statuses")
      assert.are.equal(code, require("corral.core").exit[name], name) -- and the core exports it
    end
    for name in pairs(in_doc) do assert.truthy(in_header[name], name .. " is in boundary.md, not in exitcodes.h") end
  end)
end)

describe("docs/boundary.md", function()
  it("is found from the source tree", function()
    local path = assert(require("corral").boundary_path())
    assert.matches("# corral's published contract", h.read(path))
  end)

  it("is installed with the rock and found from the installed tree", function()
    local src, tree = h.tmpdir("bnd-src"), h.tmpdir("bnd-tree")
    local out, status = h.sh('git ls-files -z --cached --others --exclude-standard | ' ..
      'tar --null -T - -cf - | tar -C "$1" -xf -', src)
    assert.are.equal(0, status, out)
    out, status = h.sh('cd "$1" && luarocks --lua-version=5.4 make --deps-mode=none --tree="$2" ' ..
      'rockspec/corral-scm-1.rockspec 2>&1', src, tree)
    assert.are.equal(0, status, out)
    h.rmrf(src) -- nothing may be read from the source copy any more
    out, status = h.capture({ tree .. "/bin/corral", "-e",
      "local p = assert(require('corral').boundary_path()) print(p) io.write(io.open(p):read('a'))" })
    h.rmrf(tree)
    assert.are.equal(0, status, out)
    assert.matches("^" .. tree:gsub("%p", "%%%0"), out)
    assert.matches("# corral's published contract", out)
  end)
end)
