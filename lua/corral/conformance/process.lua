--- Conformance checks: a tenant cannot see, signal, trace or type into anything of the
-- host's.
--
-- The target is a host process of the check's own (`sh -c 'sleep 30; : TOKEN'`, a
-- second token in its environment): the attempt aims at it by pid, and the host sees
-- whether it is still running, or the tenant printed a token only it held.
--
-- What each check needs claimed, so that a breach is one: seeing, signalling and tracing
-- a host process, and keeping a key in a keyring the host shares, are reaching outside
-- the tenant's own root (filesystem_confinement: its /proc is its own pid namespace's,
-- where a host pid names nothing; a traced process outside acts outside the confinement,
-- which is why Landlock confines ptrace too). TIOCSTI on a terminal that is not the
-- caller's controlling one is an act of privilege (CAP_SYS_ADMIN), refused to a tenant
-- holding none (privilege_separation).
-- @module corral.conformance.process
local FS = { "filesystem_confinement" }
local PRIV = { "privilege_separation" }

-- The host holder and the tenant A; or nil and the reason. The holder runs as the
-- tenant's own host id: a root-owned one is refused by the uid check alone, and would
-- show held under a mechanism with no pid namespace.
local function holder_and_tenant(w)
  local tag, secret = w:token(), w:token()
  local a, aerr = w:sandbox()
  if not a then return nil, { refused = aerr } end
  local p, err = w:host_process("while :; do sleep 1; done; : " .. tag, { "CORRAL_CONFORMANCE_SECRET=" .. secret },
    a.host_id)
  if not p then return nil, { unavailable = "cannot start the host holder: " .. tostring(err) } end
  return { proc = p, pid = p:pid(), tag = tag, secret = secret }, a
end

-- An attempt that printed no result of its own: with the control passing, the tool
-- failed for its own reason (unavailable); with it failing, the set-up killed both (void).
local function never_ran(ok, detail, what, out)
  if not ok then return { control_ok = false, control_detail = detail } end
  return { unavailable = "the attempt never ran (" .. what .. "): " .. out:sub(1, 120) }
end

local PTRACE = [[
import ctypes, os, sys
pid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
print("attach", r, ctypes.get_errno(), flush=True)
if r == 0:
    os.waitpid(pid, 0)
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    start, end = int(f[47]), int(f[48])  # env_start, env_end
    with open("/proc/%d/mem" % pid, "rb") as m:
        m.seek(start)
        print(m.read(end - start).replace(b"\0", b"\n").decode(errors="replace"), flush=True)
]]

local TIOCSTI = [[
import fcntl, os, struct
try:
    master, slave = os.openpty()
except OSError as e:
    print("NOPTY:%d" % e.errno); raise SystemExit
try:
    fcntl.ioctl(slave, 0x5412, b"Z")  # TIOCSTI
    print("TIOCSTI-ACCEPTED", flush=True)
    os.set_blocking(slave, False)
    got = os.read(slave, 16)
    print("INJECTED:" + got.hex())
except OSError as e:
    print("TIOCSTI-REFUSED:%d" % e.errno)
n = fcntl.ioctl(slave, 0x541B, struct.pack("i", 0))  # FIONREAD: the terminal itself works
print("TTY-CTL-OK")
]]

local KEYRING = [[
import ctypes, platform, sys
nr = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
if not nr:
    print("NOARCH"); raise SystemExit
libc = ctypes.CDLL(None, use_errno=True)
payload = sys.argv[1].encode()
k = libc.syscall(nr[0], b"user", b"corral-conformance", payload, len(payload), -3)  # session keyring
print("add_key", k, ctypes.get_errno(), flush=True)
if k >= 0:
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(nr[1], 11, k, buf, 256)  # KEYCTL_READ
    if n > 0: print("KEY:" + buf.raw[:n].decode())
]]

