-- `corral exec`, the C client of a live sandbox's keeper (core/host/session_exec.c):
-- its arguments refused naming the flag, no keeper, a runtime directory others may
-- enter; then, against a real keeper (`corral create`), status, stdio, signals, a
-- terminal of the sandbox's own, and a killed client's command gone.
local core = require "corral.core"
local h = require "helpers"
local pty = require "pty"

local function core_pid() return core.proc.getpid() end

local NO_KEEPER = "no live sandbox "

describe("corral exec's arguments", function()
  -- Each refusal, then the same line with the flag put right: it gets past the parse to
  -- the keeper's socket (none answers for this id), so the refusal was the flag's.
  local cases = {
    { { "--", "true" }, "ID", { "nobox", "--", "true" } },
    { { "bad/id", "--", "true" }, "ID", { "good.id-1", "--", "true" } },
    { { "a..b", "--", "true" }, "ID", { "a.b", "--", "true" } },
    { { "nobox" }, "the command", { "nobox", "true" } },
    { { "nobox", "--" }, "the command", { "nobox", "--", "true" } },
    { { "nobox", "--env", "--", "true" }, "--env", { "nobox", "--env", "A=", "--", "true" } },
    { { "nobox", "--env", "1A=x", "--", "true" }, "--env", { "nobox", "--env", "A1=x", "--", "true" } },
    { { "nobox", "--env", "CORRAL_EXEC_UNSET_VAR", "--", "true" }, "--env",
      { "nobox", "--env", "PATH", "--", "true" } },
    { { "nobox", "--cwd", "rel", "--", "true" }, "--cwd", { "nobox", "--cwd", "/rel", "--", "true" } },
    { { "nobox", "--cwd", "/a", "--cwd=/b", "--", "true" }, "--cwd", { "nobox", "--cwd=/b", "--", "true" } },
    { { "nobox", "--cwd" }, "--cwd", { "nobox", "--cwd", "/", "true" } },
    { { "nobox", "--tty=yes", "--", "true" }, "--tty", { "nobox", "--tty", "--", "true" } },
    { { "nobox", "--what", "--", "true" }, "--what", { "nobox", "-t", "--", "true" } },
    { { "nobox", "-x", "--", "true" }, "-x", { "nobox", "--", "-x" } },
  }
  for _, c in ipairs(cases) do
    local args, named, fixed = c[1], c[2], c[3]
    it("refuses `" .. table.concat(args, " ") .. "` naming " .. named .. ", exit 2", function()
      local out, status = h.corral("exec", table.unpack(args))
      assert.are.equal(2, status, out)
      assert.truthy(out:find("corral exec: invalid_argument: " .. named .. ": ", 1, true), out)
      out, status = h.corral("exec", table.unpack(fixed))
      assert.are.equal(2, status, out)
      assert.truthy(out:find(NO_KEEPER, 1, true), out)
      assert.is_nil(out:find("invalid_argument", 1, true), out)
    end)
  end

  it("-h or --help before the command is the usage; after it, the command's word", function()
    for _, args in ipairs({ { "-h" }, { "nobox", "--help" }, { "nobox", "--env", "A=1", "-h", "--", "true" } }) do
      local out, status = h.corral("exec", table.unpack(args))
      assert.are.equal(0, status, out)
      assert.truthy(out:find("corral exec ID [--env", 1, true), out)
    end
    local out, status = h.corral("exec", "nobox", "--", "ls", "-h")
    assert.are.equal(2, status, out)
    assert.truthy(out:find(NO_KEEPER .. "nobox", 1, true), out)
  end)
end)

