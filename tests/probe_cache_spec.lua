-- The probe cache: results that hold are kept for the boot and host state, and a stale
-- "holds" can only become a refusal naming its capability (corral.probe_cache).
local core = require "corral.core"
local h = require "tests.helpers"
local probe_cache = require "corral.probe_cache"

local FILE = assert(probe_cache.path())

local function corral_probe()
  local out, status = h.corral("probe")
  assert.are.equal(0, status, out)
  return out
end

-- Runs `corral probe` once so the file holds this host's results, then rewrites one
-- kept detail (bwrap's) to FORGED: a probe that reads the file reports FORGED.
local function forge()
  corral_probe()
  local text = assert(h.read(FILE))
  local forged, n = text:gsub("(holds\tbwrap\t%d+\t)[^\t]*", "%1FORGED")
  assert.are.equal(1, n, "no kept bwrap result to forge")
  return forged
end

local function replace(text, mode)
  h.write(FILE, text)
  assert(core.fs.chmod(FILE, tonumber(mode or "600", 8)))
end

describe("the probe cache #root", function()
  after_each(function() os.remove(FILE) end)

  it("is the caller's own: mode 0600 in a 0700 directory, the host state first", function()
    corral_probe()
    local st = assert(core.fs.lstat(FILE))
    assert.are.equal("file", st.type)
    assert.are.equal(0, st.uid)
    assert.are.equal(tonumber("600", 8), st.mode)
    assert.are.equal(tonumber("700", 8), assert(core.fs.lstat(FILE:match("^(.*)/"))).mode)
    local text = h.read(FILE)
    -- the state as the host that wrote it reads it (its core is linked in, not core.so)
    local key = h.capture({ h.host, "-e", "io.write(require('corral.probe_cache').key())" })
    assert.truthy(text:find(key .. "\n", 1, true) == 1, key)
    assert.truthy(text:find("\nholds\tuser_namespaces\t", 1, true), text)
  end)

  it("keeps only what holds: a probe that fails is not kept, and runs again", function()
    -- With a scratch directory that cannot be made (TMPDIR is part of the host state the
    -- file is kept for), the probes that need one fail; those that need none still hold.
    local out, status = h.capture({ "env", "TMPDIR=/nonexistent-corral-tmp", h.host, "probe" })
    assert.are.equal(0, status, out)
    local absent, held = {}, 0
    for name, verdict in out:gmatch("\n?([%w_.]+)%s+(%a+)%s") do
      if verdict == "absent" then absent[#absent + 1] = name elseif verdict == "holds" then held = held + 1 end
    end
    assert.truthy(#absent > 0, out)
    assert.truthy(held > 0, out)
    local text = assert(h.read(FILE))
    for _, name in ipairs(absent) do
      assert.is_nil(text:find("\nholds\t" .. name .. "\t", 1, true), name .. " was kept though absent")
    end
    -- the control: what held is in the file, under the state it was probed in
    assert.truthy(text:find("\nenv=TMPDIR=/nonexistent-corral-tmp\n", 1, true), text)
    assert.truthy(text:find("\nholds\tbwrap\t", 1, true), text)
  end)

  it("is ignored for another host state (another boot), and read for this one", function()
    local forged = forge()
    local other_boot = forged:gsub("\nboot=[^\n]*", "\nboot=00000000-0000-0000-0000-000000000000\\n", 1)
    replace(other_boot)
    local out = corral_probe()
    assert.is_nil(out:find("FORGED", 1, true), out)
    -- the control: the same forged detail under this host's own state is what is reported
    replace(forged)
    out = corral_probe()
    assert.truthy(out:find("bwrap%s+holds%s+FORGED"), out)
  end)

  it("is ignored when others may read it, or when it is a symlink, and read when it is private", function()
    local forged = forge()
    replace(forged, "644")
    local out = corral_probe()
    assert.is_nil(out:find("FORGED", 1, true), out)
    local real = FILE .. ".elsewhere"
    h.write(real, forged)
    assert(core.fs.chmod(real, tonumber("600", 8)))
    os.remove(FILE)
    h.must("ln -s " .. h.quote(real) .. " " .. h.quote(FILE))
    out = corral_probe()
    os.remove(real)
    assert.is_nil(out:find("FORGED", 1, true), out)
    replace(forged)
    out = corral_probe()
    assert.truthy(out:find("bwrap%s+holds%s+FORGED"), out)
  end)

  it("is dropped by --fresh, which probes again", function()
    replace(forge())
    local out = h.corral("probe", "--fresh")
    assert.is_nil(out:find("FORGED", 1, true), out)
    assert.is_nil(out:find("probed at", 1, true), out)
    out = corral_probe()
    assert.truthy(out:find("bwrap%s+holds%s+bubblewrap"), out)
    assert.truthy(out:find("probed at", 1, true), out)
  end)

  it("turns a stale 'holds' into a refusal naming the capability, and drops what it kept", function()
    -- In a mount namespace of its own: the cache is written there, then every cgroup
    -- hierarchy is made read-only there, so the host state the key reads is unchanged but
    -- resource_limits no longer holds.
    local script = [[
      set -u
      "$1" probe >/dev/null || exit 90
      grep -q "holds	resource_limits	" "$2" || exit 91
      for m in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do mount -o remount,bind,ro "$m" || exit 92; done
      "$1" run --memory 64M -- /bin/true; echo "run-rc=$?"
      [ -e "$2" ] && echo kept || echo dropped
      "$1" probe | grep '^resource_limits'
      "$1" run -- /bin/true; echo "control-rc=$?"
    ]]
    local out, status = h.capture({ "unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", h.host,
      FILE })
    assert.are.equal(0, status, out)
    assert.truthy(h.in_order(out, { "cannot_enforce: resource_limits", "run%-rc=3", "dropped",
      "resource_limits%s+absent", "control%-rc=0" }), out)
  end)

  it("is dropped by a confinement wrapper that fails, and kept by one that runs", function()
    local box = h.tmpdir("cache-box")
    corral_probe()
    local out, status = h.capture({ h.host, "exec-confined", "--layers", "ns,landlock", "--permit", box,
      "--probe-cache", FILE, "--cd", "/", "--", "/bin/true" })
    local dropped = core.fs.lstat(FILE) == nil
    corral_probe()
    local cout, cstatus = h.capture({ h.host, "exec-confined", "--layers", "ns,landlock", "--permit", box,
      "--probe-cache", FILE, "--", "/bin/true" })
    h.rmrf(box)
    assert.are.equal(125, status, out)
    assert.is_true(dropped)
    assert.are.equal(0, cstatus, cout)
    assert.truthy(core.fs.lstat(FILE))
  end)
end)

describe("corral probe under a signal #root", function()
  local tmp
  before_each(function() tmp = h.tmpdir("probe-signal") end)
  after_each(function()
    h.rmrf(tmp)
    os.remove(FILE)
  end)

  -- `corral probe --fresh` with TMPDIR=tmp; with sig, that signal is pending (blocked,
  -- sent to itself) before the probe command holds its own, so it is there when the
  -- first probe ends.
  local function probe_with(sig)
    local script = "local core = require 'corral.core'\n" ..
      (sig and ("local pending = core.signal.fd({ 'INT', 'TERM', 'HUP' })\n" ..
                "core.proc.kill(core.proc.getpid(), " .. sig .. ")\n") or "") ..
      "os.exit(require('corral.cli').main({ 'probe', '--fresh' }))"
    return h.capture({ "env", "TMPDIR=" .. tmp, h.host, "-e", script })
  end

  it("stops after the current probe on a held signal, exits 128+N, keeps nothing and leaves no scratch; " ..
    "control: unsignalled, every probe reports and what holds is kept", function()
    for _, sig in ipairs({ 2, 15, 1 }) do
      local out, status = probe_with(sig)
      assert.are.equal(128 + sig, status, out)
      assert.matches("stopped by signal " .. sig .. " after 0 of %d+ probes", out)
      assert.is_nil(out:find("absent", 1, true), out) -- no verdict from the interrupted probe
      assert.are.same({}, core.fs.listdir(tmp))
      assert.is_nil((h.read(FILE) or ""):find("\nholds\t", 1, true), "an interrupted probe's result was kept")
    end
    local out, status = probe_with(nil)
    assert.are.equal(0, status, out)
    assert.matches("\nbwrap%s+holds", out)
    assert.are.same({}, core.fs.listdir(tmp))
    assert.truthy((h.read(FILE) or ""):find("\nholds\tuser_namespaces\t", 1, true), "nothing was kept")
  end)

  it("names its file without loading a crypto library (every run names it)", function()
    local maps = "for l in io.lines('/proc/self/maps') do if l:find('libcrypto', 1, true) then print('mapped') end end"
    -- control: the same check sees libcrypto once something does load it (where the kernel
    -- hashes through AF_ALG, sha256 loads nothing and the control cannot be made)
    local out = h.capture({ h.host, "-e", "require('corral.core').digest.sha256('x') " .. maps })
    if not out:find("mapped", 1, true) then return pending("sha256 maps no libcrypto here (AF_ALG)") end
    out = h.capture({ h.host, "-e", "print(require('corral.probe_cache').path()) " .. maps })
    assert.truthy(out:find("/probes%-[^/\n]+\n"), out)
    assert.is_nil(out:find("mapped", 1, true), out)
  end)

  it("keeps one file per corral executable: another build's probing leaves this one's alone", function()
    -- a host of its own path (its modules found at <exe dir>/../lua), as a second checkout
    -- or an install beside this build would be
    local tree = h.tmpdir("other-build")
    h.must("mkdir -p " .. tree .. "/build && cp " .. h.quote(h.host) .. " " .. tree .. "/build/corral && ln -s " ..
      h.quote(os.getenv("PWD") .. "/lua") .. " " .. tree .. "/lua")
    if h.host_program ~= h.host then h.must("cp " .. h.quote(h.host_program) .. " " .. tree .. "/build/corral-host") end
    local other = tree .. "/build/corral"
    corral_probe()
    local mine = assert(h.read(FILE))
    local out = h.capture({ other, "-e", "print(require('corral.probe_cache').path())" })
    local theirs = out:match("^(%S+)\n")
    assert.is_truthy(theirs, out)
    assert.are_not.equal(FILE, theirs)
    local status
    out, status = h.capture({ other, "probe" })
    local kept = h.read(theirs)
    os.remove(theirs)
    h.rmrf(tree)
    assert.are.equal(0, status, out)
    assert.truthy((kept or ""):find("\nholds\t", 1, true), "the other build kept nothing") -- it did probe
    assert.are.equal(mine, h.read(FILE)) -- and this build's file is as it was
  end)

  it("sweeps the scratch a killed probe left, by its dead pid, on the next probe and the next run; " ..
    "never a live pid's, nor another user's", function()
    local dead = h.sh("sh -c 'echo $$'"):match("%d+") -- a pid that has exited
    local function make(name, owner)
      local dir = tmp .. "/" .. name
      assert(os.execute("mkdir " .. dir .. " && dd if=/dev/zero of=" .. dir .. "/probe.disk bs=1M count=1 2>/dev/null"))
      if owner then assert(os.execute("chown -R " .. owner .. " " .. dir)) end
      return dir
    end
    local stale = make("corral-probe-" .. dead .. "-aB3dE9")
    local live = make("corral-probe-" .. core.proc.getpid() .. "-aB3dE9")
    local others = make("corral-probe-" .. dead .. "-xY7zQ1", h.TEST_UID)
    local out, status = h.capture({ "env", "TMPDIR=" .. tmp, h.host, "probe", "--fresh" })
    assert.are.equal(0, status, out)
    assert.is_nil(core.fs.lstat(stale), "the dead pid's scratch was not swept")
    assert.truthy(core.fs.lstat(live), "a live pid's scratch was removed")
    assert.truthy(core.fs.lstat(others), "another user's directory was removed")
    -- the next run sweeps too (its gate, even with every result kept)
    stale = make("corral-probe-" .. dead .. "-cD4eF0")
    out, status = h.capture({ "env", "TMPDIR=" .. tmp, h.host, "run", "--", "true" })
    assert.are.equal(0, status, out)
    assert.is_nil(core.fs.lstat(stale), "corral run did not sweep the dead pid's scratch")
    assert.truthy(core.fs.lstat(live), "a live pid's scratch was removed")
  end)
end)
