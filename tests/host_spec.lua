-- The `corral` host executable: lua.c's command line, the preloaded core, exe-relative
-- module paths, the exec-confined fast path, subcommands, and the REPL driven through a
-- real pseudo-terminal (util-linux `script`). Run `make` first.

local h = require "helpers"
local pty = require "pty"

local cwd = io.popen("pwd"):read("l")
local HOST = h.host
local Q = h.quote(HOST)
local CLEAN = pty.CLEAN
-- For tests about commands rather than path discovery: the repository's modules.
local WITH_LUA = "LUA_PATH=" .. h.quote(cwd .. "/lua/?.lua;" .. cwd .. "/lua/?/init.lua;;") .. " "

local run = pty.run

-- The shell command that copies corral into dir as it is installed: the front as
-- dir/corral and, where it is a program of its own, the host beside it.
local function copy_corral(dir)
  local line = "cp " .. Q .. " " .. h.quote(dir .. "/corral")
  if h.host_program == HOST then return line end
  return line .. " && cp " .. h.quote(h.host_program) .. " " .. h.quote(dir .. "/corral-host")
end

local function tempdir()
  local d = h.tmpdir("host")
  h.defer(finally, function() h.rmrf(d) end) -- a test may make several
  return d
end

-- A fresh directory holding module `name` (its source given), and the environment
-- prefix that puts it on LUA_PATH.
local function module_env(name, source)
  local d = tempdir()
  h.write(d .. "/" .. name .. ".lua", source)
  return CLEAN .. "LUA_PATH=" .. h.quote(d .. "/?.lua;;") .. " "
end

local repl, line_at, has_readline = pty.repl, pty.line_at, pty.has_readline

