-- core.landlock.restrict: a process confines itself; a control read inside succeeds in
-- the same process, after its read outside is denied.
local h = require "helpers"

describe("core.landlock.restrict", function()
  local root
  setup(function()
    root = h.tmpdir("ll")
    assert(os.execute("mkdir " .. root .. "/in " .. root .. "/out && echo i > " .. root ..
      "/in/f && echo o > " .. root .. "/out/f"))
  end)
  teardown(function() h.rmrf(root) end)

  it("reports the ABI", function()
    local abi = assert(require("corral.core").landlock.abi())
    assert.truthy(abi >= 1)
  end)

  it("denies outside, then allows inside, in one restricted process", function()
    local code = string.format([[
      local core = require "corral.core"
      assert(core.landlock.restrict({ {path = %q, access = "rw"}, {path = "/usr", access = "rx"} }))
      print("outside:" .. tostring(io.open(%q)))
      local f = assert(io.open(%q)) print("inside:" .. f:read("l")) f:close()
      local g = io.open(%q, "w") if g then g:write("x") g:close() print("write-inside-ok") end]],
      root .. "/in", root .. "/out/f", root .. "/in/f", root .. "/in/new")
    local out, status = h.corral("-e", code)
    assert.are.equal(0, status, out)
    -- the controls run after the denied open, in the same process
    assert.is_true(h.in_order(out, { "outside:nil", "inside:i", "write%-inside%-ok" }))
  end)

  it("rejects a bad access mode before restricting anything", function()
    local out, status = h.corral("-e", [[require("corral.core").landlock.restrict({{path = "/", access = "all"}})]])
    assert.are.equal(1, status)
    assert.matches('bad argument #1 .*rule 1: access must be "r", "rx" or "rw"', out)
  end)
end)
