-- A resource that runs out for a moment (corral.transient) is a setup failure (exit 120)
-- whose words name the resource, never "this host cannot enforce" (exit 3); a probe that
-- fails so is not known: nothing is kept for it, and the next call probes again.
local core = require "corral.core"
local h = require "helpers"

local NOT_LACKED = "not a protection this host lacks%)"

describe("a transient resource failure #root", function()
  -- host: a copy of the host with its own probe cache file (cache), which no other test
  -- rewrites; a cold cache here never slows another spec
  local root, host, cache

  setup(function()
    root = h.tmpdir("transient")
    host, cache = h.private_host(root)
  end)

  teardown(function()
    if cache and cache:match("^/") then os.remove(cache) end
    h.rmrf(root)
  end)

  -- `corral ARGS...` (default: run -- true) with at most `fds` descriptors: its output
  -- and status
  local function run_with_fds(fds, ...)
    local args = select("#", ...) > 0 and { ... } or { "run", "--", "true" }
    return h.sh('fds=$1 host=$2; shift 2; ulimit -n "$fds" && exec "$host" "$@" 2>&1', tostring(fds), host,
      table.unpack(args))
  end

  -- what the probe cache keeps ("" when there is no file)
  local function kept() return h.read(cache) or "" end

  it("out of fds with a cold probe cache: exit 120 naming fds, nothing kept for it; control: without " ..
    "the limit it runs and the cache keeps user_namespaces holding", function()
    os.remove(cache)
    local out, status = run_with_fds(16)
    assert.are.equal(120, status, out)
    assert.matches("^corral run: setup failed: probing [%w_.]+: .*Too many open files %(this process ran out " ..
      "of file descriptors; " .. NOT_LACKED .. "\n$", out)
    assert.not_matches("cannot_enforce", out)
    assert.not_matches("\nholds\tuser_namespaces\t", kept())
    out, status = h.capture({ host, "run", "--", "true" })
    assert.are.equal(0, status, out)
    assert.matches("\nholds\tuser_namespaces\t", kept())
  end)

  it("out of fds with a cold probe cache, create and confine (its Lua path) exit 120 too, never 3 nor " ..
    "fewer layers; control: without the limit both work", function()
    local id = "transient-" .. core.proc.getpid()
    for _, args in ipairs({ { "create", id }, { "confine", "--permit", root, "--exec", "--", "true" } }) do
      os.remove(cache)
      local out, status = run_with_fds(16, table.unpack(args))
      assert.are.equal(120, status, out)
      assert.matches("^corral " .. args[1] .. ": setup failed: probing [%w_.]+: .*%(this process ran out " ..
        "of file descriptors; " .. NOT_LACKED .. "\n$", out)
    end
    local out, status = h.capture({ host, "create", id })
    h.capture({ host, "rm", id })
    assert.are.equal(0, status, out)
    out, status = h.capture({ host, "confine", "--permit", root, "--exec", "--", "true" })
    assert.are.equal(0, status, out)
  end)

  it("out of fds with a warm probe cache: exit 120 naming fds, the cache kept; control: without the " ..
    "limit it runs", function()
    local out, status = h.capture({ host, "run", "--", "true" })
    assert.are.equal(0, status, out)
    assert.matches("\nholds\tuser_namespaces\t", kept())
    out, status = run_with_fds(16)
    assert.are.equal(120, status, out)
    assert.matches("^corral run: setup failed: spawn: build root: Too many open files %(this process ran out " ..
      "of file descriptors; " .. NOT_LACKED .. "\n$", out)
    -- a transient failure says nothing of the host: what the probes kept stays
    assert.matches("\nholds\tuser_namespaces\t", kept())
    out, status = h.capture({ host, "run", "--", "true" })
    assert.are.equal(0, status, out)
  end)

  it("out of fds with a warm probe cache, confine --exec (the wrapper, its C fast path) exits 120 naming " ..
    "the resource and keeps the cache; control: without the limit it runs", function()
    local out, status = h.capture({ host, "confine", "--permit", root, "--exec", "--", "true" })
    assert.are.equal(0, status, out)
    local before = kept()
    assert.matches("\nholds\tuser_namespaces\t", before)
    out, status = run_with_fds(12, "confine", "--permit", root, "--exec", "--", "true")
    assert.are.equal(120, status, out)
    assert.matches("^corral exec%-confined: .*: [%w ]+ %(a resource ran out for a moment; " .. NOT_LACKED .. "\n$",
      out)
    assert.are.equal(before, kept()) -- the wrapper removed it on any failure before
    out, status = h.capture({ host, "confine", "--permit", root, "--exec", "--", "true" })
    assert.are.equal(0, status, out)
  end)

  it("out of fds, corral step exits 120 naming the resource, never a traceback; control: without the " ..
    "limit it steps", function()
    local grants = root .. "/grants.lua"
    h.write(grants, 'return { read = { "/etc" } }\n')
    local out, status = run_with_fds(12, "step", "--grants", grants, "--", "/usr/bin/head", "-1", "/etc/hostname")
    assert.are.equal(120, status, out)
    assert.matches("^corral step: setup failed: .*%(this process ran out of file descriptors; " .. NOT_LACKED ..
      "\n$", out)
    out, status = h.capture({ host, "step", "--grants", grants, "--", "/usr/bin/head", "-1", "/etc/hostname" })
    assert.are.equal(0, status, out)
  end)

  it("a full $TMPDIR: exit 120 with the reason naming the space; control: with room it runs; " ..
    "a read-only $TMPDIR (a lasting lack, cold cache) is still exit 3", function()
    -- a 64 KiB tmpfs in a mount namespace of this test's own: nothing outlives it
    local dir = root .. "/tmp"
    assert(core.fs.mkdir(dir, tonumber("700", 8)))
    local script = [[set -e; mount -t tmpfs -o size=64k corral-test "$1"
      dd if=/dev/zero of="$1/fill" bs=4k 2>/dev/null || true
      TMPDIR=$1 "$0" run -- true 2>&1 && echo status=0 || echo status=$?
      rm "$1/fill"
      TMPDIR=$1 "$0" run -- sh -c 'echo ran' 2>&1 && echo status=0 || echo status=$?
      mount -o remount,ro "$1"; rm -f "$2"
      TMPDIR=$1 "$0" run -- true 2>&1 && echo status=0 || echo status=$?]]
    local out = h.capture({ "unshare", "-m", "--propagation", "private", "sh", "-c", script, host, dir, cache })
    local room = out:match("\nran\nstatus=(%d+)\n")
    assert.matches("^corral run: setup failed: .*: No space left on device %(a filesystem or a namespace " ..
      "count ran out of room; " .. NOT_LACKED .. "\nstatus=120\n", out)
    assert.are.equal("0", room, out)
    assert.matches("\ncorral run: cannot_enforce: [^\n]*Read%-only file system[^\n]*\nstatus=3\n$", out)
  end)

  it("a probe's child killed from outside is noted as a resource that ran out; control: the same child " ..
    "left alone ends 0 with nothing noted", function()
    -- the marker is split in the host's argv, so that only the probe's child carries it whole
    local script = [[
      "$0" -e "local pc = require 'corral.probe_child'
        local out, code = pc.tenant({ '/bin/sh', '-c', 'sleep $2; : corral-test-' .. 'killed-$1' })
        print(code, pc.take_ran_out())" &
      p=$! i=0 k=
      while [ "$2" != 0 ] && [ $i -lt 200 ] && [ -z "$k" ]; do
        k=$(pgrep -f -- "corral-test-killed-$1\$"); [ -n "$k" ] || sleep 0.02; i=$((i+1))
      done
      [ -z "$k" ] || kill -KILL $k
      wait $p]]
    local out = h.capture({ "sh", "-c", script, host, tostring(core.proc.getpid()), "5" })
    assert.matches("^137\ta probe's child was killed by signal 9, which it did not raise itself\n$", out)
    out = h.capture({ "sh", "-c", script, host, tostring(core.proc.getpid()), "0" })
    assert.are.equal("0\tnil\n", out)
  end)

  it("the rule: each resource errno and its text, and a kill from outside, are transient; a fault, " ..
    "EPERM and EROFS are not", function()
    local transient = require "corral.transient"
    assert.are.equal("this process ran out of file descriptors", transient.of(core.errno.EMFILE))
    assert.are.equal("the system ran out of open files", transient.of("open: Too many open files in system"))
    assert.are.equal("this process ran out of file descriptors", transient.of("tmpfs: No file descriptors available"))
    for _, e in ipairs({ "ENOMEM", "ENOSPC", "EDQUOT", "EAGAIN", "ENOBUFS", "ENFILE" }) do
      assert.is_string(transient.of(core.errno[e]), e)
    end
    assert.is_nil(transient.of(core.errno.EPERM))
    assert.is_nil(transient.of("mkdir: Read-only file system"))
    assert.matches("signal 9", transient.killed(128 + 9))
    assert.is_nil(transient.killed(128 + 31)) -- SIGSYS: a seccomp kill is the child's own doing
    assert.is_nil(transient.killed(1))
    local errors = require "corral.errors"
    local e = errors.cannot_enforce("filesystem_confinement", "spawn: build root: Too many open files")
    assert.is_true(errors.is(e, "resource"))
    assert.is_true(errors.is(errors.cannot_enforce("seccomp", "x: Operation not permitted"), "cannot_enforce"))
    -- a sandbox's first process killed from outside before its release (core.spawn's
    -- words): a setup failure naming the signal; one it raised itself is not transient
    local killed = errors.cannot_enforce("filesystem_confinement",
      "spawn: release child (it was killed by signal 9 first): Broken pipe", core.errno.EPIPE)
    assert.is_true(errors.is(killed, "resource"))
    assert.matches("killed by signal 9 before it was released; " .. NOT_LACKED, tostring(killed))
    assert.is_true(errors.is(errors.cannot_enforce("filesystem_confinement",
      "spawn: release child (it was killed by signal 11 first): Broken pipe", core.errno.EPIPE), "cannot_enforce"))
  end)
end)