describe("corral exec without a keeper", function()
  it("says there is no live sandbox by that id, exit 2", function()
    local out, status = h.corral("exec", "corral-exec-none", "--", "/bin/true")
    assert.are.equal(2, status)
    assert.are.equal("corral exec: no live sandbox corral-exec-none (corral ls lists this user's)\n", out)
  end)

  it("refuses a runtime directory that others may enter, and uses it once it is private", function()
    local why = h.test_user_missing()
    if why then return pending(why) end
    local base = h.tmpdir("exec-rundir")
    local rundir = base .. "/corral"
    h.must("mkdir -m 0755 " .. h.quote(rundir) .. " && chown " .. h.TEST_UID .. " " .. h.quote(rundir) ..
      " && chmod 0755 " .. h.quote(base))
    local function exec_as_user()
      return h.capture(h.as_test_user({ "env", "XDG_RUNTIME_DIR=" .. base, h.host, "exec", "box", "--", "true" }))
    end
    local out, status = exec_as_user()
    assert.are.equal(2, status, out)
    assert.truthy(out:find(rundir .. ": its mode lets others in", 1, true), out)
    -- another owner
    h.must("chmod 0700 " .. h.quote(rundir) .. " && chown 0 " .. h.quote(rundir))
    out, status = exec_as_user()
    assert.are.equal(2, status, out)
    assert.truthy(out:find("owned by another user", 1, true), out)
    -- control: the user's own, private: used (and no keeper in it)
    h.must("chown " .. h.TEST_UID .. " " .. h.quote(rundir))
    out, status = exec_as_user()
    assert.are.equal(2, status, out)
    assert.truthy(out:find(NO_KEEPER .. "box", 1, true), out)
    h.rmrf(base)
  end)
end)

