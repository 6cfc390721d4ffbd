-- `corral confine --exec --broker`: a confined agent's `corral run` becomes a request to
-- the keeper outside, which grants only what the agent could already reach. Each breach
-- is attempted from inside a real confinement, then its control runs in the same one.
local core = require "corral.core"
local h = require "helpers"

-- The tree holding the host's build and lua directories: granted to the agent (to run
-- corral from it), where the broker keeps corral's own code read-only.
local TREE = h.host:match("^(.*)/[^/]*/[^/]*$")

local function plain(text)
  return (text:gsub("%p", "%%%0"))
end

-- Runs `script` as the agent of a `corral confine --exec --broker --permit box --extra TREE`;
-- with `opts.copy`, TREE is not granted and the agent runs a copy of corral in its box as
-- its client (under Landlock alone, where corral's own code may not lie in the boundary).
local function agent(box, script, opts)
  opts = opts or {}
  local argv = { h.host, "confine", "--exec", "--broker", "--permit", box }
  local client = h.host
  if opts.copy then
    client = box .. "/.corral/bin/corral"
    h.must(string.format("mkdir -p %s/.corral/bin && cp %s %s && cp %s %s/.corral/bin/corral-host && " ..
      "cp -r %s/lua %s/.corral/", h.quote(box), h.quote(h.host), h.quote(client), h.quote(h.host_program),
      h.quote(box), h.quote(TREE), h.quote(box)))
  else
    argv[#argv + 1], argv[#argv + 2] = "--extra", TREE
  end
  for _, x in ipairs(opts.extra or {}) do
    argv[#argv + 1] = "--extra"
    argv[#argv + 1] = x
  end
  if opts.layers then
    argv[#argv + 1] = "--layers"
    argv[#argv + 1] = opts.layers
  end
  for _, a in ipairs({ "--", "/bin/sh", "-c", script, "sh", client, table.unpack(opts.args or {}) }) do
    argv[#argv + 1] = a
  end
  local line = (opts.prefix or "") .. require("corral.shell").join(argv) .. " 2>&1"
  return h.capture({ "sh", "-c", line })
end

-- Broker directories in root's runtime directory (none may outlive its keeper).
local function broker_dirs()
  return #h.sh("ls -d /run/corral/0/broker-* 2>/dev/null"):gsub("[^\n]", "")
end

-- A python3 client that speaks the wire itself, for requests the corral client never
-- sends (a session id this broker did not make) and for a flood of idle connections.
local RAW = [[
import json, os, socket, sys
def ask(sub, argv):
    s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CORRAL_BROKER"])
    msg = {"op": "request", "sub": sub, "argv": argv, "cwd": os.getcwd(), "env": {}}
    socket.send_fds(s, [(json.dumps(msg) + "\n").encode()], [0, 1, 2])
    out = b""
    while not out.endswith(b"\n") or b'"exit"' not in out and b'"ok":false' not in out:
        d = s.recv(4096)
        if not d: break
        out += d
    return out.decode()
]]

describe("corral confine --broker #root", function()
  local box, outside
  before_each(function()
    if core.proc.geteuid() ~= 0 then pending("runs tenant sandboxes as root") end
    box, outside = h.tmpdir("broker-box"), h.tmpdir("broker-out")
    h.write(outside .. "/secret", "outside-secret\n")
    h.write(outside .. "/list", "a.test:443\n")
  end)
  after_each(function()
    -- a tenant's storage is owned by its host id: removed as root, whatever it holds
    h.rmrf(box)
    h.rmrf(outside)
  end)

  it("passes fds with a message (SCM_RIGHTS), and refuses more than the receiver takes", function()
    local dir = h.tmpdir("broker-fds")
    local l = assert(core.unix.listen(dir .. "/s"))
    local c = assert(core.unix.connect(dir .. "/s"))
    local a = assert(core.unix.accept(l))
    local rd, wr = assert(core.io.pipe())
    assert.are.equal(5, assert(core.unix.sendmsg(c, "hello", { wr, wr })))
    local data, err = core.unix.recvmsg(a, 64, 1, true)
    assert.is_nil(data)
    assert.matches("Protocol error", err) -- two came, room for one: refused whole
    -- control, after: the same with room for both; the fd received writes into our pipe
    assert(core.unix.sendmsg(c, "again", { wr, wr }))
    local fds
    data, fds = assert(core.unix.recvmsg(a, 64, 2, true))
    assert.are.equal("again", data)
    assert.are.equal(2, #fds)
    core.io.write(fds[1], "through")
    assert.are.equal("through", core.io.read(rd, 64))
    for _, f in ipairs({ l, c, a, rd, wr, fds[1], fds[2] }) do f:close() end
    h.rmrf(dir)
  end)

  it("grants paths inside the agent's boundary only: outside, a symlink out, a .. path, a file extra", function()
    h.must("ln -s " .. h.quote(outside) .. " " .. h.quote(box .. "/out") .. " && mkdir " .. h.quote(box .. "/ws"))
    local before = broker_dirs()
    local o = outside
    local out, status = agent(box, table.concat({
      "C=$1",
      [[try() { "$C" run "$@" -- /bin/sh -c 'echo TENANT-RAN'; echo "rc=$?"; }]],
      'echo "== outside"; try --storage ' .. o .. "/s",
      'echo "== symlink"; try --storage out/s',
      'echo "== workspace-symlink"; try --workspace out',
      'echo "== dotdot"; try --storage ws/../../' .. o:match("[^/]+$") .. "/s",
      'echo "== file-extra-as-dir"; try --workspace ' .. o,
      'echo "== log-outside"; try --log-json ' .. o .. "/log --allow a.test:443",
      'echo "== control"',
      '"$C" run --storage ws/../st --workspace ws --allow-file ' .. o .. "/list -- /bin/sh -c " ..
        [['echo kept > /storage/f; ls -d /workspace; echo TENANT-RAN']],
      'echo "control-rc=$?"',
    }, "\n"), { extra = { o .. "/list" } })
    assert.are.equal(0, status, out)
    for _, case in ipairs({ "outside", "symlink", "workspace%-symlink", "dotdot", "file%-extra%-as%-dir",
                            "log%-outside" }) do
      local part = out:match("== " .. case .. "\n(.-)\n==")
      assert.truthy(part, case .. ": " .. out)
      assert.matches("rc=2", part)
      assert.matches("outside the agent's", part)
      assert.is_nil(part:find("TENANT-RAN", 1, true), part)
    end
    local control = out:match("== control\n(.*)$")
    assert.matches("TENANT%-RAN", control)
    assert.matches("control%-rc=0", control)
    assert.is_nil(h.read(outside .. "/s"), "a storage was made outside")
    assert.truthy(core.fs.lstat(box .. "/st/f"), out) -- the .. path that stays inside was granted
    assert.are.equal(before, broker_dirs(), "the broker's directory outlived it")
  end)

  it("never follows a directory swapped for a symlink out between the broker's check and its corral's use",
    function()
      if not io.open("/usr/bin/python3") then pending("needs /usr/bin/python3 for the swapper (renameat2)") end
      h.write(outside .. "/canary", "untouched\n")
      local listing = h.sh("ls -A " .. h.quote(outside))
      -- d and e, w and x trade places atomically (RENAME_EXCHANGE), each pair a directory
      -- inside and a symlink to the directory outside; requests name d (storages) and w (a
      -- workspace, files) until the broker's corral has refused a swapped one 4 times (the
      -- race met), at most 60
      local out, status = agent(box, [[
C=$1 OUT=$2
mkdir d w; echo a.test:443 > w/list; ln -s "$OUT" e; ln -s "$OUT" x
/usr/bin/python3 -c '
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
while not os.path.exists("stop"):
    libc.renameat2(-100, b"d", -100, b"e", 2); libc.renameat2(-100, b"w", -100, b"x", 2); time.sleep(0.0003)
' &
T='cat /workspace/secret /storage/../canary 2>/dev/null; echo pwned > /workspace/canary; echo f > /storage/f'
n=0 hits=0
while [ $n -lt 60 ] && [ $hits -lt 4 ]; do
  if [ $((n % 2)) = 0 ]; then out=$("$C" run --storage d/s$n -- /bin/sh -c "$T" 2>&1)
  else out=$("$C" run --workspace w --allow-file w/list --log-json w/log$n -- /bin/sh -c "$T" 2>&1); fi
  echo "$out"
  case "$out" in *"changed after the broker checked it"*|*"with no symlink followed"*) hits=$((hits + 1));; esac
  n=$((n + 1))
done
touch stop; wait
echo "requests=$n hits=$hits"
for p in d:e w:x; do [ -L "${p%:*}" ] && rm "${p%:*}" && mv -T "${p#*:}" "${p%:*}"; done
echo "== control"
"$C" run --storage d/ctl --workspace w -- /bin/sh -c 'echo inside > /workspace/w; echo CONTROL-RAN'
echo "control-rc=$?"
]], { args = { outside } })
      assert.are.equal(0, status, out)
      assert.are.equal("untouched\n", h.read(outside .. "/canary"), out)
      assert.are.equal(listing, h.sh("ls -A " .. h.quote(outside)), "something was made outside: " .. out)
      assert.is_nil(out:find("outside-secret", 1, true), out)
      local hits = tonumber(out:match("requests=%d+ hits=(%d+)"))
      assert.truthy(hits and hits >= 1, "the race was never met: " .. out)
      local control = out:match("== control\n(.*)$")
      assert.matches("CONTROL%-RAN\ncontrol%-rc=0", control)
      assert.are.equal("inside\n", h.read(box .. "/w/w"))
    end)

  it("serves a session's create, exec, policy, ls and rm; lists and reaches only the broker's own sessions",
    function()
      local op = "op-broker-" .. core.proc.getpid()
      h.must(h.quote(h.host) .. " create " .. op .. " >/dev/null")
      h.defer(finally, function() os.execute(h.quote(h.host) .. " rm " .. op .. " >/dev/null 2>&1") end)
      local out, status = agent(box, [[
C=$1 OP=$2
echo "== attempt"
"$C" ls; "$C" ls --json; echo
"$C" exec "$OP" -- /bin/sh -c 'echo OPERATOR-REACHED'; echo "exec-op-rc=$?"
"$C" policy "$OP" --allow b.test:443; echo "policy-op-rc=$?"
"$C" rm "$OP"; echo "rm-op-rc=$?"
echo "== control"
"$C" create mine --allow a.test:443; echo "create-rc=$?"
"$C" ls; "$C" ls --json; echo
echo from-stdin | "$C" exec mine -- /bin/sh -c 'read l; echo "got $l in $(cat /proc/1/comm)"; exit 7'
echo "exec-rc=$?"
"$C" policy mine --allow b.test:443; echo "policy-rc=$?"
"$C" exec mine -- /bin/sh -c 'trap "echo GOT-TERM; exit 3" TERM; echo ready; sleep 30 & wait' > sig.out &
P=$!; i=0
while ! grep -q ready sig.out 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -TERM $P; wait $P; echo "signal-rc=$?"; cat sig.out
"$C" rm mine; echo "rm-rc=$?"
"$C" ls --json
]], { args = { op } })
      assert.are.equal(0, status, out)
      local attempt, control = out:match("== attempt\n(.-)== control\n(.*)$")
      assert.truthy(attempt, out)
      assert.matches("^ID[^\n]*\n%[%]\n", attempt) -- the operator's session is not listed, text nor JSON
      assert.matches("ID: no session " .. op:gsub("%-", "%%-") .. " made through this broker", attempt)
      assert.is_nil(attempt:find("OPERATOR-REACHED", 1, true))
      for _, what in ipairs({ "exec", "policy", "rm" }) do assert.matches(what .. "%-op%-rc=2", attempt) end
      assert.truthy(h.sh(h.quote(h.host) .. " ls"):find(op, 1, true), "the operator's session is gone")
      -- control, after: the agent's own session, through the same broker
      assert.matches("create%-rc=0", control)
      assert.matches("\nmine%s+session%s+native", control)
      assert.matches('%[{[^\n]*"id":"mine"', control)
      assert.is_nil(control:find(op, 1, true), control)
      assert.matches("got from%-stdin in corral%-init\nexec%-rc=7", control)
      assert.matches("a.test:443\nb.test:443\npolicy%-rc=0", control)
      assert.matches("signal%-rc=3\nready\nGOT%-TERM", control)
      assert.matches("rm%-rc=0\n%[%]", control)
    end)

  it("keeps corral's own code in the boundary read-only, or refuses to start without a namespace layer",
    function()
      local module = TREE .. "/lua/corral/json.lua"
      local before = h.read(module)
      local out, status = agent(box, [[
echo "== attempt"
echo 'os.exit(99)' >> ]] .. h.quote(module) .. [[; echo "module-rc=$?"
echo "== control"
echo mine > own; cat own; "$1" run -- /bin/sh -c 'echo TENANT-RAN'; echo "control-rc=$?"
]])
      assert.are.equal(0, status, out)
      local attempt, control = out:match("== attempt\n(.-)== control\n(.*)$")
      assert.matches("Read%-only file system\nmodule%-rc=2", attempt)
      assert.are.equal(before, h.read(module))
      assert.matches("mine\nTENANT%-RAN\ncontrol%-rc=0", control)
      -- under Landlock alone nothing can hold it read-only: no broker starts
      out, status = agent(box, "echo AGENT-RAN", { layers = "landlock" })
      assert.are.equal(3, status, out)
      assert.matches("%-%-broker: " .. plain(TREE), out)
      assert.is_nil(out:find("AGENT-RAN", 1, true))
      -- a boundary directory that is code itself cannot be made read-only within it
      out, status = h.capture({ h.host, "confine", "--exec", "--broker", "--permit", box, "--extra", TREE .. "/lua",
        "--", "/bin/true" })
      assert.are.equal(2, status, out)
      assert.matches("%-%-broker: " .. plain(TREE .. "/lua") .. " holds corral's own code", out)
    end)

  it("serves an agent under the bwrap layer: its tenant runs, corral's own code stays read-only", function()
    if not h.sh("command -v bwrap"):find("bwrap", 1, true) then pending("needs bubblewrap for the bwrap layer") end
    local module = TREE .. "/lua/corral/json.lua"
    local out, status = agent(box, [[
echo "== attempt"
echo 'os.exit(99)' >> ]] .. h.quote(module) .. [[; echo "module-rc=$?"
cat ]] .. h.quote(outside .. "/secret") .. [[; echo "outside-rc=$?"
echo "== control"
"$1" run --storage st --allow a.test:443 -- /bin/sh -c 'echo kept > /storage/f; echo TENANT-RAN'; echo "control-rc=$?"
]], { layers = "bwrap,landlock" })
    assert.are.equal(0, status, out)
    local attempt, control = out:match("== attempt\n(.-)== control\n(.*)$")
    assert.truthy(attempt, out)
    assert.matches("Read%-only file system\nmodule%-rc=2", attempt)
    assert.matches("No such file or directory\noutside%-rc=1", attempt) -- bwrap's root has no such path
    assert.is_nil(attempt:find("outside-secret", 1, true))
    assert.matches("TENANT%-RAN\ncontrol%-rc=0", control)
    assert.are.equal("kept\n", h.read(box .. "/st/f"))
  end)

  it("never lets the agent's environment, or a PATH entry it can write, choose what the broker's corral runs",
    function()
      if not h.sh("command -v bwrap"):find("bwrap", 1, true) then pending("needs bubblewrap for --mechanism bwrap") end
      -- the agent's bwrap: on the PATH its client is given, and first on the operator's
      h.must("mkdir " .. h.quote(box .. "/bin"))
      h.write(box .. "/bin/bwrap", "#!/bin/sh\ntouch " .. outside .. "/BY-AGENT-BWRAP\nexec /usr/bin/bwrap \"$@\"\n")
      h.must("chmod +x " .. h.quote(box .. "/bin/bwrap"))
      local out, status = agent(box, [[
C=$1
echo "== attempt"
PATH="$PWD/bin:$PATH" "$C" run --mechanism bwrap -- /bin/sh -c 'echo TENANT-RAN'; echo "path-rc=$?"
LD_PRELOAD="$PWD/x.so" "$C" run --env LD_PRELOAD -- /bin/true; echo "preload-rc=$?"
"$C" run --env CORRAL_BROKER_BOUNDARY -- /bin/true; echo "boundary-rc=$?"
echo "== control"
FOO='a b' "$C" run --env FOO -- /bin/sh -c 'echo "tenant sees [$FOO]"'; echo "control-rc=$?"
]], { prefix = "PATH=" .. h.quote(box) .. "/bin:$PATH " })
      assert.are.equal(0, status, out)
      local attempt, control = out:match("== attempt\n(.-)== control\n(.*)$")
      assert.truthy(attempt, out)
      assert.is_nil(core.fs.lstat(outside .. "/BY-AGENT-BWRAP"), "the agent's bwrap ran outside: " .. out)
      assert.matches("TENANT%-RAN\npath%-rc=0", attempt) -- the keeper's PATH, less the box, found the real one
      assert.matches("%-%-env: LD_PRELOAD is read by the broker's own corral as it starts[^\n]*\npreload%-rc=2",
        attempt)
      assert.matches("%-%-env: CORRAL_BROKER_BOUNDARY is read by[^\n]*\nboundary%-rc=2", attempt)
      assert.matches("tenant sees %[a b%]\ncontrol%-rc=0", control)
    end)

  it("refuses a limit larger than the agent's own and gives the agent's when none is asked", function()
    local out, status = agent(box, [[
"$1" run --nofile 1024 -- /bin/sh -c 'echo TENANT-RAN'; echo "attempt-rc=$?"
"$1" run --nofile 100 -- /bin/sh -c 'echo "given=$(ulimit -n)"'; echo "control-rc=$?"
"$1" run -- /bin/sh -c 'echo "default=$(ulimit -n)"'
]], { prefix = "ulimit -n 512; " })
    assert.are.equal(0, status, out)
    local attempt = out:match("^(.-)attempt%-rc=2\n")
    assert.truthy(attempt, out)
    assert.matches("%-%-nofile: 1024 is larger than the agent's own limit %(512", attempt)
    assert.is_nil(attempt:find("TENANT-RAN", 1, true))
    assert.matches("given=100\ncontrol%-rc=0", out)
    assert.matches("default=512", out)
  end)

  it("scopes session ids to the broker, refuses a host mechanism, bounds a flood, then serves", function()
    if not io.open("/usr/bin/python3") then pending("needs /usr/bin/python3 for the raw client") end
    local out, status = agent(box, [[
/usr/bin/python3 - <<'EOF'
]] .. RAW .. [[
print("other-id", ask("exec", ["operators-own", "--", "/bin/true"]).strip())
print("mechanism", ask("run", ["--mechanism", "/tmp/x.lua", "--", "/bin/true"]).strip())
idle = []
for i in range(8):
    s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CORRAL_BROKER"]); idle.append(s)
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CORRAL_BROKER"])
print("flood", s.recv(4096).decode().strip())
for s in idle: s.close()
print("control", ask("run", ["--", "/bin/sh", "-c", "echo TENANT-RAN"]).replace("\n", " "))
EOF
]])
    assert.are.equal(0, status, out)
    local function refusal(what)
      local line = out:match(what .. " ({[^\n]*})")
      assert.truthy(line, what .. ": " .. out)
      local r = require("dkjson").decode(line)
      assert.are.equal(false, r.ok, line)
      return r
    end
    local r = refusal("other%-id")
    assert.matches("^ID: no session operators%-own made through this broker", r.error)
    assert.are.equal(2, r.status)
    assert.matches("^%-%-mechanism: only native or bwrap", refusal("mechanism").error)
    assert.matches("^broker busy: 8 requests at once", refusal("flood").error)
    -- control, after the flood: the broker still serves
    assert.matches("TENANT%-RAN", out)
    assert.matches('control {"ok":true,"result":{"pid":%d+}} {"ok":true,"result":{"exit":0}}', out)
  end)

  it("runs a real tenant with an egress allowlist for an agent under Landlock; the tenant cannot reach the socket",
    function()
      if not io.open("/usr/bin/python3") then pending("needs /usr/bin/python3 for the HTTP server") end
      if not h.sh("command -v curl"):find("curl", 1, true) then pending("needs curl in the tenant") end
      local www = h.tmpdir("broker-www")
      h.write(www .. "/index.html", "hello-through-the-broker\n")
      local port = h.free_port()
      local p, pid = h.child(string.format("exec /usr/bin/python3 -m http.server %d --bind 127.0.0.1 " ..
        "--directory %s", port, h.quote(www)))
      h.defer(finally, function()
        os.execute("kill " .. pid .. " 2>/dev/null")
        p:close()
        h.rmrf(www)
      end)
      assert(h.wait_for(function()
        return h.sh(string.format("ss -ltnH 'sport = :%d' | grep -c LISTEN", port)):match("^1")
      end, 10), "the HTTP server did not start")
      local connect = [[/usr/bin/python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); ]] ..
        [[s.connect(sys.argv[1]); print("connected")' ]]
      local tenant = h.attempt_then_control(
        connect .. "\"$0\"; curl -s --max-time 5 http://denied.test:" .. port .. "/",
        "curl -sS --max-time 5 http://allowed.test:" .. port .. "/")
      local out, status = agent(box, [[
echo "== agent"
cat ]] .. outside .. [[/secret; echo "read-outside-rc=$?"
]] .. connect .. [["$CORRAL_BROKER"
echo "== tenant"
"$1" run --allow allowed.test:]] .. port .. [[ --resolve allowed.test=127.0.0.1 --resolve denied.test=127.0.0.1 \
  --internal 127.0.0.0/8 -- /bin/sh -c ']] .. tenant:gsub("'", "'\\''") .. [[' "$CORRAL_BROKER"
echo "tenant-rc=$?"
]], { layers = "landlock", copy = true })
      assert.are.equal(0, status, out)
      local agent_part = out:match("== agent\n(.-)== tenant")
      assert.truthy(agent_part, out)
      -- the agent is under Landlock: a file outside DIR is refused it (not absent: no namespace layer)
      assert.matches("Permission denied\nread%-outside%-rc=1", agent_part)
      assert.is_nil(agent_part:find("outside-secret", 1, true))
      assert.matches("connected", agent_part) -- the agent reaches its broker
      local tenant_part = out:match("== tenant\n(.*)$")
      local rc, control, attempt = h.after_attempt(tenant_part, "hello%-through%-the%-broker")
      h.assert_refused(rc, tenant_part)
      assert.matches("FileNotFoundError", attempt) -- the socket is absent from the tenant's root
      assert.is_nil(attempt:find("connected", 1, true))
      assert.is_nil(attempt:find("hello-through-the-broker", 1, true)) -- denied.test was refused
      assert.matches("tenant%-rc=0", control)
    end)
end)

describe("corral.broker.client outside a confinement", function()
  it("ignores CORRAL_BROKER where no_new_privs is unset, and runs the command itself", function()
    local dir = h.tmpdir("broker-fake")
    -- a listener that is not a broker: a client that trusted the name would hang or fail
    local l = assert(core.unix.listen(dir .. "/sock"))
    local out, status = h.capture({ "env", "CORRAL_BROKER=" .. dir .. "/sock", h.host, "run", "--", "/bin/sh", "-c",
      "echo ran-here" })
    l:close()
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    assert.matches("CORRAL_BROKER ignored: this process is not confined", out)
    assert.matches("ran%-here", out)
  end)
end)

describe("corral confine --broker as an unprivileged operator", function()
  it("runs the agent's tenants; a storage in the boundary, which only root can show from its checked fd, is refused",
    function()
      local missing = h.test_user_missing()
      if missing then pending(missing) end
      local box = h.tmpdir("broker-user")
      h.defer(finally, function() h.rmrf(box) end)
      h.must("chown " .. h.TEST_UID .. " " .. h.quote(box))
      local script = table.concat({
        'cd "$2"',
        [["$1" run --storage st -- /bin/sh -c 'echo TENANT-RAN'; echo "attempt-rc=$?"]],
        [["$1" run --allow a.test:443 -- /bin/sh -c 'echo "TENANT-RAN as $(id -u)"'; echo "control-rc=$?"]],
      }, "\n")
      local out, status = h.capture(h.as_test_user({ h.host, "confine", "--exec", "--broker", "--permit", box,
        "--extra", TREE, "--", "/bin/sh", "-c", script, "sh", h.host, box }))
      assert.are.equal(0, status, out)
      local attempt, control = out:match("^(.-attempt%-rc=%d+\n)(.*)$")
      assert.truthy(attempt, out)
      assert.matches("cannot_enforce: filesystem_confinement: " .. plain(box) .. "/st: through a broker", attempt)
      assert.matches("attempt%-rc=3", attempt)
      assert.is_nil(attempt:find("TENANT-RAN", 1, true))
      assert.is_nil(core.fs.lstat(box .. "/st"), "the refused storage was made")
      assert.matches("TENANT%-RAN as 0\ncontrol%-rc=0", control)
    end)
end)
