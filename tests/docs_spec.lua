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

-- Its installed copy is checked in tests/luarocks_spec.lua, on the tree that spec builds.
describe("docs/boundary.md", function()
  it("is found from the source tree", function()
    local path = assert(require("corral").boundary_path())
    assert.matches("# corral's published contract", h.read(path))
  end)
end)

-- The CLI's own tables (corral.cli.commands, describe) against what the documents say.
describe("the documents follow the CLI's parser", function()
  local cli = require "corral.cli"

  -- The row of boundary.md's command table for `corral NAME`, or nil.
  local function boundary_row(text, name)
    for line in text:gmatch("[^\n]+") do
      local first = line:match("^| `corral ([%w-]+)[^`]*` |")
      if first == name then return line end
    end
    return nil
  end

  -- Whether `flag` appears as a flag (backticked, alone or with its value) in text.
  local function names_flag(text, flag)
    local p = "`" .. flag:gsub("%p", "%%%0")
    return text:find(p .. "`") ~= nil or text:find(p .. " ") ~= nil
  end

  it("every subcommand has its entry in man/corral.1 and a page of its own", function()
    local man = h.read("man/corral.1")
    local section = assert(man:match("\n%.SH COMMANDS\n(.-)\n%.SH "), "man/corral.1 has no COMMANDS section")
    local names = cli.commands()
    assert.truthy(#names >= 8, "control: the commands were read")
    for _, name in ipairs(names) do
      local roff = name:gsub("%-", "\\-")
      assert.truthy(section:find(".TP\n.B " .. roff .. "\n", 1, true), "man/corral.1 COMMANDS lacks " .. name)
      assert.truthy(io.open("man/corral-" .. name .. ".1"), "no man/corral-" .. name .. ".1")
    end
  end)

  it("every flag the parser accepts is in docs/boundary.md's command table", function()
    local text = h.read("docs/boundary.md")
    local checked = 0
    for _, name in ipairs(cli.commands()) do
      local flags = cli.describe(name).flags
      if #flags > 0 then
        local row = boundary_row(text, name)
        assert.truthy(row, "docs/boundary.md's command table has no row for corral " .. name)
        for _, flag in ipairs(flags) do
          checked = checked + 1
          assert.truthy(names_flag(row, flag), "docs/boundary.md: corral " .. name .. " lacks " .. flag)
        end
      end
    end
    assert.truthy(checked > 30, "control: the flags were read (" .. checked .. ")")
  end)

  it("finds a flag missing from a row (control)", function()
    local row = "| `corral probe` | `--json`, `--tier S1` |"
    assert.is_true(names_flag(row, "--json"))
    assert.is_true(names_flag(row, "--tier"))
    assert.is_false(names_flag(row, "--fresh"))
    assert.is_false(names_flag(row, "--js"))
  end)

  -- The value a documented call `corral.a.b(` / `require("corral.m").f(` reaches, and its text.
  local function documented_calls(text)
    local out = {}
    for span in text:gmatch("`([^`\n]+)`") do
      local name = span:match("^(corral%.[%w_.]+)%s*[%({]")
      if name then
        out[#out + 1] = { text = span, root = "corral", path = name:sub(#"corral." + 1) }
      else
        local mod, path = span:match('^require%s*%(?%s*"(corral[%w_.]*)"%s*%)?%.([%w_.]+)%s*[%({]')
        if mod then out[#out + 1] = { text = span, root = mod, path = path } end
      end
    end
    return out
  end

  local function reaches(call)
    local v = require(call.root)
    for part in call.path:gmatch("[^.]+") do
      if type(v) ~= "table" then return nil end
      v = v[part]
    end
    return v
  end

  local function callable(v)
    local mt = getmetatable(v)
    return type(v) == "function" or (type(mt) == "table" and type(mt.__call) == "function")
  end

  it("every documented call corral.X.Y(...) is a function of require \"corral\" (the REPL's corral)", function()
    local n = 0
    for _, file in ipairs(docs()) do
      for _, call in ipairs(documented_calls(h.read(file))) do
        n = n + 1
        assert.truthy(callable(reaches(call)), file .. ": `" .. call.text .. "` is not a function of " ..
          call.root .. " with that shape")
      end
    end
    assert.truthy(n >= 5, "control: the calls were found (" .. n .. ")")
  end)

  it("catches a call whose shape is wrong (control)", function()
    local calls = documented_calls("`corral.probe.names()` and `corral.probe()` and " ..
      '`require("corral.probe").names()`')
    assert.are.equal(3, #calls)
    assert.is_false(callable(reaches(calls[1])))
    assert.is_true(callable(reaches(calls[2])))
    assert.is_true(callable(reaches(calls[3])))
  end)

  -- The words of a synopsis outside [...]: what it requires.
  local function required_words(synopsis)
    local depth, words, word = 0, {}, ""
    for c in (synopsis .. " "):gmatch(".") do
      if c == "[" then depth = depth + 1 elseif c == "]" then depth = depth - 1 end
      if c:match("%s") or c == "[" or c == "]" then
        if depth == 0 and word ~= "" then words[#words + 1] = word end
        word = ""
      elseif depth == 0 then
        word = word .. c
      end
    end
    return words
  end

  it("a required flag or operand left out is refused naming it as the CLI spells it, never a Lua field", function()
    local tried = 0
    for _, name in ipairs(cli.commands()) do
      local d = cli.describe(name)
      local synopsis = d.usage:match("^[^\n]*")
      local known, needs_flag, has_cmd = {}, false, false
      for _, f in ipairs(d.flags) do known[f] = true end
      for _, w in ipairs(required_words(synopsis)) do
        if w:match("^%-%-%a") then needs_flag = true end
        if w:match("^%u+$") then known[w] = true end
        if w == "CMD" then has_cmd = true end
      end
      -- exec-confined's flags are parsed in C, before any Lua state (core/host/confine.c)
      if name ~= "exec-confined" and #required_words(synopsis) > 2 then
        local attempts = { {} }
        -- with its operand given, what is refused is the missing flag (nothing runs without it)
        if needs_flag and has_cmd then attempts[2] = { "--", "/bin/true" } end
        for _, extra in ipairs(attempts) do
          tried = tried + 1
          local out, status = h.corral(name, table.unpack(extra))
          assert.are.equal(2, status, name .. ": " .. out)
          local named = out:match("invalid_argument: (.-): ")
          assert.truthy(named, name .. ": " .. out)
          assert.truthy(known[named] or known[named:match("^(%-%-[%w-]+)")],
            "corral " .. name .. " " .. table.concat(extra, " ") .. " names '" .. named ..
            "', not one of its flags or operands: " .. out)
        end
      end
    end
    assert.truthy(tried >= 6, "control: the commands were tried (" .. tried .. ")")
  end)
end)
