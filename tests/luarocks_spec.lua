-- The LuaRocks build: `luarocks make` installs the C module, the Lua modules and the
-- `corral` executable into a tree, and both entry points work from there. The command
-- is the README's own line, which must work offline with the Debian packages of the
-- dependencies installed.
local h = require "helpers"
local shell = require "corral.shell"

-- The README's `luarocks … make …` line, its tree replaced by `tree`.
local function readme_line(tree)
  local line = h.read("README.md"):match("\n(luarocks [^\n]* make [^\n]*)\n")
  assert(line, "README.md has no luarocks make line")
  local replaced, n = line:gsub("%-%-tree=%S+", function() return "--tree=" .. h.quote(tree) end)
  assert(n == 1, line)
  return replaced
end

describe("luarocks make into a temporary tree", function()
  local src, tree

  setup(function()
    src = h.tmpdir("rock-src")
    tree = h.tmpdir("rock-tree")
    -- Build from a copy so the rock's own build does not touch this checkout's build/.
    local out, status = h.sh('git ls-files -z --cached --others --exclude-standard | ' ..
      'tar --null -T - -cf - | tar -C "$1" -xf -', src)
    assert.are.equal(0, status, out)
    -- Offline: the only rocks server is an empty directory.
    local offline = "--only-server=" .. h.quote(src .. "/no-server")
    local line = readme_line(tree):gsub("^luarocks ", "luarocks " .. offline .. " ")
    out, status = h.sh('cd "$1" && ' .. line .. " 2>&1", src)
    h.rmrf(src) -- nothing may be read from the source copy any more
    assert.are.equal(0, status, line .. "\n" .. out)
  end)

  it("the README's line is what makes it work offline: without --deps-mode, dkjson is unsatisfied", function()
    local copy, other = h.tmpdir("rock-src2"), h.tmpdir("rock-tree2")
    local out, status = h.sh('git ls-files -z --cached --others --exclude-standard | ' ..
      'tar --null -T - -cf - | tar -C "$1" -xf -', copy)
    assert.are.equal(0, status, out)
    local line = readme_line(other):gsub("%s*%-%-deps%-mode=%S+", ""):gsub("^luarocks ",
      "luarocks --only-server=" .. h.quote(copy .. "/no-server") .. " ")
    out, status = h.sh('cd "$1" && ' .. line .. " 2>&1", copy)
    local installed = h.read(other .. "/bin/corral")
    h.rmrf(copy)
    h.rmrf(other)
    assert.are_not.equal(0, status, out)
    assert.matches("Could not satisfy dependency dkjson", out)
    assert.is_nil(installed)
    assert.truthy(h.sh("dpkg-query -W -f='${Status}' lua-dkjson"):find("install ok installed", 1, true))
  end)

  teardown(function()
    h.forget_probe_cache(tree .. "/bin/corral") -- the installed corral keeps a cache file of its own
    h.rmrf(src)
    h.rmrf(tree)
  end)

  it("installs the executable, the C module and the Lua modules", function()
    assert.truthy(h.read(tree .. "/bin/corral"))
    assert.truthy(h.read(tree .. "/bin/corral-exec-confined"))
    assert.truthy(h.read(tree .. "/lib/lua/5.4/corral/core.so"))
    assert.truthy(h.read(tree .. "/lib/lua/5.4/corral/sign.so"))
    assert.truthy(h.read(tree .. "/share/lua/5.4/corral/init.lua"))
    assert.truthy(h.read(tree .. "/share/lua/5.4/corral/confinement.lua"))
  end)

  it("runs `corral confine` from the tree, naming the installed wrapper", function()
    local box = h.tmpdir("rock-box")
    local out, status = h.capture({ tree .. "/bin/corral", "confine", "--json", "--permit", box,
      "--", "true" })
    assert.are.equal(0, status, out)
    local spec = require("dkjson").decode(out)
    assert.are.equal(tree .. "/bin/corral-exec-confined", spec.cmd)
    local outside = h.tmpdir("x")
    out, status = h.capture({ tree .. "/bin/corral", "confine", "--exec", "--permit", box, "--",
      "sh", "-c", "echo installed > f && cat f && cat /etc/hostname >/dev/null && ls " .. outside })
    h.rmrf(box)
    h.rmrf(outside)
    assert.matches("installed", out)
    assert.are_not.equal(0, status) -- the ls of a directory outside the boundary fails
  end)

  it("installs docs/boundary.md, and the installed corral finds it in its own tree", function()
    local out, status = h.capture({ tree .. "/bin/corral", "-e",
      "local p = assert(require('corral').boundary_path()) print(p) io.write(io.open(p):read('a'))" })
    assert.are.equal(0, status, out)
    assert.matches("^" .. tree:gsub("%p", "%%%0"), out)
    assert.matches("# corral's published contract", out)
  end)

  it("loads `require \"corral\"` from a stock lua5.4 with the tree's paths", function()
    local box = h.tmpdir("rock-box")
    local code = [[
      local corral = require "corral"
      local spec = assert(corral.confine({"true", {}}, {permit_path = arg[1]}))
      print(spec.cmd)
      print(package.searchpath("corral.core", package.cpath))]]
    local out, status = shell.capture({ "env",
      "LUA_PATH=" .. tree .. "/share/lua/5.4/?.lua;" .. tree .. "/share/lua/5.4/?/init.lua;;",
      "LUA_CPATH=" .. tree .. "/lib/lua/5.4/?.so;;",
      "lua5.4", "-e", "arg = {[1] = " .. string.format("%q", box) .. "}\n" .. code })
    h.rmrf(box)
    assert.are.equal(0, status, out)
    assert.matches(tree .. "/bin/corral-exec-confined\n", out, 1, true)
    assert.matches(tree .. "/lib/lua/5.4/corral/core.so", out, 1, true)
  end)
end)