-- The rest against a real keeper: one live sandbox for the whole block (each test's
-- command is its own exec), removed at the end.
describe("corral exec into a live sandbox", function()
  local ID = "exec-spec-" .. core_pid()
  local created

  local function exec(...)
    return h.corral("exec", ID, ...)
  end

  setup(function()
    -- created ignoring SIGUSR1 and SIGUSR2, as a caller may: the keeper inherits that,
    -- its commands must not
    local out, status = h.capture({ "sh", "-c", 'trap "" USR1 USR2; exec "$0" create "$1" 2>&1', h.host, ID })
    created = status == 0
    assert.are.equal(0, status, out)
  end)

  teardown(function()
    if created then h.corral("rm", ID) end
  end)

  it("exits with the command's status", function()
    local out, status = exec("--", "sh", "-c", "exit 7")
    assert.are.equal(7, status, out)
    out, status = exec("--", "/bin/true")
    assert.are.equal(0, status, out)
  end)

  it("gives the command this stdin, stdout and stderr", function()
    local errf = os.tmpname()
    local p = assert(io.popen("printf 'line one\\nline two\\n' | " .. h.quote(h.host) .. " exec " .. ID ..
      " -- sh -c 'cat; echo to-stderr >&2; exit 3' 2>" .. h.quote(errf)))
    local out = p:read("a")
    local _, _, status = p:close()
    local err = h.read(errf)
    os.remove(errf)
    assert.are.equal(3, status)
    assert.are.equal("line one\nline two\n", out)
    assert.are.equal("to-stderr\n", err)
  end)

  it("passes --env and --cwd; a refusal's status and text are the keeper's", function()
    local out, status = h.capture({ "env", "CORRAL_EXEC_SPEC=from-here", h.host, "exec", ID,
      "--env", "CORRAL_EXEC_SPEC", "--env", "OTHER=a b\"c", "--cwd", "/tmp", "--",
      "sh", "-c", "echo \"$CORRAL_EXEC_SPEC|$OTHER|$(pwd)\"" })
    assert.are.equal(0, status, out)
    assert.are.equal("from-here|a b\"c|/tmp\n", out)
    out, status = exec("--", "corral-exec-spec-no-such-command")
    assert.are.equal(127, status, out)
    assert.truthy(out:find("corral exec: ", 1, true), out)
  end)

  it("passes arguments, --env values and --cwd byte for byte, UTF-8 or not (found by an adversarial pass)",
    function()
    -- bytes no UTF-8 holds (0xff, a lone 0xe9, a truncated sequence) and, as the control,
    -- valid UTF-8: each must reach the command as it was given, never re-encoded
    local odd, valid = "a\255z\226\130", "\195\169"
    local out, status = exec("--env", "X=\233", "--env", "Y=" .. valid, "--",
      "sh", "-c", 'printf %s "$1|$X|$Y|" | od -An -tx1 | tr -d " \n"', "x", odd)
    assert.are.equal(0, status, out)
    assert.are.equal("61ff7ae2827ce97cc3a97c", out)
    out, status = exec("--", "mkdir", "-p", "/tmp/\255dir")
    assert.are.equal(0, status, out)
    out, status = exec("--cwd", "/tmp/\255dir", "--", "sh", "-c", "pwd | od -An -tx1 | tr -d ' \n'")
    assert.are.equal(0, status, out)
    assert.are.equal("2f746d702fff6469720a", out) -- "/tmp/\255dir\n"
  end)

  it("a command and --env longer than a keeper reads are refused naming CMD (2), never sent; " ..
    "control: 30,000 bytes pass", function()
    -- one argument of 70,000 bytes: over what a keeper reads, under what one argument may be
    local long = string.rep("a", 70000)
    for _, args in ipairs({ { "--env", "X=" .. long, "--", "true" }, { "--", "true", long } }) do
      local out, status = exec(table.unpack(args))
      assert.are.equal(2, status, out)
      assert.truthy(out:find("corral exec: invalid_argument: CMD: the command, --env and --cwd take", 1, true), out)
      assert.truthy(out:find("bytes as a request; a keeper reads at most 65536", 1, true), out)
    end
    local out, status = exec("--", "sh", "-c", 'echo ${#1}', "x", string.rep("a", 30000))
    assert.are.equal(0, status, out)
    assert.are.equal("30000\n", out)
  end)

  it("forwards SIGTERM to the command, which sees it; its death by it is 143", function()
    local out = h.sh([[
      f=$(mktemp); "$1" exec "$2" -- sh -c 'trap "echo got-term; trap - TERM; kill -TERM \$\$" TERM
        echo ready; while :; do sleep 0.05; done' >"$f" & pid=$!
      while ! grep -q ready "$f"; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
      kill -TERM $pid; wait $pid; echo "status=$?"; cat "$f"; rm -f "$f"]], h.host, ID)
    assert.truthy(out:find("status=143\n", 1, true), out)
    assert.truthy(out:find("ready\ngot-term\n", 1, true), out)
  end)

  it("-t: a terminal of the sandbox's own, this one's window size, this one restored", function()
    if not os.execute("command -v script >/dev/null") then return pending("no script(1)") end
    local inner = "stty rows 33 cols 111; before=$(stty -g); " .. h.quote(h.host) .. " exec -t " .. ID ..
      " -- sh -c 'tty; stty size; test -t 0 && echo in-tty'; echo status=$?; " ..
      "test \"$(stty -g)\" = \"$before\" && echo restored"
    -- script's input stays open (a fifo a sleeper holds) until the command is done: at the
    -- end of its input script types the EOF character, which, typed while the command
    -- runs, its terminal would echo as the user's
    local out = pty.run("d=$(mktemp -d) && mkfifo \"$d/in\" && { sleep 30 >\"$d/in\" & s=$!; } && " ..
      "script -qec " .. h.quote(inner) .. " /dev/null <\"$d/in\"; kill $s; rm -r \"$d\"")
    out = out:gsub("\r", "")
    assert.truthy(out:find("/dev/pts/%d+\n33 111\nin%-tty\nstatus=0\nrestored\n"), out)
    -- control: the same command without -t has no terminal
    local plain, status = exec("--", "sh", "-c", "tty; true")
    assert.are.equal(0, status, plain)
    assert.truthy(plain:find("not a tty", 1, true), plain)
  end)

  it("holds the command itself, no copy of the keeper beside it (docs/sessions.md)", function()
    local list = h.capture({ h.host, "ls", "--json" })
    local keeper
    for _, s in ipairs(require("dkjson").decode(list) or {}) do
      if s.id == ID then keeper = s.pid end
    end
    assert.truthy(keeper, list)
    local marker = "8" .. tostring(core_pid()) .. ".5"
    local out = h.sh([[
      f=$(mktemp); "$1" exec "$2" -- sh -c "echo ready; exec sleep $3" >"$f" & pid=$!
      while ! grep -q ready "$f"; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
      rm -f "$f"
      for c in $(cat /proc/$4/task/$4/children); do
        echo "child $(cat /proc/$c/comm) $(tr '\0' ' ' </proc/$c/cmdline)"
      done
      kill -TERM $pid; wait $pid 2>/dev/null; true]], h.host, ID, marker, keeper)
    -- control: the scan sees the keeper's children (the sandbox's waiting init is one)
    assert.truthy(out:find("child corral-init", 1, true), out)
    assert.truthy(out:find("child sleep sleep " .. marker, 1, true), out)
    assert.are.equal(1, select(2, out:gsub("child corral%-init", "")), out)
  end)

  -- The keeper's pid, from `corral ls --json`.
  local function keeper_pid()
    local list = h.capture({ h.host, "ls", "--json" })
    for _, s in ipairs(require("dkjson").decode(list) or {}) do
      if s.id == ID then return s.pid end
    end
    error("no keeper for " .. ID .. " in " .. list)
  end

  -- /proc/PID/stat's fields after the name, numbered as proc(5) numbers them.
  local function stat(pid)
    local fields, i = {}, 2
    for word in h.read("/proc/" .. pid .. "/stat"):match("%) (.*)$"):gmatch("%S+") do
      i = i + 1
      fields[i] = tonumber(word) or word
    end
    return fields
  end

  it("the keeper's command line is its id alone: an exec shares its memory until its exec", function()
    local pid = keeper_pid()
    local cmdline = h.read("/proc/" .. pid .. "/cmdline"):gsub("%z+$", "")
    assert.are.equal("corral-keeper " .. ID, cmdline)
    -- control: the exec that follows still runs
    local out, status = exec("--", "sh", "-c", "echo ran")
    assert.are.equal(0, status, out)
    assert.are.equal("ran\n", out)
  end)

  it("an exec copies none of the keeper's memory (as root): no page faults of its own per exec", function()
    if core.proc.geteuid() ~= 0 then return pending("the one-clone join is root's (its pid namespace)") end
    local pid = keeper_pid()
    exec("--", "/bin/true") -- the first exec's one-time faults (a module loaded, a table grown)
    local before = stat(pid)
    h.sh([[for i in $(seq 20); do "$1" exec "$2" -- /bin/true || echo failed; done]], h.host, ID)
    local after = stat(pid)
    -- a fork of the keeper per exec faulted ~66 of its pages each (copy-on-write)
    local own = (after[10] - before[10]) / 20
    assert.is_true(own < 20, "the keeper faulted " .. own .. " pages per exec")
    -- control: the faults are counted, and the keeper's: its reaped children's (each
    -- /bin/true's own start-up) add up in its cminflt
    assert.is_true(after[11] - before[11] >= 20 * 10, "children's faults: " .. (after[11] - before[11]))
  end)

  it("the command starts with the default dispositions and nothing blocked, whatever the keeper's", function()
    local function masks(text)
      local m = {}
      for _, name in ipairs({ "SigBlk", "SigIgn", "SigCgt" }) do m[name] = text:match(name .. ":%s*(%x+)") end
      return m
    end
    local out, status = exec("--", "cat", "/proc/self/status")
    assert.are.equal(0, status, out)
    assert.are.same({ SigBlk = ("0"):rep(16), SigIgn = ("0"):rep(16), SigCgt = ("0"):rep(16) }, masks(out))
    -- control: the keeper itself blocks, catches (its signalfd, its SIGINT) and ignores
    -- (SIGUSR1 and SIGUSR2, from its caller) signals
    local keeper = masks(h.read("/proc/" .. keeper_pid() .. "/status"))
    assert.are_not.equal(("0"):rep(16), keeper.SigBlk)
    assert.are_not.equal(("0"):rep(16), keeper.SigCgt)
    assert.are.equal(0xa00, tonumber(keeper.SigIgn, 16) & 0xa00, keeper.SigIgn)
  end)

  it("100 execs leave the keeper's fds, threads, children and memory where they were", function()
    local pid = keeper_pid()
    local function usage()
      local fds = #(core.fs.listdir("/proc/" .. pid .. "/fd") or {})
      local status = h.read("/proc/" .. pid .. "/status")
      local children = h.read("/proc/" .. pid .. "/task/" .. pid .. "/children")
      return fds, tonumber(status:match("Threads:%s*(%d+)")), select(2, children:gsub("%d+", "")),
        tonumber(status:match("VmRSS:%s*(%d+)"))
    end
    exec("--", "/bin/true")
    local fds, threads, children, rss = usage()
    local out = h.sh([[for i in $(seq 100); do "$1" exec "$2" -- /bin/true || echo failed; done]], h.host, ID)
    assert.are.equal("", out)
    local fds2, threads2, children2, rss2 = usage()
    assert.are.same({ fds, threads, children }, { fds2, threads2, children2 })
    assert.is_true(rss2 - rss < 512, "RSS grew from " .. rss .. " kB to " .. rss2 .. " kB")
    -- control: the counts are the keeper's (its waiting init is a child of its)
    assert.is_true(fds > 3 and children >= 1, fds .. " fds, " .. children .. " children")
  end)

  it("a client killed takes its command with it; the sandbox serves the next exec", function()
    local marker = "7" .. tostring(core_pid()) .. ".5" -- sleep's argument, found in /proc
    local out = h.sh([[
      f=$(mktemp); "$1" exec "$2" -- sh -c "echo ready; exec sleep $3" >"$f" & pid=$!
      while ! grep -q ready "$f"; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
      rm -f "$f"
      found_sleep() { pgrep -x -f "sleep $3" >/dev/null; }
      found_sleep "$@" && echo running
      kill -KILL $pid; wait $pid 2>/dev/null
      i=0; while found_sleep "$@" && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done
      found_sleep "$@" && echo still-there || echo gone]], h.host, ID, marker)
    assert.truthy(out:find("running\n", 1, true), out) -- control: the scan finds it while the client lives
    assert.truthy(out:find("gone\n", 1, true), out)
    local again, status = exec("--", "sh", "-c", "echo alive")
    assert.are.equal(0, status, again)
    assert.are.equal("alive\n", again)
  end)
end)

