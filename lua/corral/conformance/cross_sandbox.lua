--- Conformance checks: the process, network and IPC breaches, aimed at a second sandbox
-- of the same mechanism instead of the host.
--
-- B's target holds a token in its command line, environment, a loopback listener, an
-- abstract unix socket, /tmp and a SysV segment. After A's attempt B tests its own
-- targets: a refusal counts only if the target was alive.
--
-- Each check needs what B's target is hidden by: its processes, environment, memory, /tmp
-- and SysV segment lie outside A's own root (filesystem_confinement, as for the host's in
-- corral.conformance.process); its loopback and abstract socket belong to its network
-- namespace (network_restriction).
-- @module corral.conformance.cross_sandbox
local core = require "corral.core"
local file = require "corral.file"

local FS = { "filesystem_confinement" }
local NET = { "network_restriction" }

local TARGET = [=[
import ctypes, os, socket, sys, threading, time
token = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def serve(s):
    while True:
        c, _ = s.accept()
        try: c.sendall(token.encode() + b"\n")
        except OSError: pass
        c.close()
def publish(name, text):  # whole or not at all: the host reads it as soon as it exists
    with open("/storage/." + name, "w") as f: f.write(text)
    os.rename("/storage/." + name, "/storage/" + name)
open("/tmp/corral-target", "w").write(token)
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind(("127.0.0.1", 7000)); t.listen(8)
u = socket.socket(socket.AF_UNIX); u.bind("\0corral-conformance-target"); u.listen(8)
for s in (t, u): threading.Thread(target=serve, args=(s,), daemon=True).start()
shm = libc.shmget(0x434f5252, 4096, 0o1600)
if shm >= 0:
    a = libc.shmat(shm, None, 0); ctypes.memmove(a, token.encode(), len(token))
publish("ready", "ready")
while not os.path.exists("/storage/go"): time.sleep(0.02)
res = []
def check(name, fn):
    try: res.append("%s=%d" % (name, 1 if fn() else 0))
    except OSError: res.append(name + "=0")
check("loopback", lambda: token in socket.create_connection(("127.0.0.1", 7000), 1).recv(100).decode())
def unix():
    c = socket.socket(socket.AF_UNIX); c.settimeout(1); c.connect("\0corral-conformance-target")
    return token in c.recv(100).decode()
check("unix", unix)
check("tmp", lambda: open("/tmp/corral-target").read() == token)
def sysv():
    sid = libc.shmget(0x434f5252, 0, 0)
    return sid >= 0 and ctypes.string_at(libc.shmat(sid, None, 0o10000), len(token)).decode() == token
check("shm", sysv)
check("alive", lambda: True)
publish("selftest", " ".join(res))
time.sleep(60)
]=]

local ATTACK = [=[
import ctypes, os, socket, sys
what, token = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
try:
    if what == "unix":
        c = socket.socket(socket.AF_UNIX); c.settimeout(1); c.connect("\0corral-conformance-target")
        print("GOT:" + c.recv(100).decode())
    elif what == "shm":
        sid = libc.shmget(0x434f5252, 0, 0)
        print("shmget", sid, ctypes.get_errno())
        if sid >= 0: print("GOT:" + ctypes.string_at(libc.shmat(sid, None, 0o10000), 24).decode(errors="replace"))
    elif what == "ptrace":
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()] + [int(x) for x in sys.argv[3:]]:
            try: cmd = open("/proc/%d/cmdline" % pid, "rb").read()
            except OSError: cmd = b""
            if token.encode() not in cmd and str(pid) not in sys.argv[3:]: continue
            r = libc.ptrace(16, pid, 0, 0)
            print("attach", pid, r, ctypes.get_errno(), flush=True)
            if r == 0:
                os.waitpid(pid, 0)
                f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
                with open("/proc/%d/mem" % pid, "rb") as m:
                    m.seek(int(f[47])); print("GOT:" + m.read(int(f[48]) - int(f[47])).decode(errors="replace"))
except OSError as e:
    print(what, e.errno)
]=]

-- The host pid of B's target (the host sees every pid), or nil.
local function host_pid_of(token)
  for _, name in ipairs(core.fs.listdir("/proc") or {}) do
    if name:match("^%d+$") then
      local cmd = file.read("/proc/" .. name .. "/cmdline") or ""
      if cmd:find(token, 1, true) and cmd:find("target.py", 1, true) then return tonumber(name) end
    end
  end
  return nil
end

-- Whether a host pid runs: a killed process stays in /proc, a zombie, until its parent
-- (the mechanism, in this process or not) reaps it.
local function running(pid)
  local stat = file.read("/proc/" .. pid .. "/stat")
  local state = stat and stat:match("^.*%) (%a)")
  return state ~= nil and state ~= "Z" and state ~= "X"
end

