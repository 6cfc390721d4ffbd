-- corral's host key (corral.state_dir): no storage, workspace, confinement boundary,
-- extra or step grant that holds it is handed to anything, each refusal naming its flag,
-- each followed by its control (the same command with a directory beside the key's);
-- and a file given to `confine --extra` under another name (a hard link) is refused.
local h = require "helpers"
local core = require("corral").core

describe("the host key is never handed #root", function()
  local root, state, beside
  setup(function()
    root = h.tmpdir("statedir")
    os.execute("chmod 0711 " .. h.quote(root))
    state, beside = root .. "/state", root .. "/beside"
    assert(core.fs.mkdir(beside, tonumber("755", 8)))
    local out, status = h.capture({ "env", "CORRAL_STATE_DIR=" .. state, h.host, "key" })
    assert(status == 0, out)
  end)
  teardown(function() h.rmrf(root) end)

  local function corral(...)
    return h.capture({ "env", "CORRAL_STATE_DIR=" .. state, h.host, ... })
  end

  local cases = {
    { "--workspace", function(d) return { "run", "--workspace", d, "--", "true" } end },
    { "--storage", function(d) return { "run", "--storage", d, "--", "true" } end },
    { "--permit", function(d) return { "confine", "--exec", "--permit", d, "--", "true" } end },
    { "--extra", function(d) return { "confine", "--exec", "--permit", beside, "--extra", d, "--", "true" } end },
  }
  for _, case in ipairs(cases) do
    it("refuses " .. case[1] .. " holding it (exit 2, naming the flag); control: a directory beside it", function()
      local target = case[1] == "--extra" and state .. "/key" or state
      local out, status = corral(table.unpack(case[2](target)))
      assert.are.equal(2, status, out)
      assert.matches(case[1]:gsub("%-", "%%-") .. ".*holds corral's host key", out)
      local control = case[1] == "--extra" and root .. "/other" or beside
      if case[1] == "--extra" then assert(core.fs.mkdir(control, tonumber("755", 8))) end
      if case[1] == "--storage" then control = root .. "/storage-beside" end
      out, status = corral(table.unpack(case[2](control)))
      assert.are.equal(0, status, out)
      if case[1] == "--extra" then h.rmrf(control) end
      if case[1] == "--storage" then h.rmrf(control) end
    end)
  end

  it("refuses a step's grant of it; control: the same grant beside it", function()
    local grants = root .. "/grants.lua"
    h.write(grants, string.format('return { read = { %q }, exec = { "/bin/true", "/usr/bin/true" } }', state))
    local out, status = corral("step", "--grants", grants, "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("holds corral's host key", out)
    h.write(grants, string.format('return { read = { %q }, exec = { "/bin/true", "/usr/bin/true" } }', beside))
    out, status = corral("step", "--grants", grants, "--", "true")
    assert.are.equal(0, status, out)
  end)

  it("refuses a confine --extra file with another name (a hard link to /etc/shadow); control: a copy", function()
    local link = root .. "/hardshadow"
    if not os.execute("ln /etc/shadow " .. h.quote(link) .. " 2>/dev/null") then
      return pending("/etc/shadow and " .. root .. " are on different filesystems: no hard link to try")
    end
    local out, status = corral("confine", "--exec", "--permit", beside, "--extra", link, "--", "head", "-c1", link)
    os.remove(link)
    assert.are.equal(2, status, out)
    assert.matches("%-%-extra.*hard links", out)
    h.write(root .. "/plain", "PLAIN\n")
    out, status = corral("confine", "--exec", "--permit", beside, "--extra", root .. "/plain", "--", "cat",
      root .. "/plain")
    assert.are.equal(0, status, out)
    assert.matches("PLAIN", out)
  end)
end)