return {
  {
    id = "proc.host_pids", needs = FS, tools = { "tr" },
    guarantee = "a tenant cannot see the host's processes",
    attempt = "read every /proc/PID/cmdline, looking for the host holder's token",
    control = "the tenant sees its own pid in /proc; A's own storage",
    run = function(w)
      local t, a = holder_and_tenant(w)
      if not t then return a end
      local out, ok, detail = w:attempt(a, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; " ..
        "[ -r /proc/$$/cmdline ] && echo SELF-PID-OK")
      local self_ok = out:find("SELF-PID-OK", 1, true) ~= nil
      return { evidence = out:find(t.tag, 1, true) and ("the host holder (pid " .. t.pid .. ") was listed") or nil,
               control_ok = ok and self_ok, control_detail = self_ok and detail or "it cannot see its own pid" }
    end,
  },
  {
    id = "proc.signal_host", needs = FS,
    guarantee = "a tenant cannot signal a host process",
    attempt = "kill -KILL the host holder's pid",
    control = "the tenant kills a child of its own; A's own storage",
    run = function(w)
      local t, a = holder_and_tenant(w)
      if not t then return a end
      local out, ok, detail = w:attempt(a, string.format("kill -KILL %d; sleep 0.1; " ..
        "sleep 10 & p=$!; kill -TERM $p; wait $p; [ $? -gt 128 ] && echo SIG-CTL-OK", t.pid))
      w:pump(0.05)
      local sig_ok = out:find("SIG-CTL-OK", 1, true) ~= nil
      return { evidence = not t.proc:running() and ("the host holder (pid " .. t.pid .. ") was killed") or nil,
               control_ok = ok and sig_ok, control_detail = sig_ok and detail or "it could not signal its own child" }
    end,
  },
  {
    id = "proc.ptrace", needs = FS, tools = { "python3" },
    guarantee = "a tenant cannot ptrace a host process (and read its memory)",
    attempt = "PTRACE_ATTACH to the host holder, then read its environment from /proc/PID/mem",
    control = "A's own storage read and written back",
    run = function(w)
      local t, a = holder_and_tenant(w)
      if not t then return a end
      w:write(a, "ptrace.py", PTRACE)
      local out, ok, detail = w:attempt(a, "python3 /storage/ptrace.py " .. t.pid)
      if out:find(t.secret, 1, true) then return { evidence = "the host holder's memory was read through ptrace" } end
      if out:find("attach 0 ", 1, true) then return { evidence = "PTRACE_ATTACH to the host holder succeeded" } end
      if not out:find("attach %-1 ") then return never_ran(ok, detail, "no PTRACE_ATTACH result", out) end
      return { control_ok = ok, control_detail = detail }
    end,
  },
  {
    id = "proc.tiocsti", needs = PRIV, tools = { "python3" },
    guarantee = "a tenant cannot type into a terminal (TIOCSTI)",
    attempt = "TIOCSTI a byte into a terminal the tenant opened, and read it back",
    control = "FIONREAD on the same terminal works; A's own storage",
    run = function(w)
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      w:write(a, "tiocsti.py", TIOCSTI)
      local out, ok, detail = w:attempt(a, "python3 /storage/tiocsti.py")
      -- the kernel accepting the ioctl is the breach: a canonical-mode terminal holds an
      -- injected byte without a newline unread, so a read-back alone misses it
      if out:find("INJECTED:5a", 1, true) or out:find("TIOCSTI-ACCEPTED", 1, true) then
        return { evidence = "the kernel accepted TIOCSTI on the tenant's terminal" }
      end
      local nopty = out:match("NOPTY:(%d+)")
      if nopty then
        return { unavailable = "no terminal inside to aim TIOCSTI at (openpty: errno " .. nopty .. ")" }
      end
      local tty_ok = out:find("TTY-CTL-OK", 1, true) ~= nil and out:find("TIOCSTI-REFUSED:", 1, true) ~= nil
      return { control_ok = ok and tty_ok, control_detail = tty_ok and detail or "the terminal itself did not work" }
    end,
  },
  {
    id = "proc.keyring", needs = FS, tools = { "python3" },
    guarantee = "a tenant cannot use the kernel keyrings",
    attempt = "add_key a user key holding a fresh token, then KEYCTL_READ it back",
    control = "A's own storage read and written back",
    run = function(w)
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local payload = w:token()
      w:write(a, "keyring.py", KEYRING)
      local out, ok, detail = w:attempt(a, "python3 /storage/keyring.py " .. payload)
      if out:find("NOARCH", 1, true) then
        return { unavailable = "no keyring syscall numbers for this architecture" }
      end
      local id = tonumber(out:match("add_key (%-?%d+)"))
      if not id then return never_ran(ok, detail, "no add_key result", out) end
      -- the kernel keeping the key is the breach, whether or not the tenant may read it back
      local kept = (out:find("KEY:" .. payload, 1, true) and "the kernel kept and returned the tenant's key") or
        (id >= 0 and ("the kernel kept the tenant's key (serial " .. id .. ")")) or nil
      return { evidence = kept, control_ok = ok, control_detail = detail }
    end,
  },
}
