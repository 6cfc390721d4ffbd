-- The worked mechanisms under scripts/examples/: each run as a user would, and the
-- conformance suite's census of each against its floor in tests/census-baseline.txt.
local conformance = require "corral.conformance"
local h = require "helpers"
local census = require "census"

local EXAMPLES = "scripts/examples/"

describe("scripts/examples #root", function()
  it("command_policy refuses a command off its list (exit 2); control: a listed one, with the policy's variable",
    function()
      local mech = EXAMPLES .. "command_policy.lua"
      local out, rc = h.corral("run", "--mechanism", mech, "--", "python3", "-c", "print(1)")
      assert.are.equal(2, rc, out)
      assert.matches("python3 is not on command_policy's list", out)
      out, rc = h.corral("run", "--mechanism", mech, "--", "sh", "-c", "echo policy=$CORRAL_POLICY; id -u")
      assert.are.equal(0, rc, out)
      assert.matches("policy=command_policy", out)
    end)

  it("primitives refuses --memory, which it does not construct (exit 3); control: the same run without it",
    function()
      local mech = EXAMPLES .. "primitives.lua"
      local out, rc = h.corral("run", "--mechanism", mech, "--memory", "64M", "--", "true")
      assert.are.equal(3, rc, out)
      assert.matches("%-%-memory", out)
      out, rc = h.corral("run", "--mechanism", mech, "--", "sh", "-c", "echo in > /storage/f && cat /storage/f")
      assert.are.equal(0, rc, out)
      assert.matches("in", out)
    end)

  it("primitives names a command that is not found (127) or cannot be executed (126); control: one that runs",
    function()
      local mech = EXAMPLES .. "primitives.lua"
      local out, rc = h.corral("run", "--mechanism", mech, "--", "no-such-command-corral", "x")
      assert.are.equal(127, rc, out)
      assert.are.equal("corral run: no-such-command-corral: command not found\n", out)
      out, rc = h.corral("run", "--mechanism", mech, "--", "/etc/passwd")
      assert.are.equal(126, rc, out)
      assert.are.equal("corral run: /etc/passwd: Permission denied\n", out)
      out, rc = h.corral("run", "--mechanism", mech, "--", "sh", "-c", "exit 127")
      assert.are.equal(127, rc, out)
      assert.are.equal("", out) -- the command's own 127, nothing said of it
    end)

  it("primitives refuses --workspace, which it does not bind (exit 3); command_policy (native's) binds it",
    function()
      local dir = h.tmpdir("examples-ws")
      finally(function() h.rmrf(dir) end)
      h.write(dir .. "/seen", "from the workspace\n")
      h.must("chmod 0755 " .. h.quote(dir) .. " && chmod 0644 " .. h.quote(dir .. "/seen")) -- the sandbox's id reads
      local out, rc = h.corral("run", "--mechanism", EXAMPLES .. "primitives.lua", "--workspace", dir, "--", "true")
      assert.are.equal(3, rc, out)
      assert.matches("%-%-workspace cannot be honoured", out)
      out, rc = h.corral("run", "--mechanism", EXAMPLES .. "command_policy.lua", "--workspace", dir, "--",
        "cat", "/workspace/seen")
      assert.are.equal(0, rc, out)
      assert.matches("from the workspace", out)
    end)

  for _, name in ipairs({ "command_policy", "primitives" }) do
    it("runs the conformance suite against " .. name .. ": nothing breached or void, exactly its floor held",
      function()
      local report = assert(conformance.run(EXAMPLES .. name .. ".lua"))
      assert.are.equal(#conformance.ids(), #report.results)
      for _, r in ipairs(report.results) do
        assert.are_not.equal("breached", r.outcome, r.id .. ": " .. r.detail)
        assert.are_not.equal("void", r.outcome, r.id .. ": " .. r.detail)
      end
      census.assert_floor(name, report)
    end)
  end
end)
