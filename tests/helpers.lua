-- Shared test helpers: temporary trees, running commands, reading results.
-- Everything here runs real processes; nothing mocks the kernel.
local core = require "corral.core"
local shell = require "corral.shell"
local assert = require "luassert" -- busted's assert: this module is not loaded as a spec

local M = {}

M.host = os.getenv("CORRAL_HOST") or (os.getenv("PWD") .. "/build/corral")
-- The host program, which the front (`corral`, core/front) hands every command line it
-- does not serve to: `corral-host` beside it. A copy of it alone is a whole corral.
M.host_program = M.host:gsub("[^/]*$", "") .. "corral-host"
if not os.execute("test -x " .. shell.quote(M.host_program)) then M.host_program = M.host end
-- The wrapper program a `corral confine` spec names: built beside the host
-- (core/wrapper), else the host's own `exec-confined` (an asan build has only the host).
M.wrapper = M.host:gsub("[^/]*$", "") .. "corral-exec-confined"
if not os.execute("test -x " .. shell.quote(M.wrapper)) then M.wrapper = M.host end

--- A fresh private directory, resolved (so it compares equal to what corral resolves).
function M.tmpdir(tag)
  local d = assert(core.fs.mkdtemp("/tmp/corral-test-" .. (tag or "") .. "-"))
  return assert(core.path.resolve(d))
end

function M.rmrf(path)
  if path and path:match("^/tmp/corral%-") then os.execute("rm -rf " .. shell.quote(path)) end
end

function M.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

function M.read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function M.sh(script, ...)
  local out, status = shell.capture({ "sh", "-c", script, "sh", ... })
  return out, status
end

--- Quotes one word for /bin/sh.
M.quote = shell.quote

--- Runs a shell command and asserts that it succeeded.
function M.must(cmd)
  assert(os.execute(cmd), cmd)
end

--- The script of a denial test: `attempt` first, then `control`, in one shell. The
-- attempt runs in this shell itself (a group, not a subshell), so an attempt that kills
-- the sandbox also kills the control: a sandbox that dies instead of refusing never
-- prints the control's marker. Its status follows it as a line "attempt-rc=N".
function M.attempt_then_control(attempt, control)
  return "{ " .. attempt .. "\n} 2>&1; echo attempt-rc=$?; " .. control
end

--- Reads the output of an attempt_then_control script, asserting that the attempt
-- ended by itself and that `marker` (a Lua pattern) comes after it, from the control.
-- Returns the attempt's status, the control's output and the attempt's output.
function M.after_attempt(out, marker)
  local at, stop, rc = out:find("attempt%-rc=(%d+)\n")
  assert.truthy(at, "the attempt ended the script: " .. out)
  local control = out:sub(stop + 1)
  assert.truthy(control:find(marker), "no " .. marker .. " after the attempt: " .. out)
  return tonumber(rc), control, out:sub(1, at - 1)
end

--- Asserts that `rc` is a refusal: a failure the command reported itself, not a
-- success and not a death by signal (a filter that kills instead of refusing).
function M.assert_refused(rc, out)
  assert.truthy(rc > 0 and rc < 128, "attempt status " .. tostring(rc) .. ": " .. tostring(out))
end

--- Whether each of `list` is found in `text`, each after the one before (Lua patterns,
-- or plain strings when `plain`). Returns true, or false and the first one missing.
function M.in_order(text, list, plain)
  local at = 1
  for _, n in ipairs(list) do
    local _, e = text:find(n, at, plain)
    if not e then return false, n end
    at = e + 1
  end
  return true
end