describe("corral host: lua.c command line", function()
  it("runs several -e statements in order", function()
    local out, err, code = run(CLEAN .. Q
      .. [[ -e 'io.write("a")' -e 'x = 1' -e 'io.write("b", x)' -e 'x = x * 10' -e 'print(x)']])
    assert.are.equal(0, code)
    assert.are.equal("ab110\n", out)
    assert.are.equal("", err)
  end)

  it("-v prints the corral and Lua versions and exits", function()
    local out, _, code = run(CLEAN .. Q .. " -v")
    assert.are.equal(0, code)
    assert.matches("^corral %d+%.%d+ %(Lua 5%.4%.%d+%)\n$", out)
  end)

  it("rejects unknown options and options missing their argument", function()
    local out, _, code = run(CLEAN .. Q .. " -e 'print(\"ok\")'")
    assert.are.equal(0, code)
    assert.are.equal("ok\n", out)
    local _, err
    _, err, code = run(CLEAN .. Q .. " -x")
    assert.are.equal(2, code)
    assert.matches("unrecognized option '%-x'\n", err)
    _, err, code = run(CLEAN .. Q .. " -e")
    assert.are.equal(2, code)
    assert.matches("'%-e' needs argument", err)
  end)

  it("a mistyped long option is a usage error naming the closest one, as a mistyped command", function()
    local out, err, code = run(CLEAN .. Q .. " --verison")
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches("^corral: unrecognized option '%-%-verison'; did you mean '%-%-version'%?\n", err)
    local _
    _, err, code = run(CLEAN .. Q .. " --hepl")
    assert.are.equal(2, code)
    assert.matches("did you mean '%-%-help'%?", err)
    -- control: what is no slip of a known one gets no guess, and the right spelling answers
    _, err, code = run(CLEAN .. Q .. " --frobnicate")
    assert.are.equal(2, code)
    assert.is_nil(err:find("did you mean", 1, true), err)
    out, _, code = run(CLEAN .. Q .. " --version")
    assert.are.equal(0, code)
    assert.matches("^corral %d", out)
  end)

  it("-l requires a module into a global, -l g=mod into g", function()
    local env = module_env("hostmod", "return { v = 42 }\n")
    -- control: without -l the global does not exist
    local out, _, code = run(env .. Q .. " -e 'print(hostmod)'")
    assert.are.equal(0, code)
    assert.are.equal("nil\n", out)
    out, _, code = run(env .. Q .. " -l hostmod -e 'print(hostmod.v)'")
    assert.are.equal(0, code)
    assert.are.equal("42\n", out)
    out, _, code = run(env .. Q .. " -l m=hostmod -e 'print(m.v, hostmod)'")
    assert.are.equal(0, code)
    assert.are.equal("42\tnil\n", out)
    local err
    out, err, code = run(env .. Q .. " -l no_such_module_here -e 'print(1)'")
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("module 'no_such_module_here' not found", err)
  end)

  it("builds the arg table and passes the script arguments as ...", function()
    local d = tempdir()
    local script = d .. "/args.lua"
    h.write(script, 'print(#arg, arg[-3] == os.getenv("HOST_UNDER_TEST"), arg[-2], arg[-1],'
      .. ' arg[0], arg[1], arg[2], select("#", ...), ...)\n')
    local out, _, code = run(CLEAN .. "HOST_UNDER_TEST=" .. Q .. " " .. Q
      .. " -e 'x=1' " .. h.quote(script) .. " one two")
    assert.are.equal(0, code)
    assert.are.equal(table.concat({ "2", "true", "-e", "x=1", script, "one", "two", "2",
      "one", "two" }, "\t") .. "\n", out)
    -- no script: the program is arg[0] and the options follow it
    out, _, code = run(CLEAN .. "H=" .. Q .. " " .. Q
      .. [[ -e 'print(arg[0] == os.getenv("H"), arg[1], arg[-1])']])
    assert.are.equal(0, code)
    assert.are.equal("true\t-e\tnil\n", out)
  end)

  it("runs a script from a file, from stdin with -, and stdin when not a terminal", function()
    local d = tempdir()
    h.write(d .. "/s.lua", 'print("from file", ...)\n')
    local out, _, code = run(CLEAN .. Q .. " " .. h.quote(d .. "/s.lua") .. " p")
    assert.are.equal(0, code)
    assert.are.equal("from file\tp\n", out)
    out, _, code = run("printf 'print(\"from stdin\", arg[0], ...)' | " .. CLEAN .. Q .. " - p q")
    assert.are.equal(0, code)
    assert.are.equal("from stdin\t-\tp\tq\n", out)
    out, _, code = run("printf 'print(6 * 7)' | " .. CLEAN .. Q)
    assert.are.equal(0, code)
    assert.are.equal("42\n", out)
  end)

  it("reports an error with a traceback on stderr and exits 1", function()
    local out, err, code = run(CLEAN .. Q .. " -e 'print(\"fine\")'")
    assert.are.equal(0, code)
    assert.are.equal("fine\n", out)
    assert.are.equal("", err)
    local d = tempdir()
    h.write(d .. "/e.lua", 'local function inner() error("deep") end\ninner()\n')
    out, err, code = run(CLEAN .. Q .. " " .. h.quote(d .. "/e.lua"))
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("^corral: [^\n]*e%.lua:1: deep\n", err)
    assert.truthy(err:find("stack traceback:", 1, true))
    assert.truthy(err:find("inner", 1, true))
    out, err, code = run(CLEAN .. Q .. " -e 'error(\"boom\")'")
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("^corral: %(command line%):1: boom\nstack traceback:", err)
  end)

  it("os.exit sets the exit status and stops at once", function()
    local out, _, code = run(CLEAN .. Q .. " -e 'os.exit(3)' -e 'print(\"after\")'")
    assert.are.equal(3, code)
    assert.are.equal("", out)
    _, _, code = run(CLEAN .. Q .. " -e 'os.exit(true)'")
    assert.are.equal(0, code)
    _, _, code = run(CLEAN .. Q .. " -e 'os.exit(false)'")
    assert.are.equal(1, code)
  end)

  it("runs every finalizer at its end, the last made first, and exits with its own status", function()
    local fin = "setmetatable({}, {__gc = function() io.write(\"first \") end}); " ..
      "setmetatable({}, {__gc = function() io.write(\"second \") end}); io.write(\"body \")"
    local out, _, code = run(CLEAN .. Q .. " -e '" .. fin .. "'")
    assert.are.equal(0, code)
    assert.are.equal("body second first ", out)
    out, _, code = run(CLEAN .. Q .. " -e '" .. fin .. "' -e 'error(\"boom\")'")
    assert.are.equal(1, code)
    assert.are.equal("body second first ", out)
    -- os.exit(status, true) closes the state itself: the finalizers run, its status stands
    out, _, code = run(CLEAN .. Q .. " -e '" .. fin .. "' -e 'os.exit(5, true)'")
    assert.are.equal(5, code)
    assert.are.equal("body second first ", out)
  end)

  it("honours LUA_INIT_5_4 / LUA_INIT (and @file) and ignores them with -E", function()
    local d = tempdir()
    h.write(d .. "/init.lua", 'init_v = "from file"\n')
    local probe = " -e 'print(init_v)'"
    local out = run(CLEAN .. "LUA_INIT='init_v = \"plain\"' " .. Q .. probe)
    assert.are.equal("plain\n", out)
    out = run(CLEAN .. "LUA_INIT='init_v = \"plain\"' LUA_INIT_5_4='init_v = \"versioned\"' "
      .. Q .. probe)
    assert.are.equal("versioned\n", out)
    out = run(CLEAN .. "LUA_INIT=" .. h.quote("@" .. d .. "/init.lua") .. " " .. Q .. probe)
    assert.are.equal("from file\n", out)
    out = run(CLEAN .. "LUA_INIT='init_v = \"plain\"' " .. Q .. " -E" .. probe)
    assert.are.equal("nil\n", out)
    -- an init error stops before the -e statements
    local err, code
    out, err, code = run(CLEAN .. "LUA_INIT='error(\"init broke\")' " .. Q .. probe)
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.truthy(err:find("init broke", 1, true))
  end)

  it("a command a Ctrl-C interrupts before it takes SIGINT itself exits 130, as SIGINT's, never 1; " ..
    "a script keeps lua.c's 1; control: the same command uninterrupted", function()
    -- LUA_INIT busy for 1.5 s holds the command where the host's own Ctrl-C handler is armed
    local interrupt = [[
import os, signal, subprocess, sys, time
env = dict(os.environ, LUA_INIT="local t = os.clock() + 1.5 while os.clock() < t do end")
p = subprocess.Popen(sys.argv[2:], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
if sys.argv[1] == "interrupt":
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
out, err = p.communicate()
print("rc=%d" % p.returncode)
sys.stdout.write(out.decode() + err.decode())
]]
    local function attempt(how, ...)
      return h.capture({ "/usr/bin/python3", "-c", interrupt, how, HOST, ... })
    end
    local out = attempt("interrupt", "resolve", "sh")
    assert.truthy(out:find("^rc=130\n"), out)
    assert.truthy(out:find("interrupted!", 1, true), out)
    out = attempt("interrupt", "-e", "print('ran')")
    assert.truthy(out:find("^rc=1\n"), out)
    out = attempt("wait", "resolve", "sh")
    assert.truthy(out:find("^rc=0\n"), out)
  end)

  it("-E also ignores LUA_PATH", function()
    local env = module_env("hostmod2", "return 7\n")
    local out, _, code = run(env .. Q .. " -l hostmod2 -e 'print(hostmod2)'")
    assert.are.equal(0, code)
    assert.are.equal("7\n", out)
    _, _, code = run(env .. Q .. " -E -l hostmod2 -e 'print(hostmod2)'")
    assert.are.equal(1, code)
  end)

  it("-W turns warnings on", function()
    local _, err, code = run(CLEAN .. Q .. " -e 'warn(\"hello\")'")
    assert.are.equal(0, code)
    assert.are.equal("", err)
    _, err, code = run(CLEAN .. Q .. " -W -e 'warn(\"hello\")'")
    assert.are.equal(0, code)
    assert.truthy(err:find("Lua warning: hello", 1, true))
  end)
end)

describe("corral host: additions", function()
  it("preloads corral.core (no core.so on the cpath)", function()
    local empty = tempdir()
    local env = CLEAN .. "LUA_CPATH=" .. h.quote(empty .. "/?.so") .. " "
    -- control: a stock interpreter with the same cpath cannot load the core
    local _, _, code = run(env .. "lua5.4 -e 'require \"corral.core\"'")
    assert.is_not.equal(0, code)
    local out
    out, _, code = run(env .. Q .. " -e 'local c = require \"corral.core\"; print(type(c),"
      .. " c._VERSION ~= nil, (package.searchpath(\"corral.core\", package.cpath)))'")
    assert.are.equal(0, code)
    assert.are.equal("table\ttrue\tnil\n", out)
  end)

  it("loads a module's compiled twin only while it names its source and is as new as it", function()
    -- A tree of its own: the host at T/build/corral finds T/lua and T/build/luac.
    local t = tempdir()
    h.must("mkdir -p " .. h.quote(t .. "/build/luac") .. " " .. h.quote(t .. "/lua/corral") .. " " ..
      h.quote(t .. "/stage/corral") .. " && " .. copy_corral(t .. "/build"))
    local source = t .. "/lua/corral/twin_test.lua"
    h.write(source, "return 'source'")
    local which = CLEAN .. h.quote(t .. "/build/corral") .. " -e 'print(require \"corral.twin_test\")'"
    -- the twin of corral.twin_test, compiled from `text` and named after `nameroot`'s copy
    local function compile(text, nameroot)
      h.write(t .. "/stage/corral/twin_test.lua", text)
      h.must("lua5.4 scripts/compile-lua " .. h.quote(t .. "/build/luac") .. " " .. h.quote(t .. "/stage") .. " " ..
        h.quote(nameroot or (t .. "/lua")) .. " " .. h.quote(t .. "/stage/corral/twin_test.lua"))
    end
    -- an edited source (newer than its twin) wins; so does a source the twin does not name
    -- (a tree moved after its build); a twin that is not bytecode is passed by
    h.must("sleep 0.01")
    compile("return 'twin'")
    h.must("sleep 0.01; touch " .. h.quote(source))
    local edited = run(which)
    compile("return 'twin'", "/elsewhere/lua")
    local moved = run(which)
    h.write(t .. "/build/luac/corral.twin_test.luac", "#" .. source .. "\nreturn 'text, not bytecode'")
    local garbage = run(which)
    -- the control: a twin as new as its source and naming it is what loads
    compile("return 'twin'")
    local out, _, code = run(which)
    assert.are.equal("source\t" .. source .. "\n", edited)
    assert.are.equal("source\t" .. source .. "\n", moved)
    assert.are.equal("source\t" .. source .. "\n", garbage)
    assert.are.equal(0, code)
    assert.are.equal("twin\t" .. source .. "\n", out)
    -- a source the caller may not read is not stood in for by its twin, which would load
    if h.test_user_missing() then return end -- (run as root alone, every source is readable)
    h.must("chmod -R o+rX " .. h.quote(t) .. " && chmod 0600 " .. h.quote(source))
    local denied, _, dcode = run(CLEAN .. table.concat(h.as_test_user({ h.quote(t .. "/build/corral") }), " ") ..
      " -e 'print(pcall(require, \"corral.twin_test\"))' 2>&1")
    h.must("chmod 0644 " .. h.quote(source)) -- control, after: readable, the same twin loads for that user
    local allowed = run(CLEAN .. table.concat(h.as_test_user({ h.quote(t .. "/build/corral") }), " ") ..
      " -e 'print(require \"corral.twin_test\")'")
    assert.are.equal(0, dcode, denied)
    assert.matches("^false\t", denied)
    assert.are.equal("twin\t" .. source .. "\n", allowed)
  end)

  it("finds the installed twins with a luac program beside it (PREFIX=/usr: /usr/bin/luac)", function()
    local t = tempdir()
    local luadir, twins = t .. "/share/lua/5.4", t .. "/lib/lua/5.4/corral/luac"
    h.must("mkdir -p " .. h.quote(t .. "/bin") .. " " .. h.quote(luadir .. "/corral") .. " " .. h.quote(twins) ..
      " " .. h.quote(t .. "/stage/corral") .. " && " .. copy_corral(t .. "/bin"))
    local source = luadir .. "/corral/twin_test.lua"
    h.write(source, "return 'source'")
    h.must("sleep 0.01")
    h.write(t .. "/stage/corral/twin_test.lua", "return 'twin'")
    h.must("lua5.4 scripts/compile-lua " .. h.quote(twins) .. " " .. h.quote(t .. "/stage") .. " " ..
      h.quote(luadir) .. " " .. h.quote(t .. "/stage/corral/twin_test.lua"))
    local which = CLEAN .. h.quote(t .. "/bin/corral") .. " -e 'print(require \"corral.twin_test\")'"
    local alone = run(which)
    h.write(t .. "/bin/luac", "#!/bin/sh\n")
    local beside = run(which)
    assert.are.equal("twin\t" .. source .. "\n", alone)
    assert.are.equal("twin\t" .. source .. "\n", beside)
  end)

  it("records the resolved host program in the registry (the front hands over to it)", function()
    local real = io.popen("readlink -f " .. h.quote(h.host_program)):read("l")
    local out, _, code = run(CLEAN .. Q
      .. " -e 'print(debug.getregistry()[\"corral.host_executable\"])'")
    assert.are.equal(0, code)
    assert.are.equal(real .. "\n", out)
  end)

  it("finds lua/ beside its build directory when run from another directory", function()
    -- The layout is rebuilt around a copy so that any CORRAL_HOST (build/asan/corral too)
    -- is tested as build/corral with lua/ beside build/. Its lua/ also holds a module no
    -- installed tree has, so the control holds with corral installed under /usr/local too.
    local tree = tempdir()
    assert.is_true(os.execute("mkdir -p " .. h.quote(tree .. "/build") .. " "
      .. h.quote(tree .. "/lua") .. " && " .. copy_corral(tree .. "/build")
      .. " && ln -s " .. h.quote(cwd .. "/lua/corral") .. " " .. h.quote(tree .. "/lua/corral")))
    h.write(tree .. "/lua/host_spec_beside.lua", 'return "beside"\n')
    local env = "cd /tmp && " .. CLEAN .. "-u LUA_PATH -u LUA_PATH_5_4 "
    -- control: from /tmp a stock interpreter does not find the tree's own module
    local _, _, code = run(env .. "lua5.4 -e 'require \"host_spec_beside\"'")
    assert.is_not.equal(0, code)
    local out
    out, _, code = run(env .. h.quote(tree .. "/build/corral") .. " -e 'print((require \"host_spec_beside\"));"
      .. " print(package.searchpath(\"corral.cli\", package.path))'")
    assert.are.equal(0, code)
    -- the tree's own modules come first, before any installed corral
    assert.are.equal("beside\n" .. tree .. "/lua/corral/cli.lua\n", out)
  end)

  it("finds modules of an installed tree (PREFIX/bin -> PREFIX/share/lua/5.4)", function()
    local prefix = tempdir()
    assert.is_true(os.execute("mkdir -p " .. h.quote(prefix .. "/bin") .. " "
      .. h.quote(prefix .. "/share/lua/5.4") .. " && " .. copy_corral(prefix .. "/bin")))
    h.write(prefix .. "/share/lua/5.4/host_spec_marker.lua", 'return "installed"\n')
    local probe = " -e 'print((require \"host_spec_marker\"))'"
    -- control: the build-tree host does not see the installed tree
    local _, _, code = run(CLEAN .. Q .. probe)
    assert.is_not.equal(0, code)
    local out
    out, _, code = run("cd / && " .. CLEAN .. h.quote(prefix .. "/bin/corral") .. probe)
    assert.are.equal(0, code)
    assert.are.equal("installed\n", out)
    local real = io.popen("readlink -f " .. h.quote(prefix)):read("l")
    out, _, code = run("cd / && " .. CLEAN .. "P=" .. h.quote(real) .. " "
      .. h.quote(prefix .. "/bin/corral")
      .. " -e 'print((package.cpath:find(os.getenv(\"P\")..\"/lib/lua/5.4/?.so\", 1, true)))'")
    assert.are.equal(0, code)
    assert.are.equal("1\n", out)
  end)

  it("dispatches exec-confined before any Lua runs", function()
    local env = CLEAN .. "LUA_INIT='io.stderr:write(\"LUA_RAN\\n\")' "
    -- control: LUA_INIT shows whenever a Lua state runs
    local _, err, code = run(env .. Q .. " -e ''")
    assert.are.equal(0, code)
    assert.truthy(err:find("LUA_RAN", 1, true))
    local out
    out, err, code = run(env .. Q .. " exec-confined")
    assert.is_not.equal(0, code)
    assert.is_nil(out:find("LUA_RAN", 1, true))
    assert.is_nil(err:find("LUA_RAN", 1, true))
  end)

  it("runs a subcommand through corral.cli, and ./name as a script", function()
    local d = tempdir()
    h.write(d .. "/help", 'print("script named help")\n')
    local out, _, code = run("cd " .. h.quote(d) .. " && " .. CLEAN .. WITH_LUA .. Q .. " ./help")
    assert.are.equal(0, code)
    assert.are.equal("script named help\n", out)
    out, _, code = run("cd " .. h.quote(d) .. " && " .. CLEAN .. WITH_LUA .. Q .. " help")
    assert.are.equal(0, code)
    assert.truthy(#out > 0)
    assert.is_nil(out:find("script named help", 1, true))
  end)

  it("--version and --help (or -h) alone answer and exit 0; beside other words they stay lua.c's errors", function()
    local out, err, code = run(CLEAN .. WITH_LUA .. Q .. " --version")
    assert.are.equal(0, code, err)
    assert.matches("^corral %d+%.%d+ %(Lua 5%.4%.%d+%)\n$", out)
    for _, flag in ipairs({ "--help", "-h" }) do
      out, err, code = run(CLEAN .. WITH_LUA .. Q .. " " .. flag)
      assert.are.equal(0, code, err)
      assert.matches("\n  run +run a tenant command", out)
      assert.are.equal("", err)
    end
    -- control: not alone, they are options lua.c does not know
    out, err, code = run(CLEAN .. WITH_LUA .. Q .. " --version -e 'print(1)'")
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches("unrecognized option '%-%-version'", err)
  end)

  it("an unknown command is an error naming the closest one; a file of that name is a script", function()
    local d = tempdir()
    local here = "cd " .. h.quote(d) .. " && " .. CLEAN .. WITH_LUA .. Q
    local out, err, code = run(here .. " rnu")
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.are.equal("corral: unknown command 'rnu'; did you mean 'run'?\n", err)
    out, err, code = run(here .. " xyzzy")
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.are.equal("corral: unknown command 'xyzzy'; `corral help` lists the commands\n", err)
    -- a name meant as a script keeps lua.c's error
    out, err, code = run(here .. " missing.lua")
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("cannot open missing%.lua", err)
    -- control: once a file named rnu exists, it is run as the script it is
    h.write(d .. "/rnu", 'print("script rnu", ...)\n')
    out, err, code = run(here .. " rnu a")
    assert.are.equal(0, code, err)
    assert.are.equal("script rnu\ta\n", out)
  end)

  it("passes every argv string to cli.main and exits with its result", function()
    -- LUA_INIT runs before the command, so it can stand in for cli.main.
    local fake = 'package.loaded["corral.cli"] = { main = function(a) '
      .. 'print(table.concat(a, ","), arg[1], #arg) return _G.RESULT end }'
    local function cmd(result)
      return run(CLEAN .. WITH_LUA .. "LUA_INIT=" .. h.quote("RESULT = " .. result .. "; " .. fake) .. " "
        .. Q .. " help x y")
    end
    local out, _, code = cmd("7")
    assert.are.equal(7, code)
    assert.are.equal("help,x,y\thelp\t3\n", out)
    _, _, code = cmd("false")
    assert.are.equal(1, code)
    _, _, code = cmd("nil")
    assert.are.equal(0, code)
  end)
end)

describe("corral host: REPL on a terminal", function()
  it("opens with no arguments, prints expression values and has core loaded", function()
    local out, code = repl("", {
      "20+22\n",
      "print(type(core), type(no_such_global))\n",
      "_PROMPT = 'hp> '\n",
      "print(1)\n",
      "os.exit(0)\n",
    })
    assert.are.equal(0, code)
    assert.truthy(out:find("corral %d+%.%d+ — Lua 5%.4; `corral` and `core` are loaded"))
    assert.truthy(line_at(out, "42"))
    assert.truthy(line_at(out, "table\tnil"))
    assert.truthy(out:find("hp> ", 1, true))
    assert.truthy(line_at(out, "1"))
  end)

  it("continues an incomplete chunk across lines", function()
    local out, code = repl("-i", {
      "function f(x)\n",
      "  return x * 3\n",
      "end\n",
      "print(f(14))\n",
      "os.exit(0)\n",
    })
    assert.are.equal(0, code)
    assert.truthy(out:find("corral>> ", 1, true)) -- control: it did ask for more
    assert.truthy(line_at(out, "42"))
    assert.is_nil(out:find("<eof>", 1, true))
  end)

  it("prints an error with a traceback and evaluates the next line", function()
    local out, code = repl("-i", {
      'error("bo".."om")\n',
      "print(6*7)\n",
      "os.exit(0)\n",
    })
    assert.are.equal(0, code)
    local err_at = out:find("stdin:1: boom\nstack traceback:", 1, true)
    assert.truthy(err_at)
    local next_at = line_at(out, "42")
    assert.truthy(next_at)
    assert.truthy(next_at > err_at)
  end)

  it("Ctrl-C interrupts a running chunk and the REPL goes on", function()
    local out, code = repl("-i", {
      "while true do end\n",
      0.8,
      "\3",
      0.3,
      'print("al".."ive")\n',
      "os.exit(0)\n",
    })
    assert.are.equal(0, code)
    local int_at = out:find("interrupted!", 1, true)
    assert.truthy(int_at) -- control: the loop was running when Ctrl-C came
    local alive_at = line_at(out, "alive")
    assert.truthy(alive_at)
    assert.truthy(alive_at > int_at)
  end)

  it("Ctrl-C at the prompt discards the pending input", function()
    local out, code = repl("-i", {
      "print(1\n",
      0.8,
      "\3",
      0.3,
      "print(5*5)\n",
      "os.exit(0)\n",
    })
    assert.are.equal(0, code)
    assert.truthy(out:find("corral>> ", 1, true)) -- control: "print(1" was pending
    assert.truthy(line_at(out, "25"))
    assert.is_nil(out:find("expected", 1, true))
  end)

  it("keeps history in $HOME/.corral_history unless CORRAL_HISTORY is empty", function()
    if not has_readline() then
      pending("host built without readline: no history")
      return
    end
    local home = tempdir()
    local _, code = repl("-i", { "hist_probe = 1\n", "os.exit(0)\n" },
      "-u CORRAL_HISTORY HOME=" .. h.quote(home))
    assert.are.equal(0, code)
    assert.truthy((h.read(home .. "/.corral_history") or ""):find("hist_probe = 1", 1, true))
    local home2 = tempdir()
    _, code = repl("-i", { "hist_probe = 2\n", "os.exit(0)\n" },
      "HOME=" .. h.quote(home2) .. " CORRAL_HISTORY=")
    assert.are.equal(0, code)
    assert.is_nil(h.read(home2 .. "/.corral_history"))
    local file = home2 .. "/elsewhere"
    _, code = repl("-i", { "hist_probe = 3\n", "os.exit(0)\n" },
      "HOME=" .. h.quote(home2) .. " CORRAL_HISTORY=" .. h.quote(file))
    assert.are.equal(0, code)
    assert.truthy((h.read(file) or ""):find("hist_probe = 3", 1, true))
    assert.is_nil(h.read(home2 .. "/.corral_history"))
  end)
end)
