-- Live sandboxes from the CLI (docs/sessions.md): `corral create` leaves a keeper, execs
-- (through tests/session_client.lua, which speaks the wire protocol) run inside it and
-- keep its state, `ls`, `policy` and `rm`; a killed keeper is swept. One session with an
-- allowlist carries most tests (each attempt followed by its control in it); what a
-- session leaves is checked by the keeper's own objects (its pid's cgroups, temporary
-- storage and name files, its sandbox's netns), never by global counts other corral
-- processes change. Run `make` first.
local core = require "corral.core"
local h = require "helpers"

local is_root = core.proc.geteuid() == 0
local json = require "dkjson"
local CLIENT = os.getenv("PWD") .. "/tests/session_client.lua"

local function defer(fn) h.defer(finally, fn) end

-- The client: argv after the host; returns stdout+stderr and the status.
local function exec(...)
  return h.capture({ h.host, CLIENT, ... })
end

local function ls()
  local out, status = h.corral("ls", "--json")
  assert.are.equal(0, status, out)
  local rows = {}
  for _, r in ipairs(json.decode(out:match("%b[]")) or {}) do rows[r.id] = r end
  return rows
end

local function socket_of(id) return assert(require("corral.control").dir()) .. "/session-" .. id .. ".sock" end

local function exists(path) return core.fs.lstat(path) ~= nil end

