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
    local out, status = h.corral("create", ID)
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
    local out = pty.run("script -qec " .. h.quote(inner) .. " /dev/null </dev/null")
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
