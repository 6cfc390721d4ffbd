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

-- Runs a command that handles signal `sig` (it touches a file and exits 7) under mech,
-- sends corral alone that signal once the command is up, and answers corral's status and
-- whether the handler ran: the mark of a forwarded signal, where the grace's SIGKILL
-- would leave none.
local function forwarded(mech, dir, sig)
  local mark, up = dir .. "/handled-" .. sig, dir .. "/up-" .. sig
  local command = "trap " .. h.quote("touch " .. mark .. "; exit 7") .. " " .. sig .. "; touch " .. up ..
    "; sleep 20 & wait"
  local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) .. " -- " ..
    h.quote(command))
  assert.truthy(h.wait_for(function() return corral.core.fs.lstat(up) end, 10), "the command never started")
  os.execute("kill -" .. sig .. " " .. pid)
  p:read("a")
  local _, _, rc = p:close()
  return { rc, corral.core.fs.lstat(mark) ~= nil }
end

describe("the host's promises around a custom mechanism", function()
  local dir
  before_each(function() dir = h.tmpdir("mech") end)
  after_each(function() h.rmrf(dir) end)

  it("ends a command at --wall (124) and kills what the mechanism started; control: without --wall it finishes",
    function()
      local mech = custom(dir)
      local marker = dir .. "/finished"
      local out, rc = h.corral("run", "--mechanism", mech, "--wall", "1s", "--", "sleep 2; touch " .. marker)
      assert.are.equal(124, rc, out)
      assert.matches("wall%-clock limit", out)
      os.execute("sleep 1.5") -- the command's own end is past by now
      assert.is_nil(corral.core.fs.lstat(marker), "the command outlived the wall")
      -- control
      out, rc = h.corral("run", "--mechanism", mech, "--", "sleep 0.2; touch " .. marker)
      assert.are.equal(0, rc, out)
      assert.truthy(corral.core.fs.lstat(marker))
    end)

  it("keeps the operator's environment from os.execute, credential or not; control: a variable named by --env",
    function()
      local mech = custom(dir)
      local out, rc = h.sh("GITHUB_TOKEN=ghp_leak123 FOO=bar PLAIN=visible " .. h.quote(h.host) ..
        " run --mechanism " .. h.quote(mech) .. " --env PLAIN -- 'echo token=[$GITHUB_TOKEN] foo=[$FOO]; " ..
        "echo plain=[$PLAIN]'")
      assert.are.equal(0, rc, out)
      assert.matches("token=%[%] foo=%[%]", out)
      assert.not_matches("ghp_leak123", out)
      assert.matches("plain=%[visible%]", out) -- what the run passes on still reaches it
    end)

  it("leaves nothing of the operator's environment in /proc/PID/environ of corral or its watched child; " ..
    "control: the same files read, showing what --env passes", function()
    local mech = custom(dir)
    -- $PPID is the watched child (os.execute's shell's parent), whose parent is corral.
    -- Each file is searched for the operator's variables (the attempt), then for PLAIN.
    local script = [[
W=$PPID; C=$(awk '/^PPid:/ {print $2}' /proc/$W/status)
echo "corral=$C"
for p in $W $C; do
  tr '\0' '\n' < /proc/$p/environ | grep -a -c -e ghp_leak123 -e FOO=bar | sed "s/^/leaks in $p: /"
  tr '\0' '\n' < /proc/$p/environ | grep -a -c '^PLAIN=visible$' | sed "s/^/plain in $p: /"
done]]
    local out, rc = h.sh("echo $$; exec env GITHUB_TOKEN=ghp_leak123 FOO=bar PLAIN=visible " .. h.quote(h.host) ..
      " run --mechanism " .. h.quote(mech) .. " --env PLAIN -- " .. h.quote(script))
    assert.are.equal(0, rc, out)
    local corral_pid = out:match("^(%d+)\n")
    assert.truthy(corral_pid and out:find("corral=" .. corral_pid .. "\n", 1, true), out) -- the right process
    local watched = out:match("leaks in (%d+): 0\nplain in %1: 1\n")
    assert.truthy(watched and watched ~= corral_pid, out)
    assert.truthy(out:find("leaks in " .. corral_pid .. ": 0\nplain in " .. corral_pid .. ": 1\n", 1, true), out)
    assert.not_matches("ghp_leak123", out)
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

  -- A mechanism that asks the host for resource_limits and constructs nothing: every
  -- limit is the host's to apply around the watched child and all it starts.
  local function asks_limits()
    return custom(dir, nil, [[
function M.required_capabilities() return { "resource_limits" } end
]])
  end
  local function limits_pending()
    if corral.core.proc.geteuid() ~= 0 or not require("corral.probe").check("resource_limits").holds then
      pending("the host cannot make capped cgroups here (resource_limits does not hold)")
      return true
    end
  end

  it("caps the memory of a mechanism that asks the host for resource_limits: 121; control: a smaller " ..
    "allocation in the same set-up, after the attempt", function()
    if limits_pending() then return end
    local mech = asks_limits()
    local big = "/usr/bin/python3 -c 'x=bytearray(200*1024*1024); print(\"big\", len(x))'"
    local out, rc = h.corral("run", "--mechanism", mech, "--memory", "48M", "--", big)
    assert.are.equal(121, rc, out)
    assert.matches("the memory cap ended the sandbox", out)
    assert.not_matches("big 209715200", out)
    -- the attempt and its control in one cgroup: the hog dies, the small one then runs
    out, rc = h.corral("run", "--mechanism", mech, "--memory", "48M", "--", h.attempt_then_control(big,
      "/usr/bin/python3 -c 'x=bytearray(4*1024*1024); print(\"small-ok\", len(x))'"))
    assert.are.equal(0, rc, out)
    local arc = h.after_attempt(out, "small%-ok 4194304")
    assert.are.equal(128 + 9, arc, out)
  end)

  it("caps the processes of a mechanism that asks the host for resource_limits: the 20th child is refused; " ..
    "control: 2 children in the same set-up, after the attempt", function()
    if limits_pending() then return end
    local mech = asks_limits()
    local forker = dir .. "/fork.py"
    h.write(forker, [[
import os, sys, time
kids = []
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids))
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
sys.exit(0 if len(kids) == int(sys.argv[1]) else 1)
]])
    local out, rc = h.corral("run", "--mechanism", mech, "--pids", "8", "--", h.attempt_then_control(
      "/usr/bin/python3 " .. forker .. " 20", "/usr/bin/python3 " .. forker .. " 2"))
    assert.are.equal(0, rc, out)
    local arc, control, attempt = h.after_attempt(out, "forked 2\n")
    assert.are.equal(1, arc, out)
    local n = tonumber(attempt:match("forked (%d+)"))
    assert.truthy(n and n < 8, out)
    assert.matches("forked 2", control)
  end)

  it("applies --fsize and --nofile for a mechanism that asks for resource_limits; control: within them, " ..
    "after the attempt", function()
    if limits_pending() then return end
    local mech = asks_limits()
    local out, rc = h.corral("run", "--mechanism", mech, "--fsize", "1M", "--nofile", "64", "--",
      h.attempt_then_control("ulimit -n; /usr/bin/python3 -c 'open(\"" .. dir .. "/big\", \"wb\").write(" ..
        "bytes(4*1024*1024))'",
        "/usr/bin/python3 -c 'open(\"" .. dir .. "/small\", \"wb\").write(bytes(1024)); print(\"small-ok\")'"))
    assert.are.equal(0, rc, out)
    local arc, _, attempt = h.after_attempt(out, "small%-ok")
    assert.are_not.equal(0, arc, out)
    assert.truthy(("\n" .. attempt):find("\n64\n"), out)
    local st = corral.core.fs.lstat(dir .. "/big")
    assert.truthy(st and st.size <= 1024 * 1024, "the file grew past --fsize")
  end)

  it("says on stderr that a mechanism claiming no isolation runs the command as the caller on the host; " ..
    "control: one that claims filesystem_confinement is not said to", function()
    local out, rc = h.corral("run", "--mechanism", custom(dir), "--", "true")
    assert.are.equal(0, rc, out)
    assert.matches("claims none of filesystem_confinement, privilege_separation, network_restriction", out)
    assert.matches("runs as the caller %(uid %d+%), on the host", out)
    local claims = custom(dir, nil, [[
function M.constructed_capabilities() return { "filesystem_confinement" } end
]])
    out, rc = h.corral("run", "--mechanism", claims, "--", "true")
    assert.are.equal(0, rc, out)
    assert.not_matches("on the host", out)
  end)

  it("forwards SIGTERM, cleans up and exits 143 without a traceback; control: an undisturbed run exits 0", function()
    local mech = custom(dir)
    local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) ..
      " -- 'sleep 20'; echo rc=$?")
    assert.truthy(h.wait_for(function() return temp_storages(pid) == 1 end, 5), "the run never started")
    os.execute("kill -TERM " .. pid)
    p:read("a")
    p:close()
    -- the shell's `echo` never runs after exec: the status comes from a second run
    assert.are.equal(0, temp_storages(pid))
    -- forwarded, not ended at the grace (a SIGKILL, which no handler sees): the command's
    -- handler ran and chose the status
    assert.are.same({ 7, true }, forwarded(mech, dir, "TERM"))
    local out, rc = h.sh("sh -c " .. h.quote(h.quote(h.host) .. " run --mechanism " .. h.quote(mech) ..
      " -- 'sleep 20' & P=$!; sleep 0.5; kill -TERM $P; wait $P"))
    assert.are.equal(143, rc, out)
    assert.not_matches("traceback", out)
    assert.not_matches("interrupted", out)
    out, rc = h.corral("run", "--mechanism", mech, "--", "true")
    assert.are.equal(0, rc, out)
  end)

  it("forwards SIGINT sent to corral alone, long before the grace: 130, no temporary storage; " ..
    "control: the run without it exits 0", function()
    local mech = custom(dir)
    -- Only corral gets the signal: the command hears of it through the forwarding alone
    -- (the watched child's 3 s grace kill would also end it, but not within 2 s).
    local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) .. " -- 'sleep 20'")
    assert.truthy(h.wait_for(function() return temp_storages(pid) == 1 end, 5), "the run never started")
    os.execute("sleep 0.3") -- past provision, into the command
    os.execute("kill -INT " .. pid)
    local out = p:read("a")
    local _, how, rc = p:close()
    assert.are.same({ "exit", 130 }, { how, rc }, out)
    assert.are.equal(0, temp_storages(pid))
    assert.are.same({ 7, true }, forwarded(mech, dir, "INT"))
    assert.not_matches("traceback", out)
    local cout, crc = h.corral("run", "--mechanism", mech, "--", "exit 0")
    assert.are.equal(0, crc, cout)
  end)

  it("keeps a command that handles one Ctrl-C running past the grace; control: a second Ctrl-C ends it " ..
    "with 130, no temporary storage", function()
    local mech = custom(dir)
    local got, up = dir .. "/got", dir .. "/up"
    local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) .. " -- " ..
      h.quote("trap 'echo x >> " .. got .. "' INT; touch " .. up .. "; while :; do sleep 0.1; done"))
    local function handled(n)
      return h.wait_for(function() return select(2, (h.read(got) or ""):gsub("x\n", "")) >= n end, 10)
    end
    assert.truthy(h.wait_for(function() return corral.core.fs.lstat(up) end, 10), "the command never started")
    os.execute("kill -INT " .. pid)
    assert.truthy(handled(1), "the command never handled the first Ctrl-C")
    os.execute("sleep 4") -- past the 3 s grace a first signal used to start
    local running = os.execute("kill -0 " .. pid .. " 2>/dev/null")
    os.execute("kill -INT " .. pid)
    local out = p:read("a")
    local _, how, rc = p:close()
    assert.truthy(running, "one Ctrl-C the command handled ended the run")
    assert.truthy(handled(2), "the second Ctrl-C never reached the command")
    assert.are.same({ "exit", 130 }, { how, rc }, out)
    assert.are.equal(0, temp_storages(pid))
  end)

  it("ends the run at Ctrl-C (SIGINT to the process group) with 130, at once, no temporary storage; " ..
    "control: the run without it exits 0", function()
    local mech = custom(dir)
    local d = h.tmpdir("mech-int")
    finally(function() h.rmrf(d) end)
    local out = h.sh("setsid sh -c " .. h.quote("trap '' INT; " .. h.quote(h.host) .. " run --mechanism " ..
      h.quote(mech) .. " -- 'sleep 20' & P=$!; echo $P > " .. h.quote(d .. "/pid") .. "; sleep 0.5; " ..
      "kill -INT -$$; wait $P; echo rc=$?"))
    assert.matches("rc=130", out)
    assert.are.equal(0, temp_storages(tonumber(h.read(d .. "/pid"))))
    assert.not_matches("traceback", out)
    local cout, rc = h.corral("run", "--mechanism", mech, "--", "exit 0")
    assert.are.equal(0, rc, cout)
  end)

  it("holds SIGTERM that arrives during a slow provision: 143 once it returns, the command never started, " ..
    "no temporary storage; control: the same run undisturbed", function()
    local mech = custom(dir, nil, [[
function M.provision(sb) os.execute("sleep 1.5"); state[sb.id] = "provisioned"; return true end
]])
    local marker = dir .. "/ran"
    -- the temporary storage is made just before provision
    local p, pid = h.child("exec " .. h.quote(h.host) .. " run --mechanism " .. h.quote(mech) .. " -- 'touch " ..
      marker .. "'")
    assert.truthy(h.wait_for(function() return temp_storages(pid) == 1 end, 5), "the run never started")
    os.execute("kill -TERM " .. pid)
    local out = p:read("a")
    local _, how, rc = p:close()
    assert.are.same({ "exit", 143 }, { how, rc }, out)
    assert.matches("signal 15 arrived before the command started", out)
    assert.is_nil(corral.core.fs.lstat(marker), "the command ran")
    assert.are.equal(0, temp_storages(pid))
    assert.not_matches("traceback", out)
    -- control
    local cout, crc = h.corral("run", "--mechanism", mech, "--", "touch " .. marker)
    assert.are.equal(0, crc, cout)
    assert.truthy(corral.core.fs.lstat(marker))
  end)

  for _, c in ipairs({ { 'return nil, "disk busy"', "destroy failed: disk busy" },
                       { 'error("boom", 0)', "destroy raised: boom" } }) do
    it("reports a destroy that does `" .. c[1] .. "` by the mechanism's name, exit 122; " ..
      "control: a destroy that succeeds exits with the command's status", function()
      local broken = custom(dir, nil, "function M.destroy(sb) state[sb.id] = nil; " .. c[1] .. " end\n")
      local out, rc = h.corral("run", "--mechanism", broken, "--", "exit 5")
      assert.are.equal(122, rc, out)
      assert.matches("mechanism custom%.lua: " .. c[2], out)
      assert.matches("exit 122, not 5", out)
      assert.not_matches("traceback", out)
      out, rc = h.corral("run", "--mechanism", custom(dir), "--", "exit 5")
      assert.are.equal(5, rc, out)
    end)
  end

  it("names a command that is not found (127); control: one that is", function()
    local mech = custom(dir)
    local out, rc = h.corral("run", "--mechanism", mech, "--", "no-such-command-corral")
    assert.are.equal(127, rc, out)
    assert.matches("no%-such%-command%-corral: not found", out)
    out, rc = h.corral("run", "--mechanism", mech, "--", "true")
    assert.are.equal(0, rc, out)
  end)

  it("refuses --workspace for a mechanism that does not bind one (3), naming it; control: one that does", function()
    local out, rc = h.corral("run", "--mechanism", custom(dir), "--workspace", dir, "--", "true")
    assert.are.equal(3, rc, out)
    assert.matches("cannot_enforce: workspace: .*%-%-workspace cannot be honoured", out)
    local binds = custom(dir, nil, [[
function M.constructed_capabilities() return { "workspace" } end
]])
    out, rc = h.corral("run", "--mechanism", binds, "--workspace", dir, "--", "true")
    assert.are.equal(0, rc, out)
  end)

  it("names --learn and --resolve in their refusals, and a refused --learn writes nothing; " ..
    "control: --learn under native writes its file", function()
    local mech = custom(dir)
    local learned = dir .. "/learned"
    local out, rc = h.corral("run", "--mechanism", mech, "--learn", learned, "--", "true")
    assert.are.equal(3, rc, out)
    assert.matches("%-%-learn cannot be honoured", out)
    assert.is_nil(corral.core.fs.lstat(learned), "a refused --learn wrote its file")
    -- --resolve alone means nothing (no destination is allowed): refused by its name first
    out, rc = h.corral("run", "--mechanism", mech, "--resolve", "a.test=192.0.2.1", "--", "true")
    assert.are.equal(2, rc, out)
    assert.matches("%-%-resolve: applies to allowed destinations", out)
    if corral.core.proc.geteuid() == 0 then
      out, rc = h.corral("run", "--learn", learned, "--", "true")
      assert.are.equal(0, rc, out)
      assert.matches("corral run %-%-learn", h.read(learned) or "")
    end
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
