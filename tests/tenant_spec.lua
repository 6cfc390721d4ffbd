-- Tenant sandboxes under the `native` and `bwrap` mechanisms: every breach attempt
-- runs first, then a control that must still succeed in the same sandbox, in the same run
-- (a sandbox killed by its own attempt never shows the control).
local corral = require "corral"
local h = require "helpers"

local SECRET = "sibling-storage-secret-91c2"

for _, mech_name in ipairs({ "native", "bwrap" }) do
  describe(mech_name .. " tenant sandbox #root", function()
    local mech, root, sb, sibling, n = nil, nil, nil, nil, 0

    local function new_sandbox(extra)
      n = n + 1
      local t = { id = "t" .. n, storage_root = root }
      for k, v in pairs(extra or {}) do t[k] = v end
      local s = assert(corral.sandbox(t))
      assert(corral.provision(mech, s))
      return s
    end

    local function run(s, script, opts)
      local out_path = root .. "/out-" .. s.id .. "-" .. math.random(1e9)
      local result = assert(corral.exec(mech, s, { "/bin/sh", "-c", script }, { output = out_path,
        table.unpack(opts or {}) }))
      local out = h.read(out_path) or ""
      os.remove(out_path)
      return out, result
    end

    before_each(function()
      mech = assert(corral.mechanism.load(mech_name))
      root = h.tmpdir("tenant")
      os.execute("chmod 0711 " .. root)
      sibling = assert(corral.sandbox({ id = "sibling", storage_root = root }))
      assert(corral.provision(mech, sibling))
      h.write(root .. "/sibling/secret", SECRET)
      sb = new_sandbox()
      h.write(root .. "/" .. sb.id .. "/own", "own-data")
      os.execute("chown -R " .. require("corral.sandbox").host_id(sb) .. " " .. root .. "/" .. sb.id)
    end)

    after_each(function()
      corral.destroy(mech, sb)
      corral.destroy(mech, sibling)
      h.rmrf(root)
    end)

    local CONTROL = 'cat /storage/own >/dev/null && echo w > /storage/w && [ "$(cat /storage/w)" = w ] ' ..
      '&& echo control-ok || exit 90; '

    it("runs the control: reads and writes its own storage", function()
      local out, r = run(sb, CONTROL)
      assert.are.equal(0, r.code, out)
      assert.matches("control%-ok", out)
    end)

    local breaches = {
      { "a sibling's storage by host path", 'cat "$1/sibling/secret"' },
      { "..", 'cat /storage/../sibling/secret; cat ../sibling/secret' },
      { "a symlink planted to the sibling", 'cat /storage/link/secret' },
      { "/proc/self/root", 'cat "/proc/self/root$1/sibling/secret"' },
      { "/proc/1/root", 'cat "/proc/1/root$1/sibling/secret"' },
    }
    for _, b in ipairs(breaches) do
      it("denies reading " .. b[1] .. ", then runs the control", function()
        os.execute("ln -s " .. root .. "/sibling " .. root .. "/" .. sb.id .. "/link")
        local out = run(sb, h.attempt_then_control(b[2], CONTROL))
        h.assert_refused(h.after_attempt(out, "control%-ok"), out)
        assert.is_nil(out:find(SECRET, 1, true), out)
      end)
    end

    it("keeps writes outside /storage off the host", function()
      local marker = "corral-marker-" .. math.random(1e9)
      local out = run(sb, h.attempt_then_control('echo x > /usr/' .. marker .. '; echo x > /etc/' .. marker ..
        '; echo x > /' .. marker .. ' 2>/dev/null && echo ROOT-WRITABLE',
        'echo x > /tmp/' .. marker .. ' && echo tmp-private-ok; ' .. CONTROL))
      local _, control = h.after_attempt(out, "control%-ok")
      assert.matches("tmp%-private%-ok", control)
      assert.is_nil(out:find("ROOT-WRITABLE", 1, true), out) -- not even a private, throwaway root
      for _, d in ipairs({ "/usr/", "/etc/", "/", "/tmp/" }) do
        assert.is_nil(h.read(d .. marker), d .. marker .. " reached the host")
      end
    end)

    it("cannot see or signal a host process", function()
      local pid = h.sh("sleep 30 >/dev/null 2>&1 & echo $!"):match("%d+")
      local out = run(sb, h.attempt_then_control('ls /proc | grep -cx "' .. pid .. '"; kill -9 ' .. pid,
        'kill -0 $$ && echo self-signal-ok'))
      local alive = h.sh("kill -0 " .. pid .. " && echo alive")
      os.execute("kill " .. pid .. " 2>/dev/null")
      local rc, _, attempt = h.after_attempt(out, "self%-signal%-ok")
      assert.matches("^0\n", attempt)
      h.assert_refused(rc, out)
      assert.matches("alive", alive)
    end)

    it("cannot mount or enter a nested user namespace; setuid gains nothing", function()
      local out = run(sb, h.attempt_then_control([[
        grep -E '^(CapEff|NoNewPrivs):' /proc/self/status
        mount -t tmpfs none /mnt 2>&1 && echo MOUNTED
        unshare -U true 2>&1 && echo NESTED
        /usr/bin/mount -t tmpfs none /tmp 2>&1 && echo SETUID-MOUNTED]], CONTROL))
      h.after_attempt(out, "control%-ok")
      assert.matches("CapEff:%s+0000000000000000", out)
      assert.matches("NoNewPrivs:%s+1", out)
      assert.is_nil(out:find("MOUNTED", 1, true), out)
      assert.is_nil(out:find("NESTED", 1, true), out)
    end)

    it("never leaves a setuid or setgid file behind, and has no socket family but its own", function()
      local probe = [[
import os, socket
fd = os.open("/storage/plain", os.O_CREAT | os.O_WRONLY, 0o755); os.close(fd)
for mode in (0o4755, 0o2755):
    try: os.chmod("/storage/plain", mode); print("SPECIAL-CHMOD", oct(mode))
    except OSError as e: print("chmod", oct(mode), e.errno)
    try: os.close(os.open("/storage/made-%o" % mode, os.O_CREAT | os.O_WRONLY, mode)); print("SPECIAL-OPEN")
    except OSError as e: print("open", oct(mode), e.errno)
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
how = struct.pack("QQQ", os.O_CREAT | os.O_WRONLY, 0o6755, 0)
r = libc.syscall(437, -100, b"/storage/o2", how, 24)  # openat2: its mode is in memory
print("SPECIAL-OPENAT2" if r >= 0 else "openat2 %d" % ctypes.get_errno())
for fam in (40, 17, 3):  # AF_VSOCK, AF_PACKET, AF_AX25
    try: socket.socket(fam, socket.SOCK_DGRAM); print("FAMILY-OPEN", fam)
    except OSError as e: print("family", fam, e.errno)
print("attempts-done")
fd = os.open("/storage/plain2", os.O_CREAT | os.O_WRONLY, 0o755); os.close(fd); print("create-ok")
os.chmod("/storage/plain", 0o750); print("chmod-ok")
for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
    socket.socket(fam, socket.SOCK_DGRAM).close(); print("family-ok", fam)
]]
      h.write(root .. "/" .. sb.id .. "/probe.py", probe)
      os.execute("chmod 0644 " .. root .. "/" .. sb.id .. "/probe.py")
      local out = run(sb, h.attempt_then_control("/usr/bin/python3 /storage/probe.py", CONTROL))
      assert.are.equal(0, h.after_attempt(out, "control%-ok"), out) -- the probe ran to its end
      -- controls, after the attempts: files and modes in general work, and so do unix,
      -- IPv4 and IPv6 sockets
      assert.is_true(h.in_order(out, { "attempts%-done", "create%-ok", "chmod%-ok", "family%-ok 10" }))
      assert.is_nil(out:find("SPECIAL", 1, true), out)
      assert.is_nil(out:find("FAMILY-OPEN", 1, true), out)
      assert.matches("family 40 97", out) -- EAFNOSUPPORT
      assert.matches("openat2 38", out) -- ENOSYS
      -- and on the host nothing special was left in the storage
      assert.are.equal("", h.sh("find " .. root .. "/" .. sb.id .. " -perm /6000"))
    end)

    it("denies ptrace of another tenant process and TIOCSTI, while harmless ioctls work", function()
      local out = run(sb, h.attempt_then_control([[
        perl -e 'my $c = "x"; ioctl(STDIN, 0x5412, $c) ? print "TIOCSTI-INJECTED\n" : print "tiocsti: $!\n";
                 syscall(101, 16, 1, 0, 0) == 0 ? print "PTRACE-ATTACHED\n" : print "ptrace: $!\n";
                 ioctl(STDIN, 0x541B, my $n = pack("L", 0)) ? print "fionread-ok\n" : print "fionread: $!\n"' \
          < /storage/own]], CONTROL))
      h.after_attempt(out, "control%-ok")
      assert.is_true(h.in_order(out, { "ptrace: ", "fionread%-ok" })) -- control, after both attempts
      assert.matches("tiocsti: Operation not permitted", out)
      assert.matches("ptrace: Operation not permitted", out)
      assert.is_nil(out:find("INJECTED", 1, true))
      assert.is_nil(out:find("ATTACHED", 1, true))
    end)

    it("strips credentials: forbidden variables refused by name, PATH and HOME arrive", function()
      local s, err = corral.sandbox({ id = "envt", storage_root = root, env = { GITHUB_TOKEN = "ghp_x" } })
      assert.is_nil(s)
      assert.are.equal("refused_env", err.code)
      assert.are.equal("GITHUB_TOKEN", err.argument)
      local s2, err2 = corral.sandbox({ id = "envt", storage_root = root,
        env = { DB = "postgres://app:hunter2@db/x" } })
      assert.is_nil(s2)
      assert.are.equal("DB", err2.argument)
      local ok = new_sandbox({ env = { FOO = "bar" } })
      local out = run(ok, 'env | sort')
      corral.destroy(mech, ok)
      assert.matches("PATH=/", out)
      assert.matches("HOME=/storage", out)
      assert.matches("FOO=bar", out)
      for line in out:gmatch("[^\n]+") do
        local name = line:match("^([%w_]+)=")
        if name then assert.is_nil(require("corral.hardening").refusal(name, ""), line) end
      end
    end)

    it("inherits no fd beyond 0-2", function()
      local f = assert(io.open("/etc/hostname")) -- not CLOEXEC in Lua: a real leak candidate
      local out = run(sb, 'ls /proc/self/fd | sort -n | tr "\\n" " "')
      f:close()
      assert.matches("^0 1 2 3 $", out) -- 3 is ls's own directory handle
    end)

    it("has no network", function()
      local lfd, port = assert(corral.core.sock.listen("127.0.0.1", 0))
      local out = run(sb, h.attempt_then_control('cat /proc/net/dev | grep -c ":" ; nc -z -w 1 127.0.0.1 ' ..
        port .. ' && echo REACHED', 'getent hosts localhost >/dev/null && echo lo-name-ok'))
      assert(corral.core.sock.connect("127.0.0.1", port, 1)):close() -- control from the host, after
      lfd:close()
      local _, _, attempt = h.after_attempt(out, "lo%-name%-ok")
      assert.is_nil(out:find("REACHED", 1, true))
      assert.matches("^1\n", attempt) -- only lo
    end)

    it("contains a fork bomb with the pids cap; the host stays responsive", function()
      local s = new_sandbox({ limits = { pids = 24 } })
      -- Each refused fork is a "Cannot fork" line from sh: expected, so kept off the run's output.
      assert(corral.start(mech, s, { "sh", "-c", "exec 2>/dev/null; bomb() { bomb | bomb & }; bomb; sleep 30" }))
      os.execute("sleep 1") -- let it spread
      local dir
      for _, p in ipairs(mech.cgroup_paths(s)) do if p:find("/pids/", 1, true) then dir = p end end
      local current = tonumber(h.read(dir .. "/pids.current") or "")
      local refused = tonumber((h.read(dir .. "/pids.events") or ""):match("max (%d+)"))
      -- the host forks freely meanwhile: none of 20 shells is refused
      for _ = 1, 20 do assert.matches("ok", h.sh("echo ok")) end
      corral.destroy(mech, s)
      -- control: the bomb did reach the cap (the kernel counted refused forks) …
      assert.truthy(refused and refused > 0, "the bomb never reached the cap")
      -- … and never went past it
      assert.truthy(current and current <= 24, "pids.current " .. tostring(current))
    end)

    it("gives the tenant a terminal of its own: none of the host's ptys is listed; control: openpty works " ..
      "and carries a line, after the attempt", function()
      -- a pty the host holds open meanwhile, so the host's devpts has one to leak
      local hold = io.popen("exec /usr/bin/python3 -c 'import os, time; m, s = os.openpty(); " ..
        "print(os.getpid(), os.ttyname(s), flush=True); time.sleep(30)'", "r")
      local holder, host_pty = (hold:read("l") or ""):match("^(%d+) (/dev/pts/%d+)$")
      finally(function()
        if holder then corral.core.proc.kill(tonumber(holder)) end
        hold:close()
      end)
      assert.truthy(host_pty, "the host could not open a pty")
      local out, r = run(sb, h.attempt_then_control("ls -A /dev/pts | tr '\\n' ' '; echo; ls " .. host_pty,
        [[/usr/bin/python3 -c 'import os
m, s = os.openpty()
os.write(m, b"ping\n")
print("pty-ok", os.ttyname(s), os.read(s, 16))']]))
      assert.are.equal(0, r.code, out)
      local _, control, attempt = h.after_attempt(out, "pty%-ok /dev/pts/0 b'ping\\n'")
      assert.matches("^ptmx \n", attempt) -- the tenant's own instance: its multiplexer alone
      assert.matches("No such file", attempt)
      assert.matches("pty%-ok", control)
    end)

    it("kills a memory hog at its cap, and a smaller allocation succeeds after it", function()
      local s = new_sandbox({ limits = { memory = "48M" } })
      local _, r = run(s, 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo BIG ${#x}')
      local out, r2 = run(s, 'x=$(head -c 8000000 /dev/zero | tr "\\0" a); echo small-ok ${#x}')
      corral.destroy(mech, s)
      assert.are.equal("memory", r.limit)
      assert.matches("small%-ok 8000000", out) -- control: the same sandbox, after the kill
      assert.is_nil(r2.limit)
    end)

    it("--wall kills on time, and a command within it finishes after that", function()
      local s = new_sandbox({ limits = { wall = 1 } })
      local _, r = run(s, 'sleep 10')
      local out, r2 = run(s, 'echo quick')
      corral.destroy(mech, s)
      assert.are.equal("wall", r.limit)
      assert.are.equal(0, r2.code) -- control: the same sandbox, after the kill
      assert.matches("quick", out)
    end)

    it("dies with its parent: killing `corral run` kills the tree", function()
      local num = tostring(math.random(1e9))
      local tag = "corral-orphan-" .. num
      local pattern = "corral-orpha[n]-" .. num -- does not match the pgrep's own shell
      -- Its own --storage under the test's root: a SIGKILLed run cannot remove a temporary one.
      local pid = h.sh(h.host .. " run --mechanism " .. mech_name .. " --storage " .. root .. "/" .. tag ..
        " -- sh -c 'sleep 60 # " .. tag .. "' >/dev/null 2>&1 & echo $!"):match("%d+")
      assert(h.wait_for(function() return h.sh("pgrep -f '" .. pattern .. "'"):match("%d") ~= nil end, 5),
        "control: the tenant never started")
      os.execute("kill -9 " .. pid)
      assert(h.wait_for(function() return h.sh("pgrep -f '" .. pattern .. "'"):match("%d") == nil end, 5),
        "the tenant outlived its parent")
    end)

    if mech_name == "native" then
      it("charges the tenant's per-user kernel counts to its own host id, not root's", function()
        -- inotify instances are counted per user up the user-namespace chain, to each
        -- namespace's owner. The tenant takes all it may (128 here); root on the host
        -- must still get one meanwhile.
        local grab = [[
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init1(0) >= 0:
    n += 1
print("tenant-instances", n, "errno", ctypes.get_errno(), flush=True)
time.sleep(3)
]]
        -- a workspace of its own: root holds other sandboxes' storages, which no workspace may
        local ws = root .. "/ws"
        assert(corral.core.fs.mkdir(ws, tonumber("755", 8)))
        h.write(ws .. "/grab.py", grab)
        os.execute("chmod 0644 " .. ws .. "/grab.py")
        local out_path = root .. "/grab.out"
        local pid = h.sh(h.host .. " run --nofile 4096 --workspace " .. ws .. " -- /usr/bin/python3 " ..
          "/workspace/grab.py >" .. out_path .. " 2>&1 & echo $!"):match("%d+")
        assert(h.wait_for(function() return (h.read(out_path) or ""):find("tenant%-instances") ~= nil end, 10),
          "control: the tenant never reported")
        local host = h.sh("/usr/bin/python3 -c 'import ctypes; l = ctypes.CDLL(None); " ..
          "print(\"host-fd\", l.inotify_init1(0))'")
        os.execute("kill " .. pid .. " 2>/dev/null")
        local out = h.read(out_path)
        local grabbed = tonumber(out:match("tenant%-instances (%d+)"))
        assert.truthy(grabbed and grabbed > 0, out) -- control: the tenant did create instances
        assert.matches("errno 24", out) -- and stopped at its limit (EMFILE), not elsewhere
        assert.truthy(tonumber(host:match("host%-fd (%-?%d+)")) >= 0, host)
      end)

      it("gives the tenant its own loopback, and nothing beyond it", function()
        local lfd, port = require("corral.core").sock.listen("127.0.0.1", 0)
        assert(lfd, port)
        local out = run(sb, h.attempt_then_control([[
          socat -T 2 - TCP:127.0.0.1:]] .. port .. [[ </dev/null && echo HOST-LOOPBACK-REACHED]], [[
          socat TCP-LISTEN:8080,bind=127.0.0.1 SYSTEM:'echo own-loopback' & sleep 0.3
          socat -T 2 - TCP:127.0.0.1:8080 </dev/null
          ]] .. CONTROL))
        lfd:close()
        local _, control = h.after_attempt(out, "control%-ok")
        assert.matches("own%-loopback", control) -- control: its own 127.0.0.1 works
        assert.is_nil(out:find("HOST-LOOPBACK-REACHED", 1, true), out)
      end)

      it("shows the tenant neither the host's command line nor its fds through its init", function()
        local num = tostring(math.random(1e9))
        local tag = "corral-initfds-" .. num
        local out_path = root .. "/" .. tag .. ".out"
        local pid = h.sh(h.host .. " run --storage " .. root .. "/" .. tag .. " --resolve secret-" .. num ..
          ".test=10.9.9.9 --allow secret-" .. num .. ".test -- sh -c 'tr \"\\0\" \" \" < /proc/1/cmdline; " ..
          "echo; sleep 2 # " .. tag .. "' >" .. out_path .. " 2>&1 & echo $!"):match("%d+")
        -- The tenant's parent is the init; the host and its launching shell carry the tag too.
        local init
        assert(h.wait_for(function()
          init = h.sh("for p in $(pgrep -f 'corral-initfd[s]-" .. num .. "'); do " ..
            "q=$(ps -o ppid= -p $p | tr -d ' '); " ..
            "[ \"$(cat /proc/$q/comm 2>/dev/null)\" = corral-init ] && echo $q; done"):match("%d+")
          return init ~= nil and h.read(out_path) ~= ""
        end, 5), "control: the tenant never started")
        local fds = h.sh("ls /proc/" .. init .. "/fd")
        local host_fds = h.sh("ls /proc/" .. pid .. "/fd") -- control: the host holds its plane's fds
        os.execute("wait; sleep 0; kill " .. pid .. " 2>/dev/null")
        assert(h.wait_for(function() return not h.sh("ps -p " .. pid .. " -o pid="):match("%d") end, 5))
        local out = h.read(out_path)
        assert.matches("corral%-init", out) -- control: the tenant did read its init's command line
        assert.is_nil(out:find("secret-" .. num, 1, true), out)
        assert.is_nil(out:find("10.9.9.9", 1, true), out)
        local init_fds = 0
        for _ in fds:gmatch("%d+") do init_fds = init_fds + 1 end
        assert.are.equal(3, init_fds, fds) -- 0, 1, 2 and nothing of the host's
        local hn = 0
        for _ in host_fds:gmatch("%d+") do hn = hn + 1 end
        assert.truthy(hn > 3, host_fds)
      end)

      it("runs exec inside a started sandbox: same pid namespace and /tmp; a fresh one otherwise", function()
        local function exec_out(s)
          local out_path = root .. "/exec-out"
          local r = assert(corral.exec(mech, s, { "sh", "-c",
            "cat /tmp/marker 2>/dev/null || echo no-marker; ls /proc | grep -c '^[0-9]'" }, { output = out_path }))
          assert.are.equal(0, r.code)
          return h.read(out_path)
        end
        assert.matches("no%-marker", exec_out(sb)) -- control: nothing started yet
        assert(corral.start(mech, sb, { "sh", "-c", "echo started > /tmp/marker; sleep 30" }))
        assert(h.wait_for(function() return exec_out(sb):match("^started") ~= nil end, 3))
        local out = exec_out(sb)
        local procs = tonumber(out:match("\n(%d+)"))
        assert.truthy(procs >= 4, out) -- its init, sh, sleep and our own processes
        corral.stop(mech, sb)
        assert.matches("no%-marker", exec_out(sb)) -- stopped: a fresh sandbox again
      end)
    end

    -- #alone (scripts/shard-specs): it counts the host's mounts, which `ip netns add` elsewhere changes
    it("leaves no cgroup, mount or process behind after destroy or a failed start #alone", function()
      local mounts = h.sh("wc -l < /proc/self/mountinfo")
      local s = new_sandbox({ limits = { pids = 16 } })
      local paths = mech_name == "native" and mech.cgroup_paths(s) or {}
      local _, r = run(s, 'exit 3')
      assert.are.equal(3, r.code)
      -- the failed exec step is the tenant's failure, reported as a shell does (bwrap:
      -- found missing before bubblewrap starts, which would say 1)
      local bad, err = corral.exec(mech, s, { "/nonexistent/program" })
      assert.is_nil(err)
      assert.are.equal(127, bad.code)
      assert.matches("exec: No such file", bad.error)
      for _, p in pairs(paths) do assert.are.equal("", h.read(p .. "/cgroup.procs")) end
      corral.destroy(mech, s)
      for _, p in pairs(paths) do assert.is_nil(io.open(p .. "/cgroup.procs"), p .. " left behind") end
      assert.are.equal(mounts, h.sh("wc -l < /proc/self/mountinfo"))
      assert.are.equal("absent", corral.status(mech, s))
    end)
  end)
end

describe("corral run cleans up #root", function()
  local function own_pids_cgroup()
    local info = corral.core.cgroup.info()
    return info.paths.pids or info.paths.unified
  end
  -- `corral run --pids 16 --storage DIR -- sh -c script` in a session of its own; once the
  -- command has written /storage/up, corral is sent sig. Answers corral's status and the
  -- storage directory, where the command's handlers leave their evidence.
  local function signalled_run(name, script, sig, mechanism)
    local root = h.tmpdir("signalled")
    os.execute("chmod 0711 " .. root)
    local dir = root .. "/" .. name
    local devnull = assert(io.open("/dev/null", "r+"))
    local p = assert(corral.core.spawn.start({ plain = true, new_session = true, path = h.host,
      argv = { h.host, "run", "--mechanism", mechanism or "native", "--pids", "16", "--storage", dir, "--",
        "/bin/sh", "-c", script },
      env = { "PATH=" .. h.PATH }, stdin = devnull, stdout = devnull, stderr = devnull }))
    devnull:close()
    local pid = p:pid()
    local up = h.wait_for(function() return h.read(dir .. "/up") end, 20)
    local cgroups_of = "ls -d " .. own_pids_cgroup() .. "/corral-" .. pid .. "-* 2>/dev/null"
    local running = h.sh(cgroups_of)
    p:kill(sig)
    local code = p:wait(30) -- past the grace: corral's status tells how it ended
    if not code then p:kill(); p:wait() end
    p:close()
    assert.truthy(up, name .. ": the command never started")
    -- the cgroups this corral made (corral-<pid>-<n>), there while it ran: others' runs
    -- come and go beside them
    assert.are_not.equal("", running, name .. ": no cgroup of the run's own to check")
    local cgroups = h.sh(cgroups_of)
    return code, dir, function() h.rmrf(root) end, cgroups
  end

  -- the processes of a run whose storage is dir: its shell's command line names no dir,
  -- so those whose cwd is it (the command runs in /storage)
  local function sandbox_processes_of(dir)
    local st = corral.core.fs.lstat(dir)
    return h.sh("for p in /proc/[0-9]*; do [ \"$(stat -Lc %d:%i $p/cwd 2>/dev/null)\" = " ..
      h.quote(st and (st.dev .. ":" .. st.ino) or "none") .. " ] && echo ${p#/proc/}; done; true")
  end

  local function sandbox_processes(tag)
    return h.sh("pgrep -f " .. h.quote("^sleep " .. tag .. "$") .. " || true")
  end

  for _, mechanism in ipairs({ "native", "bwrap" }) do
    it("ends a run whose command ignores a forwarded SIGTERM with 143, leaving nothing; " ..
      "control: a command that handles it exits with its own status (" .. mechanism .. ")", function()
      -- attempt: SIGTERM ignored by the shell and the sleep it starts; only the grace ends it
      local code, _, clean, cgroups = signalled_run("ignored", "trap '' TERM; echo up > /storage/up; sleep 31.41",
        15, mechanism)
      clean()
      assert.are.equal(128 + 15, code)
      assert.are.equal("", sandbox_processes("31.41"))
      assert.are.equal("", cgroups)
      -- control: the handler runs and its status is the run's (under bwrap, the signal
      -- goes to the command, not to bubblewrap, which would die of it first)
      local dir
      code, dir, clean, cgroups = signalled_run("handled",
        "trap 'echo handled > /storage/handled; exit 7' TERM; echo up > /storage/up; sleep 31.42 & wait", 15,
        mechanism)
      local handled = h.read(dir .. "/handled")
      clean()
      assert.are.equal(7, code)
      assert.are.equal("handled\n", handled)
      assert.are.equal("", sandbox_processes("31.42"))
      assert.are.equal("", cgroups)
    end)
  end

  -- `corral run --pids 16 --storage DIR -- sh -c script` left running in a session of its
  -- own (its storage removed when the test ends); answers the process and DIR.
  local function background_run(mechanism, tag, script)
    local root = h.tmpdir(tag)
    os.execute("chmod 0711 " .. root)
    finally(function() h.rmrf(root) end)
    local dir = root .. "/int"
    local devnull = assert(io.open("/dev/null", "r+"))
    local p = assert(corral.core.spawn.start({ plain = true, new_session = true, path = h.host,
      argv = { h.host, "run", "--mechanism", mechanism, "--pids", "16", "--storage", dir, "--", "/bin/sh", "-c",
        script },
      env = { "PATH=" .. h.PATH }, stdin = devnull, stdout = devnull, stderr = devnull }))
    devnull:close()
    return p, dir
  end

  for _, mechanism in ipairs({ "native", "bwrap" }) do
    it("ends a run whose every process ignores Ctrl-C after the grace of the first one, with 130, leaving " ..
      "nothing; control: the same run with a handler keeps running (" .. mechanism .. ")", function()
      -- attempt: one SIGINT that nothing in the sandbox would ever act on
      local code, _, clean, cgroups = signalled_run("ignored-int",
        "trap '' INT; echo up > /storage/up; sleep 31.43", 2, mechanism)
      clean()
      assert.are.equal(128 + 2, code)
      assert.are.equal("", sandbox_processes("31.43"))
      assert.are.equal("", cgroups)
      -- control: a handler in the shell, the same single SIGINT: still running past the grace
      local p, dir = background_run(mechanism, "int-handled",
        "trap 'echo x > /storage/got' INT; echo up > /storage/up; sleep 31.44 & wait; wait")
      local up = h.wait_for(function() return h.read(dir .. "/up") end, 20)
      p:kill(2)
      os.execute("sleep 4")
      local running = p:running()
      p:kill(15)
      if not p:wait(20) then p:kill(); p:wait() end
      p:close()
      assert.truthy(up, "the command never started")
      assert.is_true(running, "one Ctrl-C a handler took ended the run")
      assert.are.equal("", sandbox_processes("31.44"))
    end)
  end

  for _, mechanism in ipairs({ "native", "bwrap" }) do
    it("keeps a command that handles one Ctrl-C running past the grace; control: a second Ctrl-C ends it " ..
      "with 130, leaving nothing (" .. mechanism .. ")", function()
      local p, dir = background_run(mechanism, "interrupted",
        "trap 'echo x >> /storage/got' INT; echo up > /storage/up; while :; do sleep 0.1; done")
      local function handled(n)
        return h.wait_for(function() return select(2, (h.read(dir .. "/got") or ""):gsub("x\n", "")) >= n end, 10)
      end
      local up = h.wait_for(function() return h.read(dir .. "/up") end, 20)
      p:kill(2)
      local once = handled(1)
      os.execute("sleep 4") -- past the 3 s grace a first signal used to start
      local running = p:running()
      p:kill(2)
      local code = p:wait(20)
      if not code then p:kill(); p:wait() end
      p:close()
      assert.truthy(up, "the command never started")
      assert.truthy(once, "the command never handled the first Ctrl-C")
      assert.is_true(running, "one Ctrl-C the command handled ended the run")
      assert.truthy(handled(2), "the second Ctrl-C never reached the command")
      assert.are.equal(128 + 2, code)
      assert.are.equal("", sandbox_processes_of(dir))
    end)
  end

  it("forwards Ctrl-C to the command's whole job, as a terminal does: a shell's own child gets it; " ..
    "control: unsignalled, the same shells run to their end", function()
    -- attempt: the outer shell defers SIGINT while its child runs; told by pid alone, the
    -- inner shell never hears it and only the grace would end the run
    local inner = [[trap 'echo inner-got-INT > /storage/inner; exit 5' INT; echo up > /storage/up; ]] ..
      [[while :; do sleep 0.1; done]]
    local code, dir, clean = signalled_run("job", "sh -c " .. h.quote(inner) ..
      "; echo \"outer=$?\" > /storage/outer", 2)
    local got = h.read(dir .. "/inner")
    clean()
    assert.are.equal("inner-got-INT\n", got)
    assert.are.equal(128 + 2, code)
    -- control: the same command, unsignalled, runs to its end
    local out, status = h.corral("run", "--", "/bin/sh", "-c", "sh -c 'exit 5'; echo \"outer=$?\"")
    assert.are.equal(0, status, out)
    assert.matches("outer=5", out)
  end)

  it("sweeps empty cgroups a killed corral left, never a live one's", function()
    local base = own_pids_cgroup()
    local dead = h.sh("sh -c 'echo $$'"):match("%d+") -- a pid that has exited
    local stale, live = base .. "/corral-" .. dead .. "-77", base .. "/corral-" .. corral.core.proc.getpid() .. "-77"
    assert(os.execute("mkdir " .. stale .. " " .. live))
    local out, status = h.corral("run", "--pids", "16", "--", "true")
    local stale_left, live_left = io.open(stale .. "/cgroup.procs"), io.open(live .. "/cgroup.procs")
    os.execute("rmdir " .. live .. " " .. stale .. " 2>/dev/null")
    assert.are.equal(0, status, out)
    assert.is_nil(stale_left, "the stale cgroup was not swept")
    assert.truthy(live_left, "a live process's cgroup was removed")
    live_left:close()
  end)
end)

describe("the tenant's terminal type #root", function()
  it("passes the caller's TERM, a name and no credential, and nothing credential-shaped beside it; " ..
    "control: a TERM that is no plain terminfo name stays dumb", function()
    local script = "echo term=$TERM token=${GITHUB_TOKEN-unset}"
    local out, rc = h.sh("exec env TERM=xterm-256color GITHUB_TOKEN=ghp_leak123 " .. h.quote(h.host) ..
      " run -- sh -c " .. h.quote(script))
    assert.are.equal(0, rc, out)
    assert.matches("term=xterm%-256color token=unset", out)
    assert.not_matches("ghp_leak123", out)
    out, rc = h.sh("exec env 'TERM=xterm;id' " .. h.quote(h.host) .. " run -- sh -c " .. h.quote(script))
    assert.are.equal(0, rc, out)
    assert.matches("term=dumb token=unset", out)
  end)
end)

describe("host ids #root", function()
  it("refuses a sandbox whose host id another process already runs as", function()
    local root = h.tmpdir("hostid")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "held", storage_root = root }))
    local id = require("corral.sandbox").host_id(sb)
    -- setpriv execs sleep itself: one process, the one whose pid $! gives
    local pid = h.sh("setpriv --reuid=" .. id .. " --regid=" .. id .. " --clear-groups sleep 30 " ..
      ">/dev/null 2>&1 & echo $!"):match("%d+")
    assert(h.wait_for(function() return h.sh("ps -o user= -p " .. pid):match(tostring(id)) ~= nil end, 3))
    local ok, err = corral.provision("native", sb)
    os.execute("kill " .. pid)
    assert.is_nil(ok)
    assert.are.equal("invalid_argument", err.code)
    assert.matches("already held by process " .. pid, err.detail)
    assert(h.wait_for(function() return not h.sh("ps -p " .. pid .. " -o stat="):match("[^Z%s]") end, 3))
    ok, err = corral.provision("native", sb) -- control: once the id is free, it provisions
    assert.truthy(ok, tostring(err))
    corral.destroy("native", sb)
    h.rmrf(root)
  end)
end)

describe("the gate", function()
  local function fake(required, constructed, log)
    return {
      required_capabilities = function() return required end,
      constructed_capabilities = function() return constructed end,
      provision = function() log[#log + 1] = "provision"; return true end,
      start = function() return true end, exec = function() return { code = 0 } end,
      stop = function() return true end, destroy = function() return true end,
      status = function() return "provisioned" end,
    }
  end
  local sb = assert(corral.sandbox({ id = "gate", storage_root = "/tmp/corral-gate" }))

  it("admits a mechanism whose requirement the probe establishes (control)", function()
    local log = {}
    assert.is_true(corral.provision(fake({ "filesystem_confinement" }, {}, log), sb))
    assert.are.same({ "provision" }, log)
  end)

  -- disk_quota is absent for an unprivileged caller (no loop device of its own), so the
  -- gate is asked by one: the refusal, then, in the same process, a mechanism that
  -- constructs it as the control
  it("refuses a mechanism requiring a capability the probe reports absent, naming it; admits one that " ..
    "constructs it", function()
    local script = [[
local corral = require "corral"
local function fake(required, constructed, log)
  return { required_capabilities = function() return required end,
    constructed_capabilities = function() return constructed end,
    provision = function() log[#log + 1] = "provision"; return true end,
    start = function() return true end, exec = function() return { code = 0 } end,
    stop = function() return true end, destroy = function() return true end,
    status = function() return "provisioned" end }
end
local sb = assert(corral.sandbox({ id = "gate", storage_root = "/tmp/corral-gate" }))
local log = {}
local ok, err = corral.provision(fake({ "disk_quota" }, {}, log), sb)
print("attempt", tostring(ok), err and err.code, err and err.capability, #log)
ok = corral.provision(fake({ "disk_quota" }, { "disk_quota" }, log), sb)
print("control", tostring(ok), table.concat(log, ","))]]
    local out = h.capture({ "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", h.host, "-e", script })
    assert.matches("attempt\tnil\tcannot_enforce\tdisk_quota\t0\n", out, nil, true)
    assert.matches("control\ttrue\tprovision\n", out, nil, true)
  end)

  it("refuses an unknown capability rather than failing open", function()
    local ok, err = corral.provision(fake({ "teleportation" }, {}, {}), sb)
    assert.is_nil(ok)
    assert.are.equal("teleportation", err.capability)
  end)

  it("names every missing callback of a custom mechanism", function()
    local m, err = corral.mechanism.load({ provision = function() end })
    assert.is_nil(m)
    assert.matches("start, exec, stop, destroy, status", tostring(err))
  end)

  it("answers true, nil for address when the mechanism has no callback", function()
    local ok, addr = corral.address(fake({}, {}, {}), sb)
    assert.is_true(ok)
    assert.is_nil(addr)
  end)
end)