--- Runs a launch spec as a caller would: working directory spec.cd, environment
-- exactly spec.env, program spec.cmd with spec.args. `redirect` is appended to the
-- shell line (e.g. "3</some/dir"). Returns output (stdout+stderr) and exit status.
function M.run_spec(spec, redirect)
  local env = { "env", "-i" }
  for _, pair in ipairs(spec.env) do env[#env + 1] = pair[1] .. "=" .. pair[2] end
  local argv = { spec.cmd }
  for _, a in ipairs(spec.args) do argv[#argv + 1] = a end
  local line = "cd " .. shell.quote(spec.cd) .. " && " .. shell.join(env) .. " " ..
    shell.join(argv) .. " " .. (redirect or "") .. " 2>&1"
  local p = assert(io.popen(line, "r"))
  local out = p:read("a")
  local _, how, code = p:close()
  if how == "signal" then code = 128 + code end
  return out, code
end

--- Runs argv (a list) and returns output and status.
M.capture = shell.capture

--- A copy of corral under `root`/inst, laid out as make install lays it (the front, the
-- host beside it, the wrapper, its Lua modules): a host with a probe cache file of its
-- own, which no other test rewrites.
-- @treturn string the copy's `corral`
-- @treturn string its probe cache file
function M.private_host(root)
  M.sh([[set -e; mkdir -p "$1/inst/bin"; cp "$2" "$1/inst/bin/corral"; ln -s "$3" "$1/inst/lua"
    if [ "$4" != "$2" ]; then cp "$4" "$1/inst/bin/"; fi
    if [ "$5" != "$2" ]; then cp "$5" "$1/inst/bin/corral-host"; fi]],
    root, M.host, core.path.resolve("lua"), M.wrapper, M.host_program)
  local host = root .. "/inst/bin/corral"
  return host, shell.capture({ host, "-e", "io.write(require('corral.probe_cache').path())" })
end

--- Runs the corral host with the given arguments.
function M.corral(...)
  return shell.capture({ M.host, ... })
end

M.PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

--- The uid (and gid) the unprivileged runs of root's tests use (CORRAL_TEST_UID, else
-- nobody's): a caller without any capability over the host's namespaces.
M.TEST_UID = math.tointeger(tonumber(os.getenv("CORRAL_TEST_UID") or "65534"))

--- argv prefixed to run as TEST_UID, no supplementary groups, the environment kept.
function M.as_test_user(argv)
  local out = { "setpriv", "--reuid", tostring(M.TEST_UID), "--regid", tostring(M.TEST_UID), "--clear-groups" }
  for _, a in ipairs(argv) do out[#out + 1] = a end
  return out
end

--- Whether the tests can run as TEST_UID here: nil when they can; else what is missing
-- and whether it is this machine's kernel ("kernel": user namespaces refused to an
-- unprivileged caller, a real limit of the machine) or the set-up ("setup": the build
-- tree unreadable to that uid, which a test must report, not skip).
function M.test_user_missing()
  local out, status = M.capture(M.as_test_user({ "sh", "-c", "test -r " .. M.quote(M.host) .. " && test -x " ..
    M.quote(M.host) .. " && test -r " .. M.quote(os.getenv("PWD") .. "/lua/corral/init.lua") .. " && echo readable" }))
  if status ~= 0 or not out:find("readable", 1, true) then
    return "uid " .. M.TEST_UID .. " cannot read the build tree at " .. os.getenv("PWD") .. " (every directory on the "
      .. "way needs o+x, the files o+r)", "setup"
  end
  out, status = M.capture(M.as_test_user({ "unshare", "--user", "--map-root-user", "--net", "true" }))
  if status ~= 0 then return "uid " .. M.TEST_UID .. " cannot make a user namespace: " .. out, "kernel" end
end

--- A TCP port on 127.0.0.1 that nothing listens on now (read from /proc/net/tcp).
function M.free_port()
  local used = {}
  for _, f in ipairs({ "/proc/net/tcp", "/proc/net/tcp6" }) do
    for port in (M.read(f) or ""):gmatch(":(%x%x%x%x) %x+:%x+ 0A") do used[tonumber(port, 16)] = true end
  end
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
  for _ = 1, 100 do
    local p = math.random(20000, 60000)
    if not used[p] then return p end
  end
  error("no free port found")
end

--- This process's pid (read from /proc/self by this process itself).
function M.own_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = math.tointeger(tonumber(f:read("l"):match("^(%d+)")))
  f:close()
  return pid
end

--- Starts `sh -c script` with stderr on the pipe too and, when the script names $F, $F
-- (exported) a fresh fifo it may read to wait for release(), which removes it. Returns
-- the pipe, the shell's pid and the fifo (nil when the script names none: nothing to
-- leave in /tmp).
function M.child(script)
  local f, env = nil, ""
  if script:find("$F", 1, true) then
    f = os.tmpname()
    os.remove(f)
    assert(os.execute("mkfifo -m 600 " .. f))
    env = "F=" .. f .. "; export F; "
  end
  local p = assert(io.popen("exec 2>&1; " .. env .. "echo $$; " .. script))
  return p, math.tointeger(tonumber(p:read("l"))), f
end

--- Lets a child() past its `read _ < $F`, and removes the fifo.
function M.release(f)
  local w = assert(io.open(f, "w"))
  w:write("go\n")
  w:close()
  os.remove(f)
end

-- Clean-ups of the running test, run when it ends (see M.defer).
local deferred = {}
local function run_deferred()
  local list, first = deferred, nil
  deferred = {}
  for i = #list, 1, -1 do
    local ok, err = pcall(list[i])
    if not ok and not first then first = err end
  end
  if first then error(first, 0) end
end

--- Runs fn when the running test ends, after the clean-ups deferred later. busted keeps
-- only the last function a test hands to `finally`, so a test whose helpers each call
-- it loses all but one: every clean-up goes through here instead. `finally` is the
-- spec's own (a module does not see the spec's environment).
function M.defer(finally, fn)
  deferred[#deferred + 1] = fn
  finally(run_deferred)
end

--- Removes the probe cache file another corral executable (a copy, an install) keeps:
-- each keeps its own (corral.probe_cache), which a test that ran one must not leave.
function M.forget_probe_cache(host)
  local out = M.capture({ host, "-e", "print(require('corral.probe_cache').path())" })
  local path = out:match("^(/%S+/probes%-%x+)\n")
  if path then os.remove(path) end
end

--- Waits until cond() is true, for at most `seconds`.
function M.wait_for(cond, seconds)
  local deadline = os.time() + (seconds or 5)
  while os.time() <= deadline do
    if cond() then return true end
    core.io.poll({}, 0.02) -- a pause without a process of its own (two per poll, with sh)
  end
  return cond()
end

return M
