-- The mechanism contract the host enforces around any mechanism, a custom .lua one
-- included: --wall, forwarded signals, clean-up, the environment filter, flags a
-- mechanism does not construct, and every callback's result checked. Each attempt is
-- followed by its control in the same run.
local corral = require "corral"
local h = require "helpers"

-- A custom mechanism that runs the command on the host with os.execute (it constructs
-- nothing, and says so): the worst case for the host's promises. `exec_body` replaces
-- its exec when given.
local function custom(dir, exec_body, extra)
  local path = dir .. "/custom.lua"
  h.write(path, [[
local M = { name = "custom" }
local state = {}
function M.provision(sb) state[sb.id] = "provisioned"; return true end
function M.start() return true end
function M.exec(_, argv)
  ]] .. (exec_body or [[
  local _, how, n = os.execute(table.concat(argv, " "))
  return { code = how == "exit" and n or 128 + n, how = how == "exit" and "exited" or "killed" }]]) .. [[

end
function M.stop() return true end
function M.destroy(sb) state[sb.id] = nil; return true end
function M.status(sb) return state[sb.id] or "absent" end
function M.required_capabilities() return {} end
function M.constructed_capabilities() return {} end
]] .. (extra or "") .. [[
return M
]])
  return path
end

-- The temporary storages of corral runs whose pid is `pid`.
local function temp_storages(pid)
  local n = 0
  for _, name in ipairs(corral.core.fs.listdir("/tmp") or {}) do
    if name:match("^corral%-run%-" .. pid .. "%-") then n = n + 1 end
  end
  return n
end

local function seconds(f)
  local t = corral.core.clock.monotime()
  local a, b = f()
  return corral.core.clock.monotime() - t, a, b
end

describe("the host's promises around a custom mechanism", function()
  local dir
  before_each(function() dir = h.tmpdir("mech") end)
  after_each(function() h.rmrf(dir) end)

  it("ends a command at --wall (124) and kills what the mechanism started; control: without --wall it finishes",
    function()
      local mech = custom(dir)
      local marker = dir .. "/finished"
      local took, out, rc = seconds(function()
        return h.corral("run", "--mechanism", mech, "--wall", "1s", "--", "sleep 2; touch " .. marker)
      end)
      assert.are.equal(124, rc, out)
      assert.matches("wall%-clock limit", out)
      assert.truthy(took < 1.8, string.format("took %.2f s", took))
      os.execute("sleep 1.5")
      assert.is_nil(corral.core.fs.lstat(marker), "the command outlived the wall")
      -- control
      out, rc = h.corral("run", "--mechanism", mech, "--", "sleep 0.2; touch " .. marker)
      assert.are.equal(0, rc, out)
      assert.truthy(corral.core.fs.lstat(marker))
    end)

  it("keeps a credential of the operator's environment from os.execute; control: a plain variable named by --env",
    function()
      local mech = custom(dir)
      local out, rc = h.sh("GITHUB_TOKEN=ghp_leak123 PLAIN=visible " .. h.quote(h.host) .. " run --mechanism " ..
        h.quote(mech) .. " --env PLAIN -- 'echo token=[$GITHUB_TOKEN]; echo plain=[$PLAIN]'")
      assert.are.equal(0, rc, out)
      assert.matches("token=%[%]", out)
      assert.not_matches("ghp_leak123", out)
      assert.matches("plain=%[visible%]", out) -- the mechanism's os.execute still sees the rest
    end)

  it("refuses --memory and --allow for a mechanism that neither builds nor asks for them (3), naming the flag",
    function()
      local mech = custom(dir)
      local out, rc = h.corral("run", "--mechanism", mech, "--memory", "64M", "--", "true")
      assert.are.equal(3, rc, out)
      assert.matches("resource_limits", out)
      assert.matches("%-%-memory", out)
      out, rc = h.corral("run", "--mechanism", mech, "--allow", "example.com:443", "--", "true")
      assert.are.equal(3, rc, out)
      assert.matches("%-%-allow", out)
      -- control: the same mechanism asking the host for resource_limits is admitted
      local asks = custom(dir, nil, [[
function M.required_capabilities(sb) return (sb.limits.memory and { "resource_limits" }) or {} end
]])
      out, rc = h.corral("run", "--mechanism", asks, "--memory", "64M", "--", "true")
      assert.are.equal(0, rc, out)
    end)

  it("forwards SIGTERM, cleans up and exits 143 without a traceback; control: an undisturbed run exits 0", function()
    local mech = custom(dir)
    local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) ..
      " -- 'sleep 20'; echo rc=$?")
    assert.truthy(h.wait_for(function() return temp_storages(pid) == 1 end, 5), "the run never started")
    local took = seconds(function()
      os.execute("kill -TERM " .. pid)
      return p:read("a")
    end)
    p:close()
    -- the shell's `echo` never runs after exec: the status comes from a second run
    assert.truthy(took < 2, string.format("took %.2f s", took))
    assert.are.equal(0, temp_storages(pid))
    local out, rc = h.sh("sh -c " .. h.quote(h.quote(h.host) .. " run --mechanism " .. h.quote(mech) ..
      " -- 'sleep 20' & P=$!; sleep 0.5; kill -TERM $P; wait $P"))
    assert.are.equal(143, rc, out)
    assert.not_matches("traceback", out)
    assert.not_matches("interrupted", out)
    out, rc = h.corral("run", "--mechanism", mech, "--", "true")
    assert.are.equal(0, rc, out)
  end)

  it("ends the run at Ctrl-C (SIGINT to the process group) with 130; control: the run without it exits 0",
    function()
      local mech = custom(dir)
      local out = h.sh("setsid sh -c " .. h.quote("trap '' INT; " .. h.quote(h.host) ..
        " run --mechanism " .. h.quote(mech) .. " -- 'trap - INT; sleep 20' & P=$!; sleep 0.5; " ..
        "kill -INT -$$; wait $P; echo rc=$?"))
      assert.matches("rc=130", out)
      assert.not_matches("traceback", out)
      local cout, rc = h.corral("run", "--mechanism", mech, "--", "exit 0")
      assert.are.equal(0, rc, cout)
    end)