-- Each a sandbox of its own: the test kills its keeper.
describe("corral exec whose keeper is killed", function()
  local function create(ID)
    local out, status = h.corral("create", ID)
    assert.are.equal(0, status, out)
    local keeper
    for _, s in ipairs(require("dkjson").decode((h.capture({ h.host, "ls", "--json" }))) or {}) do
      if s.id == ID then keeper = s.pid end
    end
    if not keeper then h.corral("rm", ID) end
    assert.truthy(keeper, "no keeper listed for " .. ID)
    return keeper
  end

  it("before it starts the command: exits 120 and says so (docs/sessions.md)", function()
    local ID = "exec-spec-s-" .. core_pid()
    local keeper = create(ID)
    -- stopped, the keeper accepts nothing; the connect completes in the kernel's backlog
    local out = h.sh([[
      kill -STOP $3; f=$(mktemp); "$1" exec "$2" -- sh -c 'echo ran' >"$f" 2>&1 & pid=$!
      sleep 0.3; kill -0 $pid && echo waiting; kill -KILL $3; wait $pid; echo "status=$?"; cat "$f"; rm -f "$f"]],
      h.host, ID, keeper)
    assert.truthy(out:find("^waiting\n"), out) -- control: the client was waiting on the keeper
    assert.truthy(out:find("status=120\n", 1, true), out)
    assert.truthy(out:find("corral exec: the keeper of " .. ID .. " closed the connection without an answer", 1, true),
      out)
    assert.is_nil(out:find("ran", 1, true), out)
    h.corral("ls") -- sweeps what the killed keeper left on disk
  end)

  it("while it sends the request: exits 120 and says so, never 1 (found by the soak)", function()
    local ID = "exec-spec-q-" .. core_pid()
    local keeper = create(ID)
    -- strace holds the client's send for 0.8 s after its connect: the stopped keeper is
    -- killed meanwhile, so the send fails rather than the wait for an answer
    local out = h.sh([[
      kill -STOP $3; f=$(mktemp)
      strace -o /dev/null -e trace=sendmsg -e inject=sendmsg:delay_enter=800000 \
        "$1" exec "$2" -- sh -c 'echo ran' >"$f" 2>&1 & pid=$!
      sleep 0.4; kill -0 $pid && echo waiting; kill -KILL $3; wait $pid; echo "status=$?"; cat "$f"; rm -f "$f"]],
      h.host, ID, keeper)
    assert.truthy(out:find("^waiting\n"), out) -- control: the client was held in its send
    assert.truthy(out:find("status=120\n", 1, true), out)
    assert.truthy(out:find("corral exec: the keeper of " .. ID .. " closed the connection before it took the request",
      1, true), out)
    assert.is_nil(out:find("ran", 1, true), out)
    h.corral("ls") -- sweeps what the killed keeper left on disk
  end)

  it("a signal before a stuck keeper starts the command ends the exec with that signal's status; " ..
    "the command never runs (found by an adversarial pass)", function()
    local ID = "exec-spec-g-" .. core_pid()
    local keeper = create(ID)
    local out = h.sh([[
      kill -STOP $3; f=$(mktemp)
      "$1" exec "$2" -- sh -c 'sleep 0.3; touch /tmp/ran' >"$f" 2>&1 & pid=$!
      sleep 0.3; kill -0 $pid && echo waiting; kill -INT $pid
      i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
      kill -0 $pid 2>/dev/null && echo hung; kill -CONT $3; wait $pid; echo "status=$?"; cat "$f"; rm -f "$f"]],
      h.host, ID, keeper)
    assert.truthy(out:find("^waiting\n"), out) -- control: the client was waiting on the keeper
    assert.is_nil(out:find("hung", 1, true), out)
    assert.truthy(out:find("status=130\n", 1, true), out)
    assert.truthy(out:find("corral exec: signal 2 arrived before the keeper of " .. ID .. " started the command", 1,
      true), out)
    -- the keeper, continued, serves the next exec (control) and never ran the abandoned one
    os.execute("sleep 0.8")
    local check, status = h.corral("exec", ID, "--", "sh", "-c", "test -e /tmp/ran && echo ran || echo not-ran")
    assert.are.equal(0, status, check)
    assert.are.equal("not-ran\n", check)
    h.corral("rm", ID)
  end)

  it("under the command: exits 137, the command having died with its sandbox, and says why", function()
    local ID = "exec-spec-k-" .. core_pid()
    local keeper = create(ID)
    local out, status
    out = h.sh([[
      f=$(mktemp); "$1" exec "$2" -- sh -c 'echo ready; exec sleep 30' >"$f" 2>&1 & pid=$!
      while ! grep -q ready "$f"; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
      cat "$f"; kill -KILL $3; wait $pid; echo "status=$?"; cat "$f"; rm -f "$f"]], h.host, ID, keeper)
    -- control: the command was running when the keeper was killed
    assert.truthy(out:find("^ready\n"), out)
    assert.truthy(out:find("status=137\n", 1, true), out)
    assert.truthy(out:find("corral exec: the keeper of " .. ID .. " went away before the command ended", 1, true), out)
    -- the sandbox is gone with it
    out, status = h.corral("exec", ID, "--", "true")
    assert.are.equal(2, status, out)
  end)
end)