-- What a keeper holds that a test can name: its process, its sandbox's init and netns,
-- its pid's cgroups, temporary storage and name files, its socket.
local function holdings(id)
  local row = assert(ls()[id], id .. " is not listed")
  local keeper = math.tointeger(row.pid)
  local init = assert(core.fs.listdir("/proc/" .. keeper .. "/task"))
  local children = h.read("/proc/" .. keeper .. "/task/" .. init[1] .. "/children") or ""
  local init_pid = tonumber(children:match("%d+"))
  -- the sandbox's netns: the first process beneath the keeper in a netns not the host's
  -- (native's init is in it; under bwrap, the process bubblewrap made)
  local host_net, netns = core.fs.readlink("/proc/self/ns/net"), nil
  for _, pid in ipairs(require("corral.proctree").descendants(keeper)) do
    local ns = core.fs.readlink("/proc/" .. pid .. "/ns/net")
    if ns and ns ~= host_net then
      netns = ns
      break
    end
  end
  return { keeper = keeper, init = init_pid, netns = assert(netns, "no netns of the sandbox's own"),
           socket = socket_of(id) }
end

-- A process's start time (clock ticks since boot, /proc/PID/stat's field 22), or nil.
local function started_at(pid)
  local stat = h.read("/proc/" .. pid .. "/stat")
  local rest = stat and stat:match("%) (.*)$")
  if not rest then return nil end
  local fields = {}
  for f in rest:gmatch("%S+") do fields[#fields + 1] = f end
  return tonumber(fields[20])
end

-- Now, as a start time: that of a process made now.
local function ticks_now()
  local out = h.capture({ "sh", "-c", "cat /proc/$$/stat" })
  local rest = out:match("%) (.*)$")
  local fields = {}
  for f in rest:gmatch("%S+") do fields[#fields + 1] = f end
  return tonumber(fields[20])
end

-- Everything of `held` still on the host, as a list of texts (empty: nothing left). A
-- namespace's inode number is reused once it is freed, so a process in a netns of that
-- number counts only if it started before `held.ended` (another sandbox's made since
-- does not); taken before the rm that frees it, as ticks are 10 ms apart.
local function left_of(held)
  local left = {}
  if exists("/proc/" .. held.keeper) then left[#left + 1] = "keeper " .. held.keeper end
  if exists("/proc/" .. held.init) then left[#left + 1] = "init " .. held.init end
  if exists(held.socket) then left[#left + 1] = held.socket end
  for _, name in ipairs(core.fs.listdir("/tmp") or {}) do
    if name:match("^corral%-run%-" .. held.keeper .. "%-") or name:match("^corral%-names%-" .. held.keeper .. "%-") then
      left[#left + 1] = "/tmp/" .. name
    end
  end
  local cg = core.cgroup.info()
  for _, own in pairs(cg and cg.paths or {}) do
    for _, name in ipairs(core.fs.listdir(own) or {}) do
      if name:match("^corral%-" .. held.keeper .. "%-") then left[#left + 1] = own .. "/" .. name end
    end
  end
  for _, pid in ipairs(core.fs.listdir("/proc") or {}) do
    if pid:match("^%d+$") and core.fs.readlink("/proc/" .. pid .. "/ns/net") == held.netns
      and (not held.ended or (started_at(pid) or math.huge) <= held.ended) then
      left[#left + 1] = "netns " .. held.netns .. " (pid " .. pid .. ")"
      break
    end
  end
  return left
end

describe("sessions", function()
  local id = "spec-" .. h.own_pid()
  local port, server
  local created_out, created_status

  setup(function()
    if not is_root then return end
    port = h.free_port()
    local p = assert(io.popen("/usr/bin/python3 -m http.server " .. port .. " --bind 127.0.0.1 >/dev/null 2>&1 & " ..
      "echo $!"))
    server = p:read("l")
    p:close()
    created_out, created_status = h.corral("create", id, "--allow", "ok.test:" .. port, "--resolve",
      "ok.test=127.0.0.1", "--resolve", "late.test=127.0.0.1", "--internal", "127.0.0.0/8")
    assert(h.wait_for(function()
      return os.execute("curl -s -o /dev/null http://127.0.0.1:" .. port .. "/") == true
    end, 5), "the HTTP server did not start")
  end)

  teardown(function()
    if server then os.execute("kill " .. server) end
    if is_root then h.corral("rm", id) end
  end)

  local function need_root()
    if not is_root then
      pending("sessions are built as root here (native, the keeper's cgroups)")
      return false
    end
    assert.are.equal(0, created_status, created_out)
    return true
  end

  it("create prints the id once ready; ls lists it; an id already live is refused naming it", function()
    if not need_root() then return end
    assert.are.equal(id .. "\n", created_out)
    local row = ls()[id]
    assert.truthy(row, "not listed")
    assert.are.equal("native", row.mechanism)
    assert.are.equal(1, row.egress.allow)
    local out, status = h.corral("create", id)
    assert.are.equal(2, status, out)
    assert.matches("ID: " .. id:gsub("%-", "%%-") .. " is live already", out)
    assert.truthy(ls()[id], "the refusal touched the live one")
    -- the REPL's sandboxes() (corral.operator) lists it beside runs
    out = h.capture({ h.host, "-e", "for _, s in ipairs(require('corral.operator').sandboxes()) do print(s.id) end" })
    assert.truthy(("\n" .. out):find("\n" .. id .. "\n", 1, true), out)
  end)

  it("--service-port: create says where; a server a background exec started answers there", function()
    if not need_root() then return end
    local sid = id .. "-svc"
    local out, status = h.corral("create", sid, "--service-port", "8080")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", sid) end)
    local addr = assert(out:match("service port 8080 on (127%.0%.0%.1:%d+)"), out)
    local curl = { "curl", "-sS", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://" .. addr .. "/" }
    local before = h.capture(curl)
    assert.is_nil(before:find("200", 1, true), before) -- nothing listens inside yet
    out, status = exec(sid, "--", "sh", "-c", "cd /tmp && setsid /usr/bin/python3 -m http.server 8080 " ..
      "--bind 127.0.0.1 </dev/null >/dev/null 2>&1 &")
    assert.are.equal(0, status, out)
    assert.truthy(h.wait_for(function() return h.capture(curl) == "200" end, 5), "no answer at " .. addr)
  end)

  it("--wall bounds each exec as it bounds a run's command (124); the next exec runs", function()
    if not need_root() then return end
    local wid = id .. "-w"
    local out, status = h.corral("create", wid, "--wall", "1s")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", wid) end)
    local t0 = core.clock.monotime()
    out, status = exec(wid, "--", "sh", "-c", "sleep 5; echo late")
    assert.are.equal(124, status, out)
    assert.is_nil(out:find("late", 1, true), out)
    assert.truthy(core.clock.monotime() - t0 < 4, "the wall did not end it")
    out, status = exec(wid, "--", "echo", "control")
    assert.are.equal(0, status, out)
    assert.matches("control", out)
  end)

  it("bad input is refused naming the flag, exit 2, nothing left", function()
    if not need_root() then return end
    local bad = id .. "-bad"
    for _, case in ipairs({ { { "--memory", "zz" }, "--memory" }, { { "--allow", "garbage" }, "--allow" },
                            { { "--mechanism", "/nonexistent/corral-mechanism.lua" }, "--mechanism" },
                            { { "--receipt", "/tmp/r" }, "--receipt" } }) do
      local argv = { "create", bad }
      for _, a in ipairs(case[1]) do argv[#argv + 1] = a end
      local out, status = h.corral(table.unpack(argv))
      assert.are.equal(2, status, out)
      assert.matches(case[2], out, nil, true)
      assert.is_false(exists(socket_of(bad)))
    end
    local out, status = h.corral("create", "no/slash")
    assert.are.equal(2, status, out)
    assert.matches("ID", out)
    -- a "..", which no sandbox id holds: refused as ID's, never as an --id the user never gave
    out, status = h.corral("create", "a..b")
    assert.are.equal(2, status, out)
    assert.truthy(out:find("invalid_argument: ID: \"a..b\": 1 to 63", 1, true), out)
    -- control: the same id with good flags is made (and removed)
    out, status = h.corral("create", bad, "--memory", "64M")
    assert.are.equal(0, status, out)
    assert.are.equal(0, select(2, h.corral("rm", bad)))
  end)

  it("two creates of one ID at once: one is made, the other refused as an ID live already (2), nothing left",
    function()
    if not need_root() then return end
    local twin = id .. "-twin"
    local out = h.sh([[
      "$1" create "$2" 2>&1 & a=$!; "$1" create "$2" 2>&1 & b=$!
      wait $a; sa=$?; wait $b; echo "statuses $sa $? $(( sa + $? ))"]], h.host, twin)
    defer(function() h.corral("rm", twin) end)
    -- one 0 and one 2, in either order
    assert.truthy(out:find("statuses [02] [02] 2\n"), out)
    assert.truthy(out:find("corral create: invalid_argument: ID: " .. twin .. " is live already", 1, true), out)
    -- the loser's own words, asked the same way once the winner is live (control: the same refusal)
    local again, status = h.corral("create", twin)
    assert.are.equal(2, status, again)
    assert.truthy(again:find("ID: " .. twin .. " is live already", 1, true), again)
    out, status = h.corral("rm", twin)
    assert.are.equal(0, status, out)
    out = h.corral("ls")
    assert.is_nil(out:find(twin, 1, true), out)
  end)

  it("execs share state: /tmp, /storage and a background process; exit status returned", function()
    if not need_root() then return end
    local out, status = exec(id, "--", "sh", "-c", "echo t > /tmp/t; echo s > /storage/s; " ..
      "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo bg=$!; exit 7")
    assert.are.equal(7, status, out)
    local bg = assert(out:match("bg=(%d+)"), out)
    out, status = exec(id, "--", "sh", "-c", "cat /tmp/t /storage/s; cat /proc/" .. bg .. "/cmdline | tr '\\0' ' '")
    assert.are.equal(0, status, out)
    assert.matches("t\ns\nsleep 300", out)
    out, status = exec(id, "--", "sh", "-c", "kill -9 $$")
    assert.are.equal(137, status, out)
    out, status = exec(id, "--", "nosuch-command")
    assert.are.equal(127, status, out)
    assert.matches("nosuch%-command: command not found", out)
  end)

  it("a forwarded signal reaches the command; a client gone kills its tree", function()
    if not need_root() then return end
    local p, pid = h.child("exec " .. h.quote(h.host) .. " " .. h.quote(CLIENT) .. " " .. id ..
      " -- sh -c 'trap \"echo got-term; exit 9\" TERM; echo ready; while :; do sleep 0.05; done'")
    repeat local l = p:read("l") until l == nil or l == "ready"
    os.execute("kill -TERM " .. pid)
    local rest = p:read("a")
    local _, _, code = p:close()
    assert.are.equal(9, code, rest)
    assert.matches("got%-term", rest)
    -- the client killed (no EOF handshake): the exec and what it started end with it
    p, pid = h.child("exec " .. h.quote(h.host) .. " " .. h.quote(CLIENT) .. " " .. id ..
      " -- sh -c 'sleep 271 </dev/null >/dev/null 2>&1 & echo ready; wait'")
    repeat local l = p:read("l") until l == nil or l == "ready"
    os.execute("kill -KILL " .. pid)
    p:close()
    assert.truthy(h.wait_for(function()
      local o = exec(id, "--", "sh", "-c", "ps -eo args | grep -c '^sleep 271'")
      return o:match("\n0\n$") or o:match("^0\n") or o:match("\n0$")
    end, 5), "the exec's tree outlived its client")
    -- control: a process of that kind is seen while its client lives
    local o = exec(id, "--", "sh", "-c", "sleep 271 >/dev/null 2>&1 & ps -eo args | grep -c '^sleep 271'")
    assert.matches("1\n", o)
  end)

  it("-t gives a terminal of the sandbox's own devpts", function()
    if not need_root() then return end
    local out, status = exec("-t", "--input", "typed\n", id, "--", "sh", "-c",
      "ls -l /proc/self/fd/0; tty; stty size; read x; echo \"got $x\"")
    assert.are.equal(0, status, out)
    assert.matches("/proc/self/fd/0 %-> /dev/pts/%d+", out)
    assert.matches("\n/dev/pts/%d+\r?\n", out)
    assert.matches("24 80", out)
    assert.matches("got typed", out)
    -- control: without -t the same command has no terminal
    out = exec(id, "--", "sh", "-c", "tty </dev/null")
    assert.matches("not a tty", out)
  end)

  it("the environment policy holds for exec: a credential is refused naming --env", function()
    if not need_root() then return end
    local out, status = exec("--env", "AWS_SECRET_ACCESS_KEY=abc", id, "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("--env AWS_SECRET_ACCESS_KEY", out, nil, true)
    out, status = exec("--env", "GREETING=hello", "--cwd", "/storage", id, "--", "sh", "-c", "echo $GREETING; pwd")
    assert.are.equal(0, status, out)
    assert.matches("hello\n/storage", out)
    out, status = exec("--cwd", "/no/such/dir", id, "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("--cwd", out, nil, true)
    out, status = exec("--fds", "1", id, "--", "true")
    assert.are.equal(2, status, out)
  end)

  it("the allowlist holds for exec; policy --allow opens a name, --revoke closes it", function()
    if not need_root() then return end
    local curl = "curl -sS -m 3 -o /dev/null -w 'code=%%{http_code}\\n' http://%s:" .. port .. "/"
    local out = exec(id, "--", "sh", "-c", h.attempt_then_control(curl:format("late.test"), curl:format("ok.test")))
    local _, control, attempt = h.after_attempt(out, "code=200")
    assert.is_nil(attempt:find("code=200", 1, true), out)
    assert.matches("code=200", control)
    local pout, status = h.corral("policy", id, "--allow", "late.test:" .. port)
    assert.are.equal(0, status, pout)
    assert.matches("late.test:" .. port, pout, nil, true)
    out = exec(id, "--", "sh", "-c", curl:format("late.test"))
    assert.matches("code=200", out)
    pout, status = h.corral("policy", id, "--revoke", "late.test:" .. port)
    assert.are.equal(0, status, pout)
    out = exec(id, "--", "sh", "-c", h.attempt_then_control(curl:format("late.test"), curl:format("ok.test")))
    _, control, attempt = h.after_attempt(out, "code=200")
    assert.is_nil(attempt:find("code=200", 1, true), out)
    assert.matches("code=200", control)
    pout, status = h.corral("policy", id .. "-none", "--allow", "x.test:1")
    assert.are.equal(2, status, pout)
    -- refusals name the flag and say the entry once, never the Lua field
    pout, status = h.corral("policy", id, "--allow", "bad entry")
    assert.are.equal(2, status, pout)
    assert.matches('^corral policy: invalid_argument: %-%-allow: "bad entry": contains whitespace\n$', pout)
    pout, status = h.corral("policy", id, "--revoke", "late.test:" .. port)
    assert.are.equal(2, status, pout)
    assert.matches("^corral policy: invalid_argument: %-%-revoke: late%.test:" .. port .. " is not in ", pout)
  end)

  it("another uid cannot use the socket; its owner can", function()
    if not need_root() then return end
    local why = h.test_user_missing()
    if why then return pending(why) end
    local out, status = h.capture(h.as_test_user({ h.host, CLIENT, id, "--", "echo", "in" }))
    assert.are_not.equal(0, status, out)
    assert.is_nil(out:find("\nin\n", 1, true), out)
    out, status = exec(id, "--", "echo", "in")
    assert.are.equal(0, status, out)
    assert.matches("in\n", out)
  end)

  it("the resource limits hold for exec'd processes: conformance --session --only resources", function()
    if not need_root() then return end
    -- wall and pids: an exec is no pid 1 (its tree is killed at the wall), and what an
    -- attempt left in the background is stopped before the control, as a run's stop does
    local out, status = h.corral("conformance", "--session", "--only", "resources", "--json")
    assert.are.equal(0, status, out)
    local report = assert(json.decode(out:match("%b{}")), out)
    assert.are.equal("native+exec", report.mechanism)
    local outcomes = {}
    for _, r in ipairs(report.results) do outcomes[r.id] = r.outcome end
    for _, check in ipairs({ "res.memory", "res.pids", "res.cpu", "res.wall" }) do
      assert.are.equal("held", outcomes[check], check .. ": " .. out)
    end
    assert.are.equal(0, report.census.breached)
  end)

  it("bwrap: execs join bubblewrap's sandbox (state kept, its filter, its devpts), rm leaves nothing", function()
    if not need_root() then return end
    if not core.path.resolve_executable("bwrap"):find("/", 1, true) then return pending("bwrap is not installed") end
    local bid = id .. "-b"
    local out, status = h.corral("create", bid, "--mechanism", "bwrap")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", bid) end)
    assert.are.equal("bwrap", ls()[bid].mechanism)
    out, status = exec(bid, "--", "sh", "-c", "echo kept > /tmp/f; grep -E '^(CapEff|NoNewPrivs|Seccomp):' " ..
      "/proc/self/status; exit 3")
    assert.are.equal(3, status, out)
    assert.matches("CapEff:%s+0+\n", out)
    assert.matches("NoNewPrivs:%s+1", out)
    assert.matches("Seccomp:%s+2", out)
    out, status = exec(bid, "--", "sh", "-c", "cat /tmp/f; ls /")
    assert.are.equal(0, status, out)
    assert.matches("kept\n", out)
    assert.is_nil(out:find("\nhome\n", 1, true), out) -- bubblewrap's root, not the host's
    out, status = exec("-t", bid, "--", "sh", "-c", "ls -l /proc/self/fd/0")
    assert.are.equal(0, status, out)
    assert.matches("/proc/self/fd/0 %-> /dev/pts/%d+", out)
    local k = holdings(bid)
    k.ended = ticks_now() -- before rm: the netns's number may be reused once rm frees it
    out, status = h.corral("rm", bid)
    assert.are.equal(0, status, out)
    assert.are.same({}, left_of(k))
  end)

  it("an unprivileged user's session: create, exec keeping state, rm", function()
    if not need_root() then return end
    local why = h.test_user_missing()
    if why then return pending(why) end
    local uid = id .. "-u"
    local function as_user(...)
      return h.capture(h.as_test_user({ "env", "-u", "XDG_RUNTIME_DIR", "HOME=/tmp", h.host, ... }))
    end
    local out, status = as_user("create", uid)
    assert.are.equal(0, status, out)
    defer(function() as_user("rm", uid) end)
    out, status = as_user(CLIENT, uid, "--", "sh", "-c", "echo kept > /tmp/f")
    assert.are.equal(0, status, out)
    out, status = as_user(CLIENT, uid, "--", "cat", "/tmp/f")
    assert.are.equal(0, status, out)
    assert.matches("kept", out)
    -- root's own list does not hold it (its runtime directory is the user's)
    assert.is_nil(ls()[uid])
    out, status = as_user("rm", uid)
    assert.are.equal(0, status, out)
    out, status = as_user(CLIENT, uid, "--", "true")
    assert.are_not.equal(0, status, out)
  end)

  -- After a kill: the next corral call (ls) sweeps what is left, lists no such id, and
  -- nothing the sandbox held (holdings) is left behind.
  local function swept_without_trace(kid, k)
    local out, status = h.corral("ls")
    assert.are.equal(0, status, out)
    assert.is_nil(out:find(kid, 1, true), out)
    assert.are.same({}, left_of(k))
  end

  it("a killed keeper takes its sandbox; the next corral call sweeps the rest", function()
    if not need_root() then return end
    local kid = id .. "-k"
    local out, status = h.corral("create", kid, "--allow", "ok.test:" .. port)
    assert.are.equal(0, status, out)
    local k = holdings(kid)
    defer(function() h.corral("rm", kid) end)
    os.execute("kill -KILL " .. k.keeper)
    k.ended = ticks_now()
    -- at once: any corral process of root's sweeps the same runtime directory
    assert.truthy(exists(k.socket), "nothing to sweep: the test proves nothing")
    assert.truthy(h.wait_for(function() return not exists("/proc/" .. k.init) end, 5), "the init outlived its keeper")
    swept_without_trace(kid, k)
  end)

  it("policy and rm whose keeper is killed before answering: exit 2 naming ID, never the flag; nothing left", function()
    if not need_root() then return end
    for _, cmd in ipairs({ { "policy", "--allow", "late.test:443" }, { "rm" } }) do
      local kid, tmp = id .. "-u" .. cmd[1], h.tmpdir("unanswered")
      defer(function() h.rmrf(tmp) end)
      local out, status = h.corral("create", kid, "--allow", "early.test:443")
      assert.are.equal(0, status, out)
      defer(function() h.corral("rm", kid) end)
      local k = holdings(kid)
      -- control: the keeper answers the same request while it lives
      out, status = h.corral("policy", kid, "--allow", "mid.test:443")
      assert.are.equal(0, status, out)
      -- the request waits at a stopped keeper, which is then killed
      out = h.sh([[
        k=$1 f=$2; shift 2; kill -STOP $k; "$@" >"$f" 2>&1 & pid=$!
        sleep 0.3; kill -0 $pid && echo waiting; kill -KILL $k; wait $pid; echo $? >"$f.status"]],
        tostring(k.keeper), tmp .. "/out", h.host, cmd[1], kid, table.unpack(cmd, 2))
      assert.truthy(out:find("^waiting\n"), out) -- control: it was waiting on the keeper
      out, status = h.read(tmp .. "/out"), tonumber(h.read(tmp .. "/out.status"))
      assert.are.equal(2, status, out)
      assert.truthy(out:find("corral " .. cmd[1] .. ": invalid_argument: ID: no live sandbox " .. kid
        .. ": its keeper ended before it answered", 1, true), out)
      assert.is_nil(out:find("--allow", 1, true), out)
      assert.truthy(h.wait_for(function() return not exists("/proc/" .. k.init) end, 5), "the init outlived its keeper")
      swept_without_trace(kid, k)
    end
  end)

  it("a sandbox whose init was killed is gone: exec exits 2 saying so, the keeper ends and leaves nothing", function()
    if not need_root() then return end
    local kid, tmp = id .. "-i", h.tmpdir("init-killed")
    defer(function() h.rmrf(tmp) end)
    local out, status = h.corral("create", kid)
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", kid) end)
    local k = holdings(kid)
    -- control: the sandbox runs commands while its init lives
    out, status = exec(kid, "--", "true")
    assert.are.equal(0, status, out)
    -- the exec's request waits at the socket of a stopped keeper while the init is
    -- killed: the keeper answers it before it looks at its init again
    out, status = h.sh([[
      kill -STOP "$1" && kill -KILL "$2" &&
      { "$3" exec "$4" -- true >"$5" 2>&1; echo $? >"$5.status"; } &
      sleep 0.5; kill -CONT "$1"; wait]], tostring(k.keeper), tostring(k.init), h.host, kid, tmp .. "/exec")
    assert.are.equal(0, status, out)
    out, status = h.read(tmp .. "/exec"), tonumber(h.read(tmp .. "/exec.status"))
    assert.are.equal(2, status, out)
    assert.matches("no live sandbox " .. kid:gsub("%p", "%%%0") .. ": its init has ended", out)
    assert.truthy(h.wait_for(function() return not exists("/proc/" .. k.keeper) end, 5), "the keeper lives on")
    swept_without_trace(kid, k)
  end)

  it("a keeper killed before the sandbox is ready: create exits 120 and says so, nothing live", function()
    local did = id .. "-d"
    local out, status = h.corral("create", did, "--mechanism", "tests/fixtures/mechanisms/dying_keeper.lua")
    assert.are.equal(120, status, out)
    assert.truthy(out:find("corral create: " .. did .. ": the keeper ended before the sandbox was ready", 1, true), out)
    out, status = h.corral("exec", did, "--", "true")
    assert.are.equal(2, status, out)
    -- control: the same id with a keeper that lives
    out, status = h.corral("create", did)
    assert.are.equal(0, status, out)
    out, status = h.corral("rm", did)
    assert.are.equal(0, status, out)
  end)

  it("create interrupted before its sandbox is ready exits 128+N and leaves nothing live, at one signal or two; " ..
    "control: the same create undisturbed", function()
    if not need_root() then return end
    local slow = "tests/fixtures/mechanisms/slow_keeper.lua"
    for _, case in ipairs({ { "INT", 130, 1 }, { "TERM", 143, 1 }, { "INT", 130, 2 } }) do
      local sid = id .. "-sig" .. case[1]:lower() .. case[3]
      defer(function() h.corral("rm", sid) end)
      local kills = string.rep("kill -" .. case[1] .. " $pid; sleep 0.1; ", case[3])
      local out = h.sh([[
        "$1" create "$2" --mechanism "$3" 2>&1 & pid=$!
        sleep 0.5; ]] .. kills .. [[wait $pid; echo "status=$?"]], h.host, sid, slow)
      assert.truthy(out:find("status=" .. case[2] .. "\n", 1, true), out)
      -- twice: create gives up at once; either way the keeper, made or not, does not stay
      if case[3] == 1 then
        assert.truthy(out:find("signal " .. (case[2] - 128) .. " arrived before it was ready; nothing of it is left",
          1, true), out)
      end
      os.execute("sleep 1.5")
      out = h.corral("ls")
      assert.is_nil(out:find(sid, 1, true), out)
    end
    local cid = id .. "-slow"
    local out, status = h.corral("create", cid, "--mechanism", slow)
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", cid) end)
    assert.truthy(h.corral("ls"):find(cid, 1, true))
  end)

  it("ls counts a session's allowed and denied connections since create (attempt, then control)", function()
    if not need_root() then return end
    local cid = id .. "-c"
    local out, status = h.corral("create", cid, "--allow", "ok.test:" .. port, "--resolve", "ok.test=127.0.0.1",
      "--internal", "127.0.0.0/8")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", cid) end)
    local curl = "curl -4 -sS -m 3 -o /dev/null -w 'code=%%{http_code}\\n' http://ok.test:%d/"
    out = exec(cid, "--", "sh", "-c", h.attempt_then_control(curl:format(port + 1), curl:format(port)))
    local _, control, attempt = h.after_attempt(out, "code=200")
    assert.is_nil(attempt:find("code=200", 1, true), out)
    assert.matches("code=200", control)
    -- a SYN the ruleset refused is read from its record once a second
    assert(h.wait_for(function() local e = ls()[cid].egress return e.denied > 0 end, 5), "no denial counted")
    local e = ls()[cid].egress
    assert.are.same({ 1, 1, 1 }, { e.allow, e.allowed, e.denied })
    out = h.corral("ls")
    assert.matches(cid:gsub("%-", "%%-") .. "%s+session%s+native%s+%S+%s+%d+%s+1 allow 1 ok 1 denied", out)
  end)

  it("corral attach ID: the REPL attaches to a session; why() and info() answer for it", function()
    if not need_root() then return end
    local pty = require "pty"
    local keeper = ls()[id].pid
    local out, code = pty.repl("attach " .. id, { 'print("S", info().session, info().pid)\n',
      'print("W1", why("late.test:' .. port .. '").verdict)\n', 'print("W2", why("ok.test:' .. port .. '").verdict)\n',
      "os.exit(0)\n" })
    assert.are.equal(0, code, out)
    assert.truthy(out:find("attached to " .. id .. "@" .. keeper, 1, true), out)
    assert.truthy(pty.line_at(out, "S\t" .. id .. "\t" .. keeper), out)
    assert.truthy(pty.line_at(out, "W1\tdeny"), out)
    assert.truthy(pty.line_at(out, "W2\tallow"), out)
  end)

  it("--learn is written at rm with what exec'd processes connected to; --log-json holds their decisions", function()
    if not need_root() then return end
    local cid = id .. "-l"
    local dir = assert(core.fs.mkdtemp("/tmp/corral-session-learn-"))
    defer(function() core.fs.remove_tree(dir) end)
    local out, status = h.corral("create", cid, "--resolve", "ok.test=127.0.0.1", "--internal", "127.0.0.0/8",
      "--learn", dir .. "/learned", "--log-json", dir .. "/log")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", cid) end)
    out = exec(cid, "--", "curl", "-4", "-s", "-m", "2", "-o", "/dev/null", "-w", "code=%{http_code}\n",
      "http://ok.test:" .. port .. "/")
    assert.is_nil(out:find("code=200", 1, true), out) -- learn mode denies, and records
    out, status = h.corral("rm", cid)
    assert.are.equal(0, status, out)
    local learned = h.read(dir .. "/learned") or ""
    assert.matches("\nok%.test:" .. port .. "%s+# tcp, 1 connection", learned)
    local decisions = {}
    for line in (h.read(dir .. "/log") or ""):gmatch("[^\n]+") do
      local ev = json.decode(line)
      if ev.kind == "connect" then decisions[#decisions + 1] = ev.name .. ":" .. ev.port .. " " .. ev.verdict end
    end
    assert.are.same({ "ok.test:" .. port .. " deny" }, decisions)
  end)

  it("a custom mechanism: each exec through its exec callback, its refusal its own", function()
    if not need_root() then return end
    local cid = id .. "-m"
    local out, status = h.corral("create", cid, "--mechanism", "scripts/examples/command_policy.lua")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", cid) end)
    assert.are.equal("command_policy", ls()[cid].mechanism)
    out, status = exec(cid, "--", "python3", "-c", "print(1)")
    assert.are.equal(2, status, out)
    assert.matches("python3 is not on command_policy's list", out)
    out, status = exec(cid, "--env", "K=v", "--", "sh", "-c", "echo $K > /storage/f; exit 4")
    assert.are.equal(4, status, out)
    out, status = exec(cid, "--", "cat", "/storage/f")
    assert.are.equal(0, status, out)
    assert.matches("^v\n$", out)
    out, status = exec("-t", cid, "--", "sh")
    assert.are_not.equal(0, status, out)
    assert.matches("%-t", out)
  end)

  it("oci: execs through the engine's exec into the started container; rm leaves no container", function()
    if not need_root() then return end
    local oci = require "corral.mechanism.oci"
    local eng, why = oci.engine()
    if not eng then return pending("no OCI engine: " .. tostring(why)) end
    local cid = id .. "-o"
    local out, status = h.corral("create", cid, "--mechanism", "oci")
    assert.are.equal(0, status, out)
    defer(function() h.corral("rm", cid) end)
    assert.are.equal("oci", ls()[cid].mechanism)
    out, status = exec(cid, "--env", "K=v", "--cwd", "/tmp", "--", "sh", "-c",
      "echo kept > /storage/f; id -u; pwd; echo K=$K; grep -E '^CapEff:' /proc/self/status; exit 3")
    assert.are.equal(3, status, out)
    assert.matches("^%d+\n/tmp\nK=v\nCapEff:%s+0+\n", out)
    assert.are_not.equal("0", out:match("^(%d+)\n/tmp"))
    out, status = exec(cid, "--", "cat", "/storage/f")
    assert.are.equal(0, status, out)
    assert.matches("^kept\n$", out)
    out, status = exec(cid, "--env", "AWS_SECRET_ACCESS_KEY=x", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-%-env", out)
    out, status = exec("-t", cid, "--", "sh", "-c", "tty")
    assert.are.equal(0, status, out)
    assert.matches("/dev/pts/%d+", out)
    -- a forwarded signal reaches the command inside (the engine's client forwards none)
    local p = io.popen(h.host .. " " .. CLIENT .. " " .. cid .. " -- sh -c 'trap \"echo got-term; exit 7\" TERM; " ..
      "echo ready; while :; do sleep 0.1; done' 2>&1 & echo client=$!; wait $!; echo status=$?", "r")
    local client
    repeat
      local line = p:read("l")
      client = client or (line and line:match("^client=(%d+)"))
    until line == "ready" or line == nil
    os.execute("kill -TERM " .. client)
    local rest = p:read("a")
    p:close()
    assert.matches("got%-term", rest)
    assert.matches("status=7", rest)
    local names = oci.call({ "ps", "--all", "--format", "{{.Names}}" }) or ""
    local mine = ls()[cid].pid
    assert.matches("corral%-%x+%-" .. mine .. "%-", names) -- control: the container is there while live
    out, status = h.corral("rm", cid)
    assert.are.equal(0, status, out)
    names = oci.call({ "ps", "--all", "--format", "{{.Names}}" }) or ""
    assert.is_nil(names:find("-" .. mine .. "-", 1, true), names)
  end)

  it("rm stops and destroys the sandbox and leaves nothing", function()
    if not need_root() then return end
    local k = holdings(id)
    assert.are_not.same({}, left_of(k)) -- control: while live, the keeper's objects are found
    -- what the sandbox ran started before rm; a netns inode is reused as soon as it is
    -- freed, so a process another test starts after rm may show the same one
    k.ended = ticks_now()
    local out, status = h.corral("rm", id)
    assert.are.equal(0, status, out)
    assert.are.equal(id .. "\n", out)
    assert.are.same({}, left_of(k))
    out, status = exec(id, "--", "true")
    assert.are_not.equal(0, status, out)
    out, status = h.corral("rm", id)
    assert.are.equal(2, status, out)
    assert.matches("no live sandbox", out)
  end)
end)