-- B running its target, and A; or nil and the observation.
local function pair(w)
  local env_secret = w:token()
  local b, err = w:sandbox({ env = { CORRAL_CONFORMANCE_PERMITTED = env_secret } })
  if not b then return nil, { refused = err } end
  b.env_secret = env_secret
  w:write(b, "target.py", TARGET)
  local ok, serr = w:start(b, "exec python3 /storage/target.py " .. b.own)
  if not ok then return nil, { unavailable = "the target sandbox did not start: " .. tostring(serr) } end
  -- an attempt at a target that never started distinguishes nothing; one whose sandbox
  -- stopped will not start any more
  local function settled()
    return w:read(b, "ready") ~= nil or require("corral").status(w.mech, b.sb) ~= "running"
  end
  if not (w:wait_for(settled, 5) and w:read(b, "ready")) then
    return nil, { unavailable = "B's target never started: " .. (w:read(b, "../start-" .. b.id) or ""):sub(1, 120) }
  end
  b.host_pid = host_pid_of(b.own)
  local a, aerr = w:sandbox()
  if not a then return nil, { refused = aerr } end
  w:write(a, "attack.py", ATTACK)
  return a, b
end

-- B's self-test of `target` after the attempt.
local function target_alive(w, b, target)
  w:write(b, "go", "go")
  -- B's own tests (1 s timeouts each) take seconds on a loaded machine
  w:wait_for(function() return w:read(b, "selftest") ~= nil end, 15)
  return ((w:read(b, "selftest") or ""):find(target .. "=1", 1, true)) ~= nil
end

local function cross(id, needs, guarantee, attempt, target, script, evidence_of)
  return {
    id = id, guarantee = guarantee, attempt = attempt, needs = needs, tools = { "python3" },
    control = "B's own test of its " .. target .. " target passes after the attempt; A's own storage",
    run = function(w)
      local a, b = pair(w)
      if not a then return b end
      local out, ok, detail = w:attempt(a, script(b))
      w:pump(0.05)
      local ev = (out:find(b.own, 1, true) or out:find(b.env_secret, 1, true)) and
        ("A obtained B's token through its " .. target) or nil
      if evidence_of then ev = ev or evidence_of(w, b, out) end
      if ev then return { evidence = ev } end
      if not ok then return { control_ok = false, control_detail = detail } end
      if not target_alive(w, b, target) then
        return { unavailable = "B's " .. target .. " target did not pass its own test: nothing answers there" }
      end
      return { control_ok = true, control_detail = "B's " .. target .. " answered B itself; " .. detail }
    end,
  }
end

return {
  cross("cross.pids", FS, "a tenant cannot see another sandbox's processes",
    "read every /proc/PID/cmdline for B's token",
    "alive", function() return "cat /proc/[0-9]*/cmdline | tr '\\0' ' '" end),
  cross("cross.environ", FS, "a tenant cannot read another sandbox's environment",
    "read every /proc/PID/environ for B's permitted variable", "alive",
    function() return "cat /proc/[0-9]*/environ | tr '\\0' '\\n'" end),
  cross("cross.signal", FS, "a tenant cannot signal another sandbox's processes",
    "kill -KILL B's target, by its host pid and by every pid showing B's token", "alive",
    function(b)
      -- B's target alone (a tenant seeing the host's pids must not kill another run's);
      -- the first pattern does not match this script's own command line; never `kill 0`
      -- (the tenant's own group) when the host pid is unknown
      return string.format("%sfor p in /proc/[0-9]*; do grep -qa 'target[.]py' $p/cmdline 2>/dev/null && " ..
        "grep -qa %s $p/cmdline && kill -KILL ${p#/proc/}; done; sleep 0.1",
        b.host_pid and ("kill -KILL " .. b.host_pid .. "; ") or "", b.own)
    end,
    function(_, b)
      if b.host_pid and not running(b.host_pid) then return "B's target was killed" end
    end),
  cross("cross.ptrace", FS, "a tenant cannot ptrace another sandbox's processes",
    "PTRACE_ATTACH to B's target and read its memory", "alive",
    function(b) return "python3 /storage/attack.py ptrace " .. b.own .. " " .. tostring(b.host_pid or "") end),
  cross("cross.loopback", NET, "a tenant cannot reach a service on another sandbox's loopback",
    "connect to 127.0.0.1:7000, where B listens in its own network", "loopback",
    function()
      return "python3 -c 'import socket; print(socket.create_connection((\"127.0.0.1\", 7000), 1).recv(100))'"
    end),
  cross("cross.abstract_unix", NET, "a tenant cannot connect to another sandbox's abstract unix socket",
    "connect to B's abstract socket @corral-conformance-target", "unix",
    function(b) return "python3 /storage/attack.py unix " .. b.own end),
  cross("cross.tmp", FS, "a tenant's /tmp is its own, not another sandbox's", "read B's /tmp/corral-target", "tmp",
    function() return "cat /tmp/corral-target" end),
  cross("cross.sysv_ipc", FS, "a tenant cannot attach another sandbox's SysV shared memory",
    "shmget/shmat B's segment (key 0x434f5252) and read it", "shm",
    function(b) return "python3 /storage/attack.py shm " .. b.own end),
}
