-- The conformance suite, run against the built-in mechanisms and against deliberately
-- broken ones (tests/fixtures/mechanisms), each of whose outcomes is pinned: a suite
-- that cannot tell a broken mechanism from a sound one demonstrates nothing.
local conformance = require "corral.conformance"
local h = require "helpers"
local core = require "corral.core"
local census = require "census"

local FIXTURES = "tests/fixtures/mechanisms/"

local function by_id(report)
  local t = {}
  for _, r in ipairs(report.results) do t[r.id] = r.outcome end
  return t
end

local function has_bwrap()
  return require("corral.probe").check("bwrap").holds
end

describe("conformance census #root", function()
  for _, name in ipairs({ "native", "bwrap" }) do
    it("runs every check against " .. name .. ", and holds exactly its floor", function()
      if name == "bwrap" and not has_bwrap() then
        pending("bubblewrap is not runnable here")
        return
      end
      local report = assert(conformance.run(name))
      assert.are.equal(#conformance.ids(), #report.results)
      local outcomes = by_id(report)
      for _, r in ipairs(report.results) do
        assert.truthy(({ held = 1, breached = 1, unavailable = 1, void = 1 })[r.outcome], r.id)
        assert.are.equal("string", type(r.detail), r.id)
        assert.are_not.equal("breached", r.outcome, r.id .. ": " .. r.detail)
        assert.are_not.equal("void", r.outcome, r.id .. ": " .. r.detail)
      end
      census.assert_floor(name, report)
      -- every difference between the mechanisms is explained in the baseline
      assert.are.equal("unavailable", outcomes["cred.store_hook"])
      -- both build a disk of their own for limits.disk (corral.disk)
      assert.are.equal("held", outcomes["res.disk"])
      -- both give the tenant a devpts of its own, where the filter refuses TIOCSTI
      assert.are.equal("held", outcomes["proc.tiocsti"])
    end)
  end
end)

describe("the census baseline", function()
  it("parses, each floor's every value with its reason, and names only mechanisms the suite runs", function()
    local floors = census.floors()
    local run = { native = true, bwrap = true, oci = true, command_policy = true, primitives = true }
    for name in pairs(floors) do assert.truthy(run[name], name .. ": a floor no spec checks") end
    for name in pairs(run) do assert.truthy(floors[name], "no floor for " .. name) end
  end)

  it("keeps history: the last value is the floor; a change without a reason, or no change, is refused", function()
    local entries = assert(census.parse("# c\n\nm 3\nreason: first\nm 5\nreason: a\nreason: b\nn 1\nreason: x"))
    assert.are.same({ 3, 5, 1 }, { entries[1].value, entries[2].value, entries[3].value })
    assert.are.same({ "a", "b" }, entries[2].reasons)
    local bad = {
      ["has no reason line"] = "m 3\nreason: first\nm 5\nn 1\nreason: x",
      ["m 5 has no reason line"] = "m 3\nreason: first\nm 5",
      ["repeats its previous value"] = "m 3\nreason: first\nm 3\nreason: again",
      ["a reason before any floor"] = "reason: orphan\nm 3\nreason: first",
      ["neither"] = "m 3\nreason: first\nm: 4",
    }
    for why, text in pairs(bad) do
      local ok, err = census.parse(text)
      assert.is_nil(ok, text)
      assert.matches(why, err, 1, true)
    end
  end)
end)

describe("conformance egress without root #root", function()
  -- The egress group again as an unprivileged caller (helpers.TEST_UID): its plane's
  -- netns is then owned by a user namespace of its own, and the tenant's user namespace
  -- is made beneath that one; every breach attempt must still be held, its control passed.
  for _, name in ipairs({ "native", "bwrap" }) do
    it("holds every egress check against " .. name .. " as an unprivileged caller", function()
      if name == "bwrap" and not has_bwrap() then return pending("bubblewrap is not runnable here") end
      local missing, kind = h.test_user_missing()
      if kind == "kernel" then return pending(missing) end
      assert.is_nil(missing, missing)
      local out, status = h.capture(h.as_test_user({ h.host, "conformance", "--mechanism", name, "--only", "egress",
        "--json" }))
      assert.are.equal(0, status, out)
      local report = assert(require("dkjson").decode(out:match("{.*}")), out)
      local n = 0
      for _, c in ipairs(conformance.ids()) do if c.group == "egress" then n = n + 1 end end
      for _, r in ipairs(report.results) do assert.are.equal("held", r.outcome, r.id .. ": " .. r.detail) end
      assert.are.equal(n, #report.results)
      assert.are.equal(n, report.census.groups.egress.held)
    end)
  end
end)

describe("conformance against broken mechanisms #root", function()
  it("files a network wide open behind a declared boundary as breached, never unavailable", function()
    local report = assert(conformance.run(FIXTURES .. "open_network.lua", { only = "network" }))
    assert.are.same({ ["net.connect_out"] = "breached", ["net.sibling_service"] = "breached" }, by_id(report))
  end)

  it("files a routed network namespace behind a declared boundary as breached: loopback is not the only way out",
    function()
    local mech = assert(require("corral.mechanism").load(FIXTURES .. "routed_network.lua"))
    local report = assert(conformance.run(mech, { only = "network", ids = { ["net.connect_out"] = true } }))
    mech.cleanup()
    assert.are.same({ ["net.connect_out"] = "breached" }, by_id(report))
    -- by its gateway, the host end of the veth (127.0.0.1 is the namespace's own)
    assert.matches("10%.213%.0%.1:%d+:ok:", report.results[1].detail)
  end)

  it("does not credit a refusal at a published address with nothing listening", function()
    local report = assert(conformance.run(FIXTURES .. "dead_address.lua", { only = "network" }))
    assert.are.same({ ["net.connect_out"] = "held", ["net.sibling_service"] = "unavailable" }, by_id(report))
    assert.matches("nothing answers", report.results[2].detail)
  end)

  it("holds nothing for a profile that kills every process: its controls fail (void), in every group", function()
    local report = assert(conformance.run(FIXTURES .. "kill_all.lua"))
    assert.are.equal(#conformance.ids(), #report.results)
    -- unavailable only where the fixture claims nothing (store hook) or the target it must
    -- aim at is itself killed: nothing answers, and the refusal distinguishes nothing
    local unavailable = { ["cred.store_hook"] = "no credentials probe hook",
                          ["net.sibling_service"] = "nothing answers" }
    for _, c in ipairs(conformance.checks("cross_sandbox")) do unavailable[c.id] = "B's target never started" end
    for _, r in ipairs(report.results) do
      if unavailable[r.id] then
        assert.are.equal("unavailable", r.outcome, r.id .. ": " .. r.detail)
        assert.matches(unavailable[r.id], r.detail, 1, true)
      else
        assert.are.equal("void", r.outcome, r.id .. ": " .. r.detail)
      end
    end
    assert.are.equal(0, report.census.held)
    for _, g in ipairs(conformance.GROUPS) do
      assert.truthy(report.census.groups[g], g)
      assert.are.equal(0, report.census.groups[g].held, g)
    end
  end)

  it("holds nothing for a mechanism that runs on the host with only /storage bound, in every group it claims",
    function()
    -- the fixture enforces nothing while claiming everything but egress: each check must
    -- take the route a tenant on the host has (a hard link by host paths, not only into
    -- /storage, where link(2) fails across mounts whatever the sandbox)
    local had_storage = core.fs.lstat("/storage") ~= nil
    finally(function()
      -- what its tenants left in the host's /tmp and IPC namespace (B's targets)
      os.execute("ipcrm -M 0x434f5252 2>/dev/null; rm -f /tmp/corral-target")
      if not had_storage then os.remove("/storage") end
    end)
    local out, status = h.capture({ "env", "GITHUB_TOKEN=ghp_conformance" .. conformance.token(), h.host,
      "conformance", "--mechanism", FIXTURES .. "host_bind.lua", "--json" })
    assert.are.equal(1, status, out)
    local report = assert(require("dkjson").decode(out:match("{.*}")), out)
    assert.are.equal(#conformance.ids(), #report.results)
    -- unavailable only where the host, not the mechanism, decides (and egress and secrets,
    -- which need the unclaimed nftables)
    local may = { ["cred.store_hook"] = "no credentials probe hook", ["res.cpu"] = "the host's load alone",
                  ["priv.low_port"] = "port 80 could not be bound for another reason",
                  ["res.disk"] = "under 1 GiB free" }
    for _, r in ipairs(report.results) do
      if r.group == "egress" or r.group == "secrets" then
        assert.are.equal("unavailable", r.outcome, r.id)
        assert.matches("does not claim nftables", r.detail, 1, true)
      elseif may[r.id] and r.outcome == "unavailable" then
        assert.matches(may[r.id], r.detail, 1, true)
      else
        assert.are.equal("breached", r.outcome, r.id .. ": " .. r.detail)
      end
    end
    assert.are.equal(0, report.census.held)
    for _, g in ipairs(conformance.GROUPS) do assert.are.equal(0, report.census.groups[g].held, g) end
    assert.are.equal(had_storage, core.fs.lstat("/storage") ~= nil)
  end)

  it("catches a leaked forbidden variable", function()
    local report = assert(conformance.run(FIXTURES .. "leak_env.lua", { only = "credentials" }))
    assert.are.same({ ["cred.forbidden_env"] = "breached", ["cred.host_environ"] = "held",
                      ["cred.store_hook"] = "unavailable" }, by_id(report))
    assert.matches("AWS_SECRET_ACCESS_KEY", report.results[1].detail)
  end)

  it("catches a sandbox without a pid namespace", function()
    if not has_bwrap() then
      pending("bubblewrap is not runnable here")
      return
    end
    -- the host holder runs as the tenant's own host id, so nothing but the pid namespace
    -- stops the kill; its environment stays unreadable (the tenant's user namespace lacks
    -- CAP_SYS_PTRACE over the host's), and B runs as another id, so B cannot be killed
    local report = assert(conformance.run(FIXTURES .. "no_pidns.lua", { only = { "credentials", "process",
      "cross_sandbox" }, ids = { ["cred.host_environ"] = true, ["proc.host_pids"] = true,
      ["proc.signal_host"] = true, ["cross.pids"] = true, ["cross.signal"] = true } }))
    assert.are.same({ ["cred.host_environ"] = "held", ["proc.host_pids"] = "breached",
                      ["proc.signal_host"] = "breached", ["cross.pids"] = "breached", ["cross.signal"] = "held" },
      by_id(report))
  end)

  it("does not credit a refusal by a tool missing inside the sandbox: unavailable, never held", function()
    local ids = { ["fs.mknod"] = true, ["fs.mount"] = true, ["proc.ptrace"] = true, ["proc.keyring"] = true,
                  ["priv.nested_userns"] = true, ["net.connect_out"] = true, ["fs.sibling_read"] = true }
    local mech = dofile(FIXTURES .. "no_tools.lua")
    finally(function() core.fs.remove_tree(mech.fixture_dir) end)
    local report = assert(conformance.run(mech, { only = { "filesystem", "process",
      "privilege", "network" }, ids = ids }))
    local outcomes = by_id(report)
    for id in pairs(ids) do
      if id ~= "fs.sibling_read" then assert.are.equal("unavailable", outcomes[id], id) end
    end
    -- the control: a check whose tools are all there is still held under the same fixture
    assert.are.equal("held", outcomes["fs.sibling_read"])
    assert.matches("no python3 inside the sandbox", report.results[#report.results].detail)
  end)

  it("catches a writable host /var/tmp and /dev/shm bound into the runtime", function()
    local report = assert(conformance.run(FIXTURES .. "host_tmp.lua", { only = "filesystem",
      ids = { ["fs.runtime_write"] = true, ["fs.sibling_read"] = true } }))
    assert.are.same({ ["fs.runtime_write"] = "breached", ["fs.sibling_read"] = "held" }, by_id(report))
    assert.matches("/var/tmp/corral%-conformance%-", report.results[2].detail)
  end)

  it("verifies constructed_capabilities instead of believing them", function()
    local report = assert(conformance.run(FIXTURES .. "lying_caps.lua", { only = "resources",
      ids = { ["res.memory"] = true, ["res.pids"] = true, ["res.wall"] = true } }))
    assert.are.same({ ["res.memory"] = "breached", ["res.pids"] = "breached", ["res.wall"] = "held" }, by_id(report))
  end)
end)

describe("the credentials hook #root", function()
  local ids = { ["cred.store_hook"] = true }

  it("is held when the consumer's secret stays in its store (control: the hook's own control passes)", function()
    local store = h.tmpdir("store")
    h.write(store .. "/secret", "store-secret-" .. conformance.token())
    local report = assert(conformance.run("native", { only = "credentials", ids = ids, credentials = function()
      return { attempt = "cat " .. store .. "/secret", secret = h.read(store .. "/secret"), control = "true" }
    end }))
    h.rmrf(store)
    assert.are.equal("held", report.results[1].outcome, report.results[1].detail)
  end)

  it("is breached when the secret is reachable from inside", function()
    local secret = "store-secret-" .. conformance.token()
    local report = assert(conformance.run("native", { only = "credentials", ids = ids, credentials = function(ctx)
      local f = assert(io.open(ctx.storage .. "/store", "w"))
      f:write(secret)
      f:close()
      return { attempt = "cat /storage/store", secret = secret }
    end }))
    assert.are.equal("breached", report.results[1].outcome)
  end)
end)

describe("corral conformance #root", function()
  it("prints the table, the census and its time; a progress line per check on stderr; exits 0", function()
    local d = h.tmpdir("cf-cli")
    finally(function() h.rmrf(d) end)
    local out, status = h.sh('"$1" conformance --only privilege 2>"$2"', h.host, d .. "/stderr")
    assert.are.equal(0, status, out)
    assert.matches("priv%.setuid%s+held", out)
    assert.matches("privilege%s+held%s+4 of%s+4", out)
    assert.matches("suite against native: [%d.]+ s\n$", out)
    -- one line per check as it ends, in order, on stderr only
    local lines = {}
    for line in h.read(d .. "/stderr"):gmatch("[^\n]+") do lines[#lines + 1] = line end
    local checks = conformance.checks("privilege")
    assert.are.equal(#checks, #lines, table.concat(lines, "\n"))
    for i, c in ipairs(checks) do
      assert.matches(string.format("^%%[%d/%d%%] %s%%s+held$", i, #checks, c.id:gsub("%p", "%%%0")), lines[i])
    end
    assert.is_nil(out:find("[1/", 1, true))
  end)

  it("exits 1 when anything is breached, with --json a report", function()
    local out, status = h.corral("conformance", "--mechanism", FIXTURES .. "leak_env.lua", "--only", "credentials",
      "--json")
    assert.are.equal(1, status)
    local report = require("dkjson").decode(out:match("{.*}"))
    assert.are.equal(1, report.census.breached)
  end)

  it("refuses an unknown group (exit 2), naming the flag", function()
    local out, status = h.corral("conformance", "--only", "nope")
    assert.are.equal(2, status)
    assert.matches("%-%-only: no group nope", out)
  end)

  it("refuses a mechanism file that is not there (exit 2), naming the flag", function()
    local out, status = h.corral("conformance", "--mechanism", "/nonexistent/mech.lua")
    assert.are.equal(2, status)
    assert.matches("%-%-mechanism: cannot open /nonexistent/mech%.lua", out)
  end)

  -- A run of `corral conformance --only cross_sandbox` (every check starts a target in a
  -- second sandbox) with its scratch in a directory of the test's own, in a pids cgroup
  -- of the test's own, so that whatever it leaves running is listed there (the cgroups
  -- native makes lie beneath it).
  local PIDS = "/sys/fs/cgroup/pids"
  local function cgroup_run(tmp, cg, args)
    local out = io.open(tmp .. ".out", "w")
    local p = assert(core.spawn.start({ plain = true, path = "/bin/sh", argv = { "sh", "-c",
      'echo $$ > "$0/cgroup.procs" && exec "$@"', cg, h.host, "conformance", table.unpack(args) },
      env = { "PATH=" .. h.PATH, "TMPDIR=" .. tmp }, stdout = out, stderr = out }))
    out:close()
    return p
  end
  -- Every process in cg's tree, and every cgroup beneath it.
  local function cgroup_left(cg)
    local procs, dirs = {}, {}
    local function walk(dir)
      for pid in (h.read(dir .. "/cgroup.procs") or ""):gmatch("%d+") do procs[#procs + 1] = pid end
      for _, name in ipairs(core.fs.listdir(dir) or {}) do
        local st = core.fs.lstat(dir .. "/" .. name)
        if st and st.type == "dir" then
          dirs[#dirs + 1] = name
          walk(dir .. "/" .. name)
        end
      end
    end
    walk(cg)
    return procs, dirs
  end
  local function scratch_of(tmp)
    local found = {}
    for _, name in ipairs(core.fs.listdir(tmp) or {}) do
      if name:match("^corral%-conformance%-") then found[#found + 1] = name end
    end
    return found
  end
  -- Waits until B's target of the first check is ready: the run is mid-check.
  local function wait_mid_run(tmp)
    return h.wait_for(function()
      for _, name in ipairs(scratch_of(tmp)) do
        if core.fs.lstat(tmp .. "/" .. name .. "/cf1/ready") then return true end
      end
    end, 30)
  end
  local function signal_setup()
    if not core.fs.lstat(PIDS .. "/cgroup.procs") then return nil, "no cgroup v1 pids hierarchy" end
    local tmp = h.tmpdir("cf-signal")
    core.fs.chmod(tmp, tonumber("711", 8))
    local cg = PIDS .. "/" .. tmp:match("[^/]+$")
    assert(core.fs.mkdir(cg, tonumber("755", 8)))
    finally(function()
      for _, pid in ipairs((cgroup_left(cg))) do core.proc.kill(tonumber(pid), 9) end
      h.wait_for(function() return #cgroup_left(cg) == 0 end, 5)
      os.execute("find " .. cg .. " -depth -type d -exec rmdir {} + 2>/dev/null")
      h.rmrf(tmp)
      os.remove(tmp .. ".out")
    end)
    return tmp, cg
  end

  it("on SIGTERM mid-check tears the check down: no scratch, sandbox or target left, exit 143", function()
    local tmp, cg = signal_setup()
    if not tmp then return pending(cg) end
    local p = cgroup_run(tmp, cg, { "--only", "cross_sandbox" })
    assert.truthy(wait_mid_run(tmp), "the run never reached its first target: " .. (h.read(tmp .. ".out") or ""))
    assert.is_true(p:kill(15))
    local code = p:wait(30)
    local out = h.read(tmp .. ".out") or ""
    assert.are.equal(143, code, out)
    assert.matches("stopped by signal 15 after 0 of 8 checks", out, 1, true)
    assert.are.same({}, scratch_of(tmp))
    local procs, dirs = cgroup_left(cg)
    assert.are.same({}, procs)
    assert.are.same({}, dirs)
    -- the control: the same set-up, unsignalled, runs its checks to the end (exit 0)
    local q = cgroup_run(tmp, cg, { "--only", "privilege" })
    assert.are.equal(0, q:wait(120), h.read(tmp .. ".out"))
    assert.matches("privilege%s+held%s+4 of%s+4", h.read(tmp .. ".out"))
  end)

  it("after a SIGKILL mid-check, the next run removes the scratch the killed one left", function()
    local tmp, cg = signal_setup()
    if not tmp then return pending(cg) end
    local p = cgroup_run(tmp, cg, { "--only", "cross_sandbox" })
    assert.truthy(wait_mid_run(tmp), "the run never reached its first target: " .. (h.read(tmp .. ".out") or ""))
    assert.is_true(p:kill(9))
    p:wait(10)
    -- the control: the killed run's scratch is there, named by its pid
    local left = scratch_of(tmp)
    assert.are.equal(1, #left)
    assert.matches("^corral%-conformance%-" .. p:pid() .. "%-", left[1])
    -- its targets die with it (the parent-death signal of every spawn)
    -- (bounded generously: on a loaded 2-core host a dying pid namespace takes its time)
    local gone = h.wait_for(function() return #cgroup_left(cg) == 0 end, 30)
    local left_names = {}
    for _, pid in ipairs(cgroup_left(cg)) do
      left_names[#left_names + 1] = pid .. ":" .. ((h.read("/proc/" .. pid .. "/cmdline") or ""):gsub("%z", " "))
    end
    assert.truthy(gone, table.concat(left_names, "; "))
    local q = cgroup_run(tmp, cg, { "--only", "privilege" })
    assert.are.equal(0, q:wait(120), h.read(tmp .. ".out"))
    assert.are.same({}, scratch_of(tmp))
  end)

  it("prints its usage for --help (exit 0), and runs nothing", function()
    local out, status = h.corral("conformance", "--help")
    assert.are.equal(0, status)
    assert.matches("^corral conformance %[%-%-mechanism", out)
    assert.is_nil(out:find("census of", 1, true))
  end)
end)
