-- corral itself inside a container (podman here; CI installs it): under the engine's
-- default settings `corral probe` names each missing piece with the flag that provides
-- it, `corral run` refuses rather than run unconfined, and `corral confine` falls back to
-- Landlock alone and says what that leaves open; with the flags the probe named, every
-- probe but disk_quota holds. The container binds the host's runtime and this build tree
-- read-only over corral's own empty image (corral.mechanism.oci.image): nothing is
-- pulled. Pending only where no engine is installed.
local core = require "corral.core"
local json = require "dkjson"
local oci = require "corral.mechanism.oci"
local shell = require "corral.shell"
local h = require "helpers"

-- the checkout the host is built in (build/corral, or build/asan/corral for `make asan`)
local tree = h.host:match("^(.*)/build/") or h.host:match("^(.*)/[^/]+/[^/]+$")

local img
-- The argv running `script` under sh in a fresh container with `flags` added to the
-- engine's defaults (only the host's podman configuration: runtime, ulimits).
local function container_argv(flags, script)
  local eng = assert(oci.engine())
  if not img then
    local mounts = {}
    for _, p in ipairs(core.rootplan.runtime_paths()) do
      local target = core.fs.readlink(p)
      if target then mounts[#mounts + 1] = { type = "symlink", dest = p, target = target }
      elseif core.fs.lstat(p) then mounts[#mounts + 1] = { type = "bind", src = p, dest = p } end
    end
    img = assert(oci.image({ mounts = mounts }))
  end
  local argv = { eng.path }
  for _, v in ipairs(eng.conf.global or {}) do argv[#argv + 1] = v end
  for _, v in ipairs({ "run", "--rm", "--network", "none", "--tmpfs", "/tmp", "--pull", "never" }) do
    argv[#argv + 1] = v
  end
  local ulimits = {}
  for k, v in pairs(eng.conf.ulimits or {}) do ulimits[#ulimits + 1] = k .. "=" .. v end
  table.sort(ulimits)
  for _, u in ipairs(ulimits) do argv[#argv + 1] = "--ulimit"; argv[#argv + 1] = u end
  for _, p in ipairs(core.rootplan.runtime_paths()) do
    if not core.fs.readlink(p) and core.fs.lstat(p) then
      argv[#argv + 1] = "--mount"
      argv[#argv + 1] = string.format("type=bind,src=%s,dst=%s,ro=true", p, p)
    end
  end
  argv[#argv + 1] = "--mount"
  argv[#argv + 1] = string.format("type=bind,src=%s,dst=%s,ro=true", tree, tree)
  for _, f in ipairs(flags) do argv[#argv + 1] = f end
  for _, v in ipairs({ img, "/bin/sh", "-c", script }) do argv[#argv + 1] = v end
  return argv
end

-- Output (stdout and stderr together) and status of `script` in a container.
local function in_container(flags, script)
  return shell.capture(container_argv(flags, "CORRAL=" .. shell.quote(h.host) .. "\n" .. script))
end

local function probe_in(flags)
  local out, code = in_container(flags, '"$CORRAL" probe --json')
  assert.are.equal(0, code, out)
  local by = {}
  for _, r in ipairs(assert(json.decode(out), out)) do by[r.name] = r end
  return by
end

-- The flags an absent probe's advice names, as argv words, each once.
local function advised_flags(by)
  local words, seen = {}, {}
  for _, r in pairs(by) do
    for _, p in ipairs(r.advice or {}) do
      if p.flag and not seen[p.flag] then
        seen[p.flag] = true
        for w in p.flag:gmatch("%S+") do words[#words + 1] = w end
      end
    end
  end
  return words
end

describe("corral inside a container #root #oci", function()
  local function need_engine()
    if oci.engine() then return true end
    pending("no podman or docker installed")
  end

  local defaults -- `corral probe` under the engine's defaults, made once

  it("under the engine's defaults, probe names each missing piece with the flag that provides it", function()
    if not need_engine() then return end
    defaults = probe_in({})
    local function says(name, ...)
      local r = assert(defaults[name], name)
      assert.is_false(r.holds, name .. ": " .. tostring(r.detail))
      assert.truthy(r.detail:find("(in a container (podman: /run/.containerenv", 1, true), r.detail)
      for _, s in ipairs({ ... }) do
        assert.truthy(r.detail:find(s, 1, true), name .. " lacks " .. s .. ": " .. r.detail)
      end
    end
    says("user_namespaces", "no CAP_SYS_ADMIN", "/proc are masked",
      "run it with --cap-add SYS_ADMIN --security-opt unmask=ALL")
    says("filesystem_confinement", "--cap-add SYS_ADMIN --security-opt unmask=ALL")
    says("nftables", "no CAP_NET_ADMIN (nftables)", "--cap-add NET_ADMIN")
    says("cgroups", "cgroupfs is read-only", "-v /sys/fs/cgroup:/sys/fs/cgroup:rw")
    says("resource_limits", "-v /sys/fs/cgroup:/sys/fs/cgroup:rw")
    says("confinement.namespace", "run it with --security-opt unmask=ALL")
    -- what does hold there is reported as holding, with no advice
    assert.is_true(defaults["confinement.landlock"].holds, defaults["confinement.landlock"].detail)
    assert.is_nil(defaults["confinement.landlock"].advice)
    -- a probe no setting changes carries none either
    assert.is_nil(defaults.disk_quota.advice)
  end)

  it("with exactly the flags probe named, every probe but disk_quota holds and run confines", function()
    if not need_engine() then return end
    defaults = defaults or probe_in({})
    local flags = advised_flags(defaults)
    assert.truthy(#flags > 0, "no flag was advised")
    local by = probe_in(flags)
    for name, r in pairs(by) do
      if name ~= "disk_quota" then
        assert.is_true(r.holds, name .. " with " .. table.concat(flags, " ") .. ": " .. r.detail)
      end
    end
    -- the run the defaults refused (below) now starts, confined: no capability, no network
    local out, code = in_container(flags, '"$CORRAL" run -- /bin/sh -c ' .. shell.quote(
      "echo RAN; grep CapEff /proc/self/status; cat /proc/net/dev"))
    assert.are.equal(0, code, out)
    assert.matches("RAN", out)
    assert.matches("CapEff:%s*0+\n", out)
    local ifaces = {}
    for name in (out:match("Inter%-|.*$") or ""):gmatch("\n%s*([%w_.-]+):") do ifaces[#ifaces + 1] = name end
    assert.are.same({ "lo" }, ifaces)
  end)

  it("under the defaults, corral run refuses with cannot_enforce naming the capability and the fix", function()
    if not need_engine() then return end
    local out, code = in_container({}, '"$CORRAL" run -- /bin/sh -c "echo RAN"')
    assert.are.equal(3, code, out)
    assert.is_nil(out:find("RAN", 1, true), "the command ran: " .. out)
    assert.matches("cannot_enforce: user_namespaces: ", out)
    assert.truthy(out:find("run it with --cap-add SYS_ADMIN --security-opt unmask=ALL", 1, true), out)
    -- its control is the previous case: with those flags the same run starts
  end)

  it("under the defaults, confine falls back to Landlock alone, says what that leaves open, and holds", function()
    if not need_engine() then return end
    local out, code = in_container({}, [[
mkdir /tmp/box /tmp/outside && echo secret-outside > /tmp/outside/secret
cat /tmp/outside/secret
"$CORRAL" confine --json --permit /tmp/box -- /bin/true
"$CORRAL" confine --exec --permit /tmp/box -- /bin/sh -c '
  { cat /tmp/outside/secret; } 2>&1; echo attempt-rc=$?
  echo inside > /tmp/box/f && cat /tmp/box/f'
echo confine-rc=$?]])
    assert.are.equal(0, code, out)
    -- control outside the confinement: the secret is there to be read
    local first = out:find("secret-outside", 1, true)
    assert.truthy(first, out)
    assert.matches('"layers":%["landlock"%]', out)
    assert.truthy(out:find("only the landlock layer holds on this host; without the namespace layer, " ..
      "metadata changes (chmod, chown, utime), unix sockets and host processes outside the boundary stay reachable",
      1, true), out)
    local rc, control, attempt = h.after_attempt(out, "inside\nconfine%-rc=0")
    h.assert_refused(rc, attempt)
    assert.is_nil(attempt:sub(first + 1):find("secret-outside", 1, true), "read past Landlock: " .. out)
    assert.matches("Permission denied", attempt)
    assert.matches("^inside\n", control)
  end)

  it("with Landlock and unshare(2) refused by a seccomp profile, probe names seccomp and confine refuses", function()
    if not need_engine() then return end
    local dir = h.tmpdir("container")
    local profile = dir .. "/seccomp.json"
    h.write(profile, json.encode({ defaultAction = "SCMP_ACT_ALLOW", syscalls = {
      { names = { "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self" },
        action = "SCMP_ACT_ERRNO", errnoRet = 38 },
      { names = { "unshare" }, action = "SCMP_ACT_ERRNO", errnoRet = 1 },
    } }))
    local ok, err = pcall(function()
      local by = probe_in({ "--security-opt", "seccomp=" .. profile })
      local ll = by["confinement.landlock"]
      assert.is_false(ll.holds, ll.detail)
      assert.truthy(ll.detail:find("landlock_create_ruleset fails under a seccomp filter", 1, true), ll.detail)
      assert.truthy(ll.detail:find("run it with --security-opt seccomp=unconfined)", 1, true), ll.detail)
      local ns = by["confinement.namespace"]
      assert.truthy(ns.detail:find("unshare(CLONE_NEWUSER) is refused", 1, true), ns.detail)
      assert.truthy(ns.detail:find("under a seccomp filter", 1, true), ns.detail)
      assert.truthy(ns.detail:find("--security-opt seccomp=unconfined --security-opt unmask=ALL", 1, true), ns.detail)
      -- neither layer holds: confine refuses instead of running the command unconfined
      local confine_ran = 'mkdir /tmp/box; "$CORRAL" confine --exec --permit /tmp/box -- /bin/sh -c "echo RAN"'
      local out, code = in_container({ "--security-opt", "seccomp=" .. profile }, confine_ran)
      assert.are.equal(3, code, out)
      assert.is_nil(out:find("RAN", 1, true), "ran unconfined: " .. out)
      assert.matches("cannot_enforce: filesystem_confinement: neither the namespace layer nor Landlock holds", out)
      assert.truthy(out:find("--security-opt seccomp=unconfined", 1, true), out)
      -- control: the same command under the engine's default profile runs, confined by Landlock
      out, code = in_container({}, confine_ran)
      assert.are.equal(0, code, out)
      assert.matches("RAN", out)
    end)
    h.rmrf(dir)
    assert(ok, err)
  end)
end)