end)

describe("a broken mechanism is reported by name", function()
  local dir
  before_each(function() dir = h.tmpdir("mech") end)
  after_each(function() h.rmrf(dir) end)

  local cases = {
    { "return {}", "exec returned a table without code" },
    { "return nil", "exec returned nil without an error" },
    { "error('boom')", "exec raised: .*boom" },
    { "return { code = 'zero' }", "exec returned a table without code" },
    { "return { code = 0, how = 'vanished' }", "exec returned how = vanished" },
  }
  for _, c in ipairs(cases) do
    it("exec `" .. c[1] .. "`: exit 2, " .. c[2] .. "; control: a conforming exec runs", function()
      local out, rc = h.corral("run", "--mechanism", custom(dir, c[1]), "--", "true")
      assert.are.equal(2, rc, out)
      assert.matches("mechanism custom%.lua: " .. c[2], out)
      assert.not_matches("traceback", out)
      out, rc = h.corral("run", "--mechanism", custom(dir, "return { code = 7 }"), "--", "true")
      assert.are.equal(7, rc, out)
    end)
  end

  it("reports a provision that raises; control: the same call with a conforming provision", function()
    local mech = assert(loadfile(custom(dir)))()
    local sb = assert(corral.sandbox({ id = "broken", storage_root = dir }))
    local good = mech.provision
    mech.provision = function() error("no disk", 0) end
    local ok, err = corral.provision(mech, sb)
    assert.is_nil(ok)
    assert.matches("mechanism custom: provision raised: no disk", tostring(err))
    mech.provision = good
    assert.is_true(corral.provision(mech, sb))
    assert.are.equal("provisioned", corral.status(mech, sb))
    mech.status = function() return "fine" end
    local s, serr = corral.status(mech, sb)
    assert.is_nil(s)
    assert.matches("status returned \"fine\"", tostring(serr))
    assert.is_true(corral.destroy(mech, sb))
  end)
end)

describe("the contract where users look", function()
  it("corral help mechanisms explains it and points at docs/mechanisms.md; control: an unknown topic is refused",
    function()
      local out, rc = h.corral("help", "mechanisms")
      assert.are.equal(0, rc, out)
      assert.matches("constructed_capabilities", out)
      assert.matches("docs/mechanisms%.md", out)
      out, rc = h.corral("help", "no-such-topic")
      assert.are.equal(2, rc, out)
    end)

  it("docs/mechanisms.md names every callback and both examples", function()
    local doc = assert(h.read("docs/mechanisms.md"))
    local mechanism = require "corral.mechanism"
    for _, list in ipairs({ mechanism.REQUIRED, mechanism.OPTIONAL }) do
      for _, name in ipairs(list) do assert.matches("`" .. name .. "%(", doc) end
    end
    for _, f in ipairs({ "command_policy.lua", "primitives.lua" }) do
      assert.matches("scripts/examples/" .. f:gsub("%p", "%%%0"), doc)
      assert.truthy(corral.core.fs.lstat("scripts/examples/" .. f), f)
    end
  end)
end)
