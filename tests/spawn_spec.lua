-- core.spawn.start: a failed setup step never execs, and its step and errno come back.
local core = require "corral.core"
local h = require "helpers"

describe("core.spawn.start #root", function()
  local dir
  before_each(function()
    dir = h.tmpdir("spawn")
    os.execute("chmod 0777 " .. dir)
  end)
  after_each(function() h.rmrf(dir) end)

  local function plan(src)
    local binds = { { src = "/usr", dest = "/usr" }, { src = src, dest = "/out", rw = true } }
    return { path = "/usr/bin/sh", argv = { "sh", "-c", "echo ran > /out/marker" }, env = { "PATH=/usr/bin" },
      cwd = "/", new_net = true, uid = 65534, gid = 65534, binds = binds,
      symlinks = { { target = "usr/bin", path = "/bin" }, { target = "usr/lib", path = "/lib" },
                   { target = "usr/lib64", path = "/lib64" } },
      proc = true, dev = true, seccomp = true }
  end

  it("runs the plan (control): the command writes its marker", function()
    local p = assert(core.spawn.start(plan(dir)))
    assert.are.equal(0, (p:wait(5)))
    assert.are.equal("ran\n", h.read(dir .. "/marker"))
  end)

  it("reports a failed step with its name and errno, and runs nothing", function()
    local p, msg, errno = core.spawn.start(plan(dir .. "/missing"))
    local step = msg and msg:match("^spawn: (.-): ")
    assert.is_nil(p)
    assert.are.equal("build root", step)
    assert.are.equal(core.errno.ENOENT, errno)
    assert.matches("build root", msg)
    assert.is_nil(h.read(dir .. "/marker"))
    p = assert(core.spawn.start(plan(dir))) -- control, after: the same plan with its bind present runs
    assert.are.equal(0, (p:wait(5)))
    assert.are.equal("ran\n", h.read(dir .. "/marker"))
  end)

  it("reports an exec failure as the exec step", function()
    local pl = plan(dir)
    pl.path = "/usr/bin/no-such-program"
    local p, msg, errno = core.spawn.start(pl)
    local step = msg and msg:match("^spawn: (.-): ")
    assert.is_nil(p)
    assert.are.equal("exec", step)
    assert.are.equal(core.errno.ENOENT, errno)
    assert.is_nil(h.read(dir .. "/marker"))
    p = assert(core.spawn.start(plan(dir))) -- control, after: the same plan with a real program runs
    assert.are.equal(0, (p:wait(5)))
    assert.are.equal("ran\n", h.read(dir .. "/marker"))
  end)

  it("calls plan.meanwhile once, before it returns, while the init builds the root", function()
    local pl, calls = plan(dir), 0
    pl.meanwhile = function() calls = calls + 1 end
    local p = assert(core.spawn.start(pl))
    assert.are.equal(1, calls) -- before start returned: the caller's work overlapped the set-up
    assert.are.equal(0, (p:wait(5)))
    assert.are.equal("ran\n", h.read(dir .. "/marker"))
    -- an error it raises stays its own: the spawn goes on (the caller keeps what it needs)
    os.remove(dir .. "/marker")
    pl.meanwhile = function() calls = calls + 1 error("meanwhile failed") end
    p = assert(core.spawn.start(pl))
    assert.are.equal(2, calls)
    assert.are.equal(0, (p:wait(5)))
    assert.are.equal("ran\n", h.read(dir .. "/marker"))
  end)

  it("starts the command as pid 2 under its init, every capability set empty", function()
    local pl = plan(dir)
    pl.argv = { "sh", "-c", "{ echo pid=$$; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status; " ..
      "cat /proc/1/comm; ls /proc | grep -c '^[0-9]'; } > /out/status" }
    local p = assert(core.spawn.start(pl))
    assert.are.equal(0, (p:wait(5)))
    local out = h.read(dir .. "/status")
    assert.matches("^pid=2\n", out)
    for _, set in ipairs({ "Inh", "Prm", "Eff", "Bnd", "Amb" }) do
      assert.matches("\nCap" .. set .. ":%s+0000000000000000\n", out, nil, set)
    end
    -- the init, and the command (the grep and ls run as its children): two processes more
    assert.matches("\ncorral%-init\n[2-4]\n$", out)
  end)

  it("hands the command no signal the caller ignores or blocks: each is at its default", function()
    -- SIGPIPE, SIGUSR1 and SIGHUP ignored by the caller (and corral run blocks SIGTERM itself)
    local script = "trap '' PIPE USR1 HUP; exec \"$@\""
    local out, status = h.sh(script, h.host, "run", "--", "grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status")
    assert.are.equal(0, status, out)
    local THREE = 0x1201 -- SIGHUP (1), SIGUSR1 (10), SIGPIPE (13): bit n - 1 each
    local function ignored(text) return tonumber(text:match("SigIgn:%s+(%x+)") or "", 16) end
    assert.matches("SigBlk:%s+0000000000000000\n", out)
    assert.are.equal(0, ignored(out) & THREE, out)
    -- control, after: without corral the same command inherits the three as ignored
    out, status = h.sh(script, "grep", "-E", "^SigIgn:", "/proc/self/status")
    assert.are.equal(0, status, out)
    assert.are.equal(THREE, ignored(out) & THREE, out)
  end)

  -- A spawner that clones a sandbox holds that sandbox's owner ids for the clone; killed
  -- then, its parent-death SIGKILL to its other sandboxes' inits must still land (it is
  -- checked as a signal from the ids the spawner died with).
  it("a spawner SIGKILLed while it clones under one owner's ids takes another owner's sandbox with it", function()
    local script = [[
      local core = require "corral.core"
      local function plan(uid, cmd)
        return { path = "/usr/bin/sh", argv = { "sh", "-c", cmd }, env = { "PATH=/usr/bin" }, cwd = "/",
          new_net = true, uid = uid, gid = uid, binds = { { src = "/usr", dest = "/usr" } },
          symlinks = { { target = "usr/lib", path = "/lib" }, { target = "usr/lib64", path = "/lib64" } } }
      end
      local a = assert(core.spawn.start(plan(2000000101, "sleep 60")))
      io.stdout:write(a:pid(), "\n")
      io.stdout:flush()
      while true do -- sandboxes of another owner, one after the other, until killed
        local b = core.spawn.start(plan(2000000102, "true"))
        if b then b:wait() b:close() end
      end]]
    local function alive(pid)
      local stat = h.read("/proc/" .. pid .. "/stat")
      return stat ~= nil and not stat:match("^%d+ %b() [ZX]")
    end
    local outlived, killed = {}, 0
    for i = 1, 12 do
      local out = dir .. "/spawner-" .. i
      local f = assert(io.open(out, "w"))
      local spawner = assert(core.spawn.start({ plain = true, path = h.host_program,
        argv = { h.host_program, "-e", script }, env = { "PATH=/usr/bin:/bin" }, stdout = f }))
      f:close()
      local init
      h.wait_for(function()
        init = tonumber((h.read(out) or ""):match("^(%d+)\n"))
        return init
      end, 10)
      assert.truthy(init, "the spawner never started its first sandbox")
      assert.is_true(alive(init)) -- control: the first sandbox runs while its spawner lives
      os.execute("sleep 0." .. (1 + i % 3)) -- into its loop of clones under the other owner
      spawner:kill(9)
      spawner:wait()
      spawner:close()
      killed = killed + 1
      if not h.wait_for(function() return not alive(init) end, 5) then
        outlived[#outlived + 1] = init
        core.proc.kill(init, 9)
      end
    end
    assert.are.equal(12, killed)
    assert.are.same({}, outlived, "inits that outlived their SIGKILLed spawner")
  end)

  -- The child waits for its release while the spawner attaches it to its cgroups. Here
  -- the "cgroup.procs" is a full FIFO: the spawner's write of the pid waits while a helper
  -- kills the child, then lets the write through, so the release meets a child that is gone.
  it("a child killed before its release fails the spawn with how it ended; the spawner lives on", function()
    local fifo, ready = dir .. "/procs", dir .. "/ready"
    assert(os.execute("mkfifo " .. fifo))
    local script = string.format("local fifo, ready = %q, %q\n", fifo, ready) .. [[
      local core = require "corral.core"
      while not io.open(ready) do core.io.poll({}, 0.01) end
      local p, msg = core.spawn.start({ path = "/usr/bin/sh", argv = { "sh", "-c", "true" }, env = {}, cwd = "/",
        new_net = true, uid = 65534, gid = 65534, binds = { { src = "/usr", dest = "/usr" } },
        symlinks = { { target = "usr/lib", path = "/lib" }, { target = "usr/lib64", path = "/lib64" } },
        cgroup_procs = { fifo } })
      print(p and "started" or msg)]]
    local out = dir .. "/spawner.out"
    local f = assert(io.open(out, "w"))
    local spawner = assert(core.spawn.start({ plain = true, path = h.host_program,
      argv = { h.host_program, "-e", script }, env = { "PATH=/usr/bin:/bin" }, stdout = f }))
    f:close()
    local helper = assert(core.spawn.start({ plain = true, path = "/bin/sh", env = { "PATH=/usr/bin:/bin" },
      argv = { "sh", "-c", [[
        exec 3<>"$1"
        head -c 65536 /dev/zero >&3
        touch "$3"
        until pid=$(pgrep -P "$2" -x corral-init); do sleep 0.01; done
        kill -9 "$pid"
        until [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" = Z ]; do sleep 0.01; done
        dd of=/dev/null bs=65536 count=1 <&3 2>/dev/null]], "helper", fifo, tostring(spawner:pid()), ready } }))
    local helped = helper:wait(20)
    local code = spawner:wait(20)
    spawner:close()
    helper:close()
    assert.are.equal(0, helped, "the helper did not kill the child before its release")
    -- the spawner was not ended by SIGPIPE (128 + 13): the spawn failed, and said how
    assert.are.equal(0, code, h.read(out))
    assert.matches("^spawn: release child %(it was killed by signal 9 first%)", h.read(out))
  end)

  it("fails a timed wait with the three values of every binding, ETIMEDOUT", function()
    local pl = plan(dir)
    pl.argv = { "sh", "-c", "sleep 5" }
    local p <close> = assert(core.spawn.start(pl))
    local code, msg, errno = p:wait(0.1)
    assert.is_nil(code)
    assert.matches("^wait: ", msg)
    assert.are.equal(core.errno.ETIMEDOUT, errno)
    assert.is_true(p:running())
    p:kill()
    assert.is_number((p:wait(5))) -- control: the same process, once killed, is waited for
  end)
end)
