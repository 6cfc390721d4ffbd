-- The `corral` subcommands, run as a user would: the real executable, real processes.
local h = require "helpers"
local json = require "dkjson"

describe("corral CLI", function()
  local root, box, sib
  setup(function()
    root = h.tmpdir("cli")
    box, sib = root .. "/box", root .. "/sibling"
    assert(os.execute("mkdir " .. box .. " " .. sib .. " && echo cli-secret > " .. sib .. "/s"))
  end)
  teardown(function() h.rmrf(root) end)

  it("help lists every command and explains one", function()
    local out, status = h.corral("help")
    assert.are.equal(0, status)
    for _, c in ipairs({ "confine", "sbpl", "resolve", "probe", "run" }) do assert.matches(c, out) end
    out, status = h.corral("help", "confine")
    assert.are.equal(0, status)
    assert.matches("%-%-permit DIR", out)
    out, status = h.corral("help", "nonsense")
    assert.are.equal(2, status)
    assert.matches("COMMAND", out)
  end)

  it("--version, --help, and COMMAND --help or -h print and exit 0; after -- they are CMD's", function()
    local out, status = h.corral("--version")
    assert.are.equal(0, status, out)
    assert.matches("^corral 0%.1 %(Lua 5%.4", out)
    out, status = h.corral("--help")
    assert.are.equal(0, status, out)
    for _, c in ipairs({ "confine", "resolve", "probe", "run", "step", "conformance" }) do
      assert.matches("\n  " .. c .. " ", out)
    end
    for _, flag in ipairs({ "--help", "-h" }) do
      out, status = h.corral("run", flag)
      assert.are.equal(0, status, out)
      assert.matches("^corral run %[OPTIONS%] %-%- CMD ARGS", out)
      assert.matches("\n  %-%-memory SIZE +memory cap", out)
      out, status = h.corral("confine", "--permit", "/tmp", flag)
      assert.are.equal(0, status, out)
      assert.matches("\n  %-%-permit DIR +the one directory", out)
    end
    out, status = h.corral("step", "--help")
    assert.are.equal(0, status, out)
    assert.matches("^corral step", out)
    assert.matches("`corral help mechanisms`", h.corral("--help")) -- the topic is listed
    -- the C wrapper's usage is the help's; control: without it, its own refusal, exit 125
    for _, flag in ipairs({ "--help", "-h" }) do
      out, status = h.corral("exec-confined", flag)
      assert.are.equal(0, status, out)
      assert.matches("^corral exec%-confined %-%-permit DIR", out)
    end
    out, status = h.corral("exec-confined", "--permit")
    assert.are.equal(125, status, out)
    assert.matches("%-%-permit needs a value", out)
    -- control: after --, --help belongs to the command, which runs
    out, status = h.corral("run", "--", "sh", "-c", 'echo "got $1"', "sh", "--help")
    assert.are.equal(0, status, out)
    assert.matches("got %-%-help", out)
    -- and an option nobody knows is still refused
    out, status = h.corral("run", "--helpme", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-%-helpme: unknown option", out)
    -- a short dash word before the command is an unknown option too, never a command
    -- named -x; probe takes no operand; controls: a command's own dash words are its own
    out, status = h.corral("run", "-x", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-x: unknown option", out)
    out, status = h.corral("probe", "extra")
    assert.are.equal(2, status, out)
    assert.matches("extra: corral probe takes no operand", out)
    out, status = h.corral("run", "ls", "-d", "/")
    assert.are.equal(0, status, out)
    assert.are.equal("/\n", out)
  end)

  it("an unknown option near a real one suggests it, in every subcommand, as a command does", function()
    for _, c in ipairs({
      { { "run", "--memroy", "1G", "--", "true" }, "%-%-memroy: unknown option; did you mean '%-%-memory'%?" },
      { { "confine", "--permti", "/tmp", "--", "true" }, "%-%-permti: unknown option; did you mean '%-%-permit'%?" },
      { { "probe", "--jsno" }, "%-%-jsno: unknown option; did you mean '%-%-json'%?" },
    }) do
      local out, status = h.corral(table.unpack(c[1]))
      assert.are.equal(2, status, out)
      assert.matches(c[2], out)
    end
    -- control: an option near none is refused without a guess, and the suggested spelling runs
    local out, status = h.corral("run", "--zzzzzzzz", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-%-zzzzzzzz: unknown option\n", out)
    out, status = h.corral("run", "--memory", "64M", "--", "true")
    assert.are.equal(0, status, out)
  end)

  it("help run lists its options one per line, grouped, each with its meaning", function()
    local out, status = h.corral("help", "run")
    assert.are.equal(0, status, out)
    local groups = {
      ["Sandbox"] = { "mechanism", "engine", "id", "storage", "workspace" },
      ["Limits"] = { "memory", "pids", "cpu", "wall", "fsize", "nofile", "disk" },
      ["Environment"] = { "env", "secret", "secret-file", "ca-file" },
      ["Network and egress"] = { "allow", "allow-file", "upstream-proxy", "method",
                                 "internal", "resolve", "service-port", "link", "idle",
                                 "max-connections", "udp-idle", "max-udp-flows", "sni", "learn" },
      ["Output"] = { "log-json", "verbose", "receipt" },
    }
    for title, names in pairs(groups) do
      local block = out:match("\n" .. title:gsub("%p", "%%%0") .. ":\n(.-)\n\n")
      assert.truthy(block, title .. " missing:\n" .. out)
      for _, name in ipairs(names) do
        -- the option, its value's name, and a meaning on the same line or the next
        local line = block:match("  %-%-" .. name:gsub("%p", "%%%0") .. "[ \n][^\n]*\n?[^\n]*")
        assert.truthy(line, "--" .. name .. " not under " .. title .. ":\n" .. block)
        assert.matches("%S+%s%s+%a", line)
      end
    end
    -- every option run accepts is listed: one that parses but is not in the help fails here
    local listed = select(2, out:gsub("\n  %-%-[%w-]+", ""))
    assert.are.equal(33, listed)
    for cmd, option in pairs({ confine = "extra", sbpl = "permit", probe = "json" }) do
      out, status = h.corral("help", cmd)
      assert.are.equal(0, status, out)
      assert.matches("\n  %-%-" .. option .. "[ \n]", out)
    end
  end)

  it("confine prints a spec naming the wrapper, and --json the same as JSON", function()
    local out, status = h.corral("confine", "--permit", box, "--", "sh", "-c", "true")
    assert.are.equal(0, status, out)
    assert.matches("cmd:%s+" .. h.wrapper:gsub("%p", "%%%0"), out)
    assert.matches("layers: ns, landlock", out)
    assert.matches("values not shown", out)
    out, status = h.capture({ "env", "ANTHROPIC_API_KEY=sk-never-printed", h.host, "confine", "--json",
      "--permit", box, "--", "true" })
    assert.are.equal(0, status, out)
    assert.is_nil(out:find("sk-never-printed", 1, true))
    local spec = json.decode(out)
    assert.are.equal(h.wrapper, spec.cmd)
    assert.are.equal("exec-confined", spec.args[1])
    assert.are.equal(box, spec.cd)
    assert.truthy(#spec.env_names > 0)
  end)

  it("confine --exec runs it: the sibling is denied, then the control inside succeeds, env passes", function()
    local out, status = h.capture({ "env", "ANTHROPIC_API_KEY=sk-passes", h.host, "confine", "--exec",
      "--permit", box, "--", "sh", "-c", h.attempt_then_control('cat ' .. sib .. '/s',
      'echo in > f && cat f && printf "%s\\n" "$ANTHROPIC_API_KEY"') })
    local rc, control = h.after_attempt(out, "^in\nsk%-passes\n")
    assert.is_nil(out:find("cli-secret", 1, true))
    assert.are.equal(1, rc) -- cat's own status for the denied read
    assert.are.equal(0, status, control)
  end)

  it("confine --exec passes the command's exit status through", function()
    local _, status = h.corral("confine", "--exec", "--permit", box, "--", "sh", "-c", "exit 7")
    assert.are.equal(7, status)
  end)

  it("confine --exec names a missing command (127) and one it cannot execute (126)", function()
    local out, status = h.corral("confine", "--exec", "--permit", box, "--", "no-such-command-corral")
    assert.are.equal(127, status, out)
    assert.are.equal("corral confine: no-such-command-corral: command not found\n", out)
    h.write(box .. "/plain", "#!/bin/sh\necho never\n")
    out, status = h.corral("confine", "--exec", "--permit", box, "--", box .. "/plain")
    assert.are.equal(126, status, out)
    assert.matches("corral confine: [^\n]*/plain: Permission denied", out)
    os.execute("chmod +x " .. box .. "/plain")
    out, status = h.corral("confine", "--exec", "--permit", box, "--", box .. "/plain")
    os.remove(box .. "/plain")
    assert.are.equal(0, status, out) -- control: made executable, the same file runs
    assert.matches("never", out)
  end)

  local bad = {
    -- each error names the flag the user typed, never corral.confinement's field
    { { "confine", "--", "true" }, "%-%-permit: is required" },
    { { "confine", "--permit", "relative", "--", "true" }, "%-%-permit: must be absolute" },
    { { "confine", "--permit", "/etc/passwd", "--", "true" }, "%-%-permit: .*Not a directory" },
    { { "confine", "--permit", "/nonexistent/x", "--", "true" }, "%-%-permit: .*No such file" },
    { { "confine", "--permit", "/tmp", "--extra", "", "--", "true" }, "%-%-extra %(#1%): is empty" },
    { { "confine", "--permit", "/tmp", "--cd", "rel", "--", "true" }, "%-%-cd: must be absolute" },
    { { "confine", "--permit", "/tmp", "--", "" }, "CMD: must be a non%-empty string" },
    { { "confine", "--bogus", "x", "--permit", "/tmp", "--", "true" }, "%-%-bogus: unknown option" },
    { { "confine", "--permit", "/tmp" }, "CMD" },
    { { "confine", "--permit", "/", "--", "true" }, "would confine nothing" },
    { { "confine", "--permit", "/proc/self", "--", "true" }, "would confine nothing" },
  }
  for _, c in ipairs(bad) do
    it("confine refuses " .. table.concat(c[1], " ") .. " with a clear error and no spec", function()
      local out, status = h.corral(table.unpack(c[1]))
      assert.are.equal(2, status, out)
      assert.matches(c[2], out)
      assert.is_nil(out:find("exec-confined", 1, true))
    end)
  end

  it("the wrapper itself refuses bad input and runs nothing", function()
    local cases = {
      { "exec-confined", "--", "true" },
      { "exec-confined", "--permit", "rel", "--", "true" },
      { "exec-confined", "--permit", box, "--layers", "none", "--", "true" },
      { "exec-confined", "--permit", box, "--cd", "/tmp", "--", "true" },
      { "exec-confined", "--permit", box, "--what", "x", "--", "true" },
      { "exec-confined", "--permit", "/", "--", "true" },
      { "exec-confined", "--permit", box, "--extra", "/sys", "--", "true" },
    }
    -- the host's `exec-confined`, then the wrapper program beside it (with and without
    -- the leading word a spec's arguments carry)
    local programs = { { h.host } }
    if h.wrapper ~= h.host then -- built beside the host (not by `make asan`)
      programs[2], programs[3] = { h.wrapper }, { h.wrapper, drop_word = true }
    end
    for _, program in ipairs(programs) do
      for _, argv in ipairs(cases) do
        local line = table.move(argv, program.drop_word and 2 or 1, #argv, 2, { program[1] })
        local out, status = h.capture(line)
        assert.are.equal(125, status, table.concat(line, " ") .. ": " .. out)
        assert.matches("corral exec%-confined:", out)
      end
      local line = { program[1], "exec-confined", "--permit", box, "--", "sh", "-c", "echo ran" }
      if program.drop_word then table.remove(line, 2) end
      local out, status = h.capture(line) -- control
      assert.are.equal(0, status, out)
      assert.matches("ran", out)
    end
  end)

  it("the wrapper program's usage is the host's", function()
    if h.wrapper == h.host then return pending("no corral-exec-confined beside " .. h.host) end
    for _, flag in ipairs({ "--help", "-h" }) do
      local out, status = h.capture({ h.wrapper, flag })
      assert.are.equal(0, status, out)
      assert.matches("^corral exec%-confined %-%-permit DIR", out)
    end
    -- control: a --help that is --permit's value is a directory, refused as one
    local out, status = h.capture({ h.wrapper, "--permit", "--help", "--", "true" })
    assert.are.equal(125, status, out)
    assert.matches("corral exec%-confined: %-%-permit", out)
  end)

  -- (an operator-made storage elsewhere is shown through an idmapped mount:
  -- tests/storage_idmap_spec.lua)
  it("run never takes over the runtime as storage", function()
    local before = h.sh("stat -c '%u %g %a' /etc")
    local out, status = h.corral("run", "--storage", "/etc", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("/etc is inside the runtime read set %(/etc%), which stays read%-only: it cannot be handed", out)
    assert.are.equal(before, h.sh("stat -c '%u %g %a' /etc"))
    local dir = h.tmpdir("cli-store")
    os.execute("chmod 0711 " .. dir)
    out, status = h.corral("run", "--storage", dir .. "/alice", "--", "sh", "-c", "echo kept > /storage/f")
    assert.are.equal(0, status, out) -- control: corral creates it
    out, status = h.corral("run", "--storage", dir .. "/alice", "--", "cat", "/storage/f")
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    assert.matches("kept", out) -- and reuses it, since it belongs to the sandbox's id
  end)

  it("confine --layers builds the layers named, refusing what is not one; control: --layers ns lets " ..
    "bubblewrap nest (Landlock refuses it every mount)", function()
    for _, wrong in ipairs({ "ns,bwrap", "seatbelt", "landlock,landlock" }) do
      local out, status = h.corral("confine", "--layers", wrong, "--permit", box, "--", "true")
      assert.are.equal(2, status, wrong .. ": " .. out)
      assert.matches("invalid_argument: %-%-layers", out)
    end
    local bw = { "bwrap", "--unshare-user", "--ro-bind", "/", "/", "cat", sib .. "/s" }
    local function confined(layers)
      local argv = { "confine", "--exec", "--permit", sib, "--" }
      if layers then table.insert(argv, 2, "--layers"); table.insert(argv, 3, layers) end
      for _, a in ipairs(bw) do argv[#argv + 1] = a end
      return h.corral(table.unpack(argv))
    end
    local out, status = confined(nil)
    assert.are_not.equal(0, status, out)
    assert.matches("Failed to make / slave: Operation not permitted", out)
    out, status = confined("ns")
    assert.are.equal(0, status, out)
    assert.matches("cli%-secret", out)
    assert.matches("warning: only the ns layer, as %-%-layers asks; without Landlock", out)
    assert.matches("layers: landlock\n", h.corral("confine", "--layers", "landlock", "--permit", box, "--", "true"))
  end)

  it("the unprivileged path: confine works for a non-root caller (user namespace)", function()
    os.execute("chmod 0777 " .. box .. " && chmod 0755 " .. root)
    local out, status = h.capture({ "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
      h.host, "confine", "--exec", "--permit", box, "--", "sh", "-c", h.attempt_then_control('cat ' .. sib .. '/s',
      'id -u; echo u > mine && cat mine; grep -c . /proc/self/uid_map') })
    local rc = h.after_attempt(out, "^65534\nu\n1\n")
    assert.is_nil(out:find("cli-secret", 1, true))
    h.assert_refused(rc, out)
    assert.are.equal(0, status, out)
  end)

  it("run works unprivileged too: the tenant's root maps to the caller's own id", function()
    local dir = h.tmpdir("cli-unpriv")
    os.execute("chmod 0777 " .. dir .. " && mkdir " .. dir .. "/other && echo other-secret > " .. dir ..
      "/other/s && chown -R 65534 " .. dir .. "/other")
    local out, status = h.capture({ "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
      "HOME=" .. dir, h.host, "run", "--storage", dir .. "/alice", "--", "sh", "-c",
      h.attempt_then_control("cat " .. dir .. "/other/s",
      "id -u; echo mine > /storage/f && cat /storage/f; cat /proc/self/uid_map") })
    h.rmrf(dir)
    local rc = h.after_attempt(out, "^0\nmine\n%s+0%s+65534%s+1\n")
    assert.is_nil(out:find("other-secret", 1, true), out)
    h.assert_refused(rc, out)
    assert.are.equal(0, status, out)
  end)

  -- #alone (scripts/shard-specs): it counts every corral-run-* in /tmp, whoever made it
  it("run names the option a bad value came from, and leaves nothing behind #alone", function()
    local before = h.sh("ls /tmp | grep -c '^corral-run-'")
    local out, status
    for _, case in ipairs({ { "--memory", "abc" }, { "--memory", "1" }, { "--wall", "soon" }, { "--pids", "-1" },
                            { "--nofile", "99999999" }, { "--workspace", "/nonexistent" }, { "--storage", "/" },
                            { "--allow", "*.com" }, { "--allow", "garbage" }, { "--resolve", "a=b" },
                            { "--allow", "udp:ntp.test" }, { "--allow", "udp:ntp.test:53" },
                            { "--udp-idle", "0" }, { "--max-udp-flows", "0" }, { "--memory", "9000000T" },
                            { "--disk", "9000000T" } }) do
      out, status = h.corral("run", case[1], case[2], "--", "true")
      assert.are.equal(2, status, case[1] .. " " .. case[2] .. ": " .. out)
      assert.truthy(out:find("invalid_argument: " .. case[1], 1, true), out)
    end
    out, status = h.corral("run", "--memory", "64M", "--nofile", "256", "--", "true")
    assert.are.equal(0, status, out) -- control, after: good values run
    assert.are.equal(before, h.sh("ls /tmp | grep -c '^corral-run-'"))
  end)

  -- A refusal of a value, and then, in the same test, the value beside it that runs.
  local function refused_then_runs(flag, wrong, good, control_argv, expect)
    local out, status = h.corral("run", flag, wrong, "--", "sh", "-c", "echo command-ran")
    assert.are.equal(2, status, flag .. " " .. wrong .. ": " .. out)
    assert.truthy(out:find("invalid_argument: " .. flag .. ":", 1, true), out)
    assert.is_nil(out:find("command-ran", 1, true), out) -- refused before anything ran
    local argv = { "run", flag, good, "--" }
    for _, a in ipairs(control_argv or { "sh", "-c", "echo command-ran" }) do argv[#argv + 1] = a end
    local refusal = out
    out, status = h.corral(table.unpack(argv))
    assert.are.equal(0, status, flag .. " " .. good .. ": " .. out)
    assert.matches(expect or "command%-ran", out)
    return refusal
  end

  it("run refuses --cpu below the kernel's least CPU quota up front; control: 0.01 runs", function()
    -- below 0.00001 the quota was 0 and no limit was set at all; up to 0.0099 the cgroup refused it late (exit 3)
    for _, wrong in ipairs({ "0.0000001", "0.00001", "0.0099", "0", "1025" }) do
      assert.matches("%-%-cpu: must be a number of cores from 0%.01 %(the kernel's least CPU quota%) to 1024",
        refused_then_runs("--cpu", wrong, "0.01"))
    end
  end)

  for _, mechanism in ipairs({ "native", "bwrap" }) do
    it("run under " .. mechanism .. " takes --pids from what a sandbox needs to start to kernel.pid_max, " ..
      "naming the range; controls: both ends run", function()
      local pid_max = math.tointeger(tonumber(h.read("/proc/sys/kernel/pid_max")))
      local range = "%-%-pids: must be an integer from 4 %(what a sandbox needs to start its command%) to " ..
        pid_max .. " %(kernel%.pid_max%)"
      for _, case in ipairs({ { "1", "4" }, { "3", "4" }, { tostring(pid_max + 1), tostring(pid_max) },
                              { "4194305", tostring(pid_max) }, { "99999999", "4" } }) do
        local out, status = h.corral("run", "--mechanism", mechanism, "--pids", case[1], "--", "sh", "-c", "echo ran")
        assert.are.equal(2, status, case[1] .. ": " .. out)
        assert.matches(range, out)
        assert.is_nil(out:find("ran", 1, true), out)
        out, status = h.corral("run", "--mechanism", mechanism, "--pids", case[2], "--", "/bin/true")
        assert.are.equal(0, status, case[2] .. ": " .. out)
        assert.are.equal("", out)
      end
    end)
  end

  it("run refuses --nofile above the hard RLIMIT_NOFILE it runs with, naming it; control: that limit " ..
    "runs and the tenant has it", function()
    -- under a hard limit of 512 the tenant cannot be given 513: no process of it may raise a hard limit
    local script = '"$0" run --nofile 513 -- sh -c "echo ran"; echo status=$?; ' ..
      '"$0" run --nofile 512 -- sh -c "ulimit -Hn; ulimit -Sn"; echo status=$?'
    local out = h.capture({ "sh", "-c", "ulimit -n 512 && " .. script, h.host })
    assert.matches("^corral run: invalid_argument: %-%-nofile: must be an integer from 16 to 512, got 513 %(at " ..
      "most the hard RLIMIT_NOFILE corral runs with, `ulimit %-Hn`, which a sandbox cannot raise%)\nstatus=2\n", out)
    assert.matches("\nstatus=2\n512\n512\nstatus=0\n$", out)
  end)

  -- #alone (scripts/shard-specs): it counts every corral-run-* in /tmp, whoever made it
  it("run refuses network flags that cannot mean what they say, naming them (exit 2); controls: the same flags " ..
    "where they apply run #alone", function()
    local core = require "corral.core"
    local dir = h.tmpdir("cli-combo")
    finally(function() h.rmrf(dir) end)
    local before = h.sh("ls /tmp | grep -c '^corral-run-'")
    h.write(dir .. "/list", "a.test:443\n")
    local learn = dir .. "/learned"
    -- {argv, the flag refused, what its message names besides it}
    local cases = {
      { { "--learn", learn, "--allow", "a.test:443" }, "--learn", "with --allow" },
      { { "--learn", learn, "--allow-file", dir .. "/list" }, "--learn", "with --allow-file" },
      { { "--internal", "10.0.0.0/8" }, "--internal", "give --allow too" },
      { { "--resolve", "a.test=192.0.2.1" }, "--resolve", "give --allow too" },
      { { "--sni", "require" }, "--sni", "give --allow too" },
      { { "--allow", "a.test:443", "--udp-idle", "30s" }, "--udp-idle", "no --allow entry is udp:" },
      { { "--allow", "a.test:443", "--max-udp-flows", "8" }, "--max-udp-flows", "no --allow entry is udp:" },
      { { "--allow", "udp:a.test:123", "--idle", "10m" }, "--idle", "every --allow entry is udp:" },
      { { "--allow", "udp:a.test:123", "--max-connections", "8" }, "--max-connections", "every --allow entry is udp:" },
      { { "--allow", "udp:a.test:123", "--sni", "require" }, "--sni", "every --allow entry is udp:" },
      { { "--allow", "192.0.2.1:443", "--sni", "require" }, "--sni", "no --allow entry names a host" },
      { { "--allow-file", dir .. "/list", "--udp-idle", "30s" }, "--udp-idle", "no --allow-file entry is udp:" },
      { { "--log-json", dir .. "/log" }, "--log-json", "give --allow, --learn or --service-port" },
      { { "--verbose" }, "--verbose", "give --allow or --learn" },
      -- what it is given with first, before whether its namespace is there
      { { "--link", "corral-t-absent,10.0.0.2/24,10.0.0.1" }, "--link", "give --allow too" },
    }
    if core.proc.geteuid() == 0 then
      h.must("ip netns add corral-t-combo 2>/dev/null || true")
      cases[#cases + 1] = { { "--link", "corral-t-combo,10.0.0.2/24,10.0.0.1" }, "--link", "give --allow too" }
    end
    for _, case in ipairs(cases) do
      local argv = { "run" }
      for _, a in ipairs(case[1]) do argv[#argv + 1] = a end
      for _, a in ipairs({ "--", "sh", "-c", "echo command-ran" }) do argv[#argv + 1] = a end
      local out, status = h.corral(table.unpack(argv))
      local said = table.concat(case[1], " ") .. ": " .. out
      assert.are.equal(2, status, said)
      assert.truthy(out:find("invalid_argument: " .. case[2] .. ": ", 1, true), said)
      assert.truthy(out:find(case[3], 1, true), said)
      assert.is_nil(out:find("command-ran", 1, true), said)
    end
    if core.proc.geteuid() == 0 then h.must("ip netns del corral-t-combo") end
    assert.is_nil(core.fs.lstat(learn)) -- nothing written by a refused --learn
    assert.is_nil(core.fs.lstat(dir .. "/log"))
    -- control: beside --allow, the absent namespace is the refusal
    local out, status = h.corral("run", "--allow", "a.test:443", "--link", "corral-t-absent,10.0.0.2/24,10.0.0.1",
      "--", "sh", "-c", "echo command-ran")
    assert.are.equal(2, status, out)
    assert.matches("%-%-link: /run/netns/corral%-t%-absent: no such network namespace", out)
    assert.is_nil(out:find("command-ran", 1, true), out)
    -- controls, after: each flag beside what it applies to runs
    out, status = h.corral("run", "--allow", "a.test:443", "--allow", "udp:b.test:123", "--udp-idle", "30s",
      "--max-udp-flows", "8", "--idle", "10m", "--max-connections", "8", "--sni", "require", "--internal",
      "10.0.0.0/8", "--resolve", "a.test=192.0.2.1", "--log-json", dir .. "/log", "--verbose", "--",
      "sh", "-c", "echo command-ran")
    assert.are.equal(0, status, out)
    assert.matches("command%-ran", out)
    -- --learn keeps the flags the list will run with, but not --allow
    out, status = h.corral("run", "--learn", learn, "--internal", "10.0.0.0/8", "--resolve", "a.test=192.0.2.1",
      "--sni", "off", "--udp-idle", "30s", "--", "sh", "-c", "echo command-ran")
    assert.are.equal(0, status, out)
    assert.matches("command%-ran", out)
    assert.matches("^# corral run %-%-learn", h.read(learn))
    out, status = h.corral("run", "--service-port", "8080", "--log-json", dir .. "/log2", "--", "true")
    assert.are.equal(0, status, out)
    assert.are.equal(before, h.sh("ls /tmp | grep -c '^corral-run-'"))
  end)

  it("run checks --learn FILE before anything runs: empty, a directory, a symbolic link; control: a file " ..
    "is written", function()
    local dir = h.tmpdir("cli-learn")
    assert(os.execute("ln -s " .. dir .. "/elsewhere " .. dir .. "/link && mkdir " .. dir .. "/sub"))
    for _, case in ipairs({ { "", '"": name a file' }, { dir .. "/sub", "a directory, not a regular file" },
                            { dir .. "/sub/", "name a file" }, { dir .. "/link", "a symbolic link" },
                            { dir .. "/none/f", "the directory " .. dir .. "/none does not exist" },
                            { "-", '"-": name a file' } }) do
      local out, status = h.corral("run", "--learn", case[1], "--", "sh", "-c", "echo command-ran")
      assert.are.equal(2, status, case[1] .. ": " .. out)
      assert.truthy(out:find("invalid_argument: --learn: ", 1, true), out)
      assert.truthy(out:find(case[2], 1, true), out)
      assert.is_nil(out:find("command-ran", 1, true), out)
      assert.is_nil(out:find("not written", 1, true), out)
      -- control: a file in that directory is checked, the command runs and the list is written
      out, status = h.corral("run", "--learn", dir .. "/sub/list", "--", "sh", "-c", "echo command-ran")
      assert.are.equal(0, status, out)
      assert.matches("command%-ran\ncorral run: %-%-learn: 0 entries written to ", out)
      assert.matches("^# corral run %-%-learn", h.read(dir .. "/sub/list"))
      os.remove(dir .. "/sub/list")
    end
    assert.is_nil(h.sh("test -e " .. dir .. "/elsewhere && echo made"):match("made")) -- never through the link
    h.rmrf(dir)
  end)

  it("run refuses a directory as --allow-file and an empty CMD with exit 2, no traceback; controls run",
    function()
    local dir = h.tmpdir("cli-allowdir")
    local out, status = h.corral("run", "--allow-file", dir, "--", "true")
    assert.are.equal(2, status, out)
    assert.are.equal("corral run: invalid_argument: --allow-file: " .. dir .. ": Is a directory\n", out)
    h.write(dir .. "/list", "a.test:443")
    out, status = h.corral("run", "--allow-file", dir .. "/list", "--", "sh", "-c", "echo command-ran")
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    assert.matches("command%-ran", out)
    for _, mechanism in ipairs({ "native", "bwrap" }) do
      out, status = h.corral("run", "--mechanism", mechanism, "--", "")
      assert.are.equal(2, status, out)
      assert.are.equal("corral run: invalid_argument: CMD: the command to run is missing or empty\n", out)
      out, status = h.corral("run", "--mechanism", mechanism, "--", "sh", "-c", "echo command-ran")
      assert.are.equal(0, status, out)
      assert.are.equal("command-ran\n", out)
    end
  end)

  it("run names the flag in a refusal and quotes the value as given, never rewriting it", function()
    local out, status = h.corral("run", "--id", "valid id", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches('^corral run: invalid_argument: %-%-id: must be [^\n]*; got "valid id"\n$', out)
    out, status = h.corral("run", "--id", "valid-id", "--", "true")
    assert.are.equal(0, status, out)
    out, status = h.corral("run", "--storage", "/x/.idea", "--", "true")
    assert.are.equal(2, status, out)
    assert.truthy(out:find("invalid_argument: --storage: /x does not exist", 1, true), out)
    assert.is_nil(out:find("--storageea", 1, true), out)
    -- where the parent exists the last component is the id, refused as written
    local dir = h.tmpdir("cli-idea")
    os.execute("chmod 0711 " .. dir)
    out, status = h.corral("run", "--storage", dir .. "/.idea", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches('^corral run: invalid_argument: %-%-storage: must be [^\n]*; got "%.idea"\n$', out)
    out, status = h.corral("run", "--storage", dir .. "/idea", "--", "true")
    h.rmrf(dir)
    assert.are.equal(0, status, out)
    out, status = h.corral("run", "--mechanism", "nonesuch", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("^corral run: invalid_argument: %-%-mechanism: no built%-in mechanism nonesuch", out)
    out, status = h.corral("run", "--mechanism", "native", "--", "true")
    assert.are.equal(0, status, out)
  end)

  it("run takes counts in plain decimal and sizes in whole bytes or with a unit; controls run", function()
    refused_then_runs("--pids", "0x10", "16")
    refused_then_runs("--pids", " 5", "16")
    refused_then_runs("--pids", "1e3", "1000")
    refused_then_runs("--cpu", "0x10", "0.5")
    refused_then_runs("--cpu", "1e0", ".5")
    refused_then_runs("--nofile", "0x10", "64", { "sh", "-c", "ulimit -n" }, "^64\n$")
    -- 1.5 bytes was taken as 1; a unit's fraction is whole bytes (ulimit -f counts 512-byte blocks)
    refused_then_runs("--fsize", "1.5", "1.5K", { "sh", "-c", "ulimit -f" }, "^3\n$")
    refused_then_runs("--service-port", "0x50", "80", nil, "service port 80 on 127%.0%.0%.1:%d+")
    -- each beside an entry it applies to (--max-udp-flows: a udp: entry)
    for flag, entry in pairs({ ["--max-connections"] = "a.test", ["--max-udp-flows"] = "udp:a.test:123" }) do
      local out, status = h.corral("run", "--allow", entry, flag, "0x10", "--", "sh", "-c", "echo command-ran")
      assert.are.equal(2, status, out)
      assert.truthy(out:find("invalid_argument: " .. flag .. ': "0x10": a positive integer, in decimal', 1, true), out)
      out, status = h.corral("run", "--allow", entry, flag, "16", "--", "sh", "-c", "echo command-ran")
      assert.are.equal(0, status, out)
      assert.matches("command%-ran", out)
    end
  end)

  it("run without a writable /tmp for its temporary storage says so, naming --storage (exit 3); control: " ..
    "--storage DIR runs #root", function()
    local dir = h.tmpdir("rotmp")
    os.execute("chmod 0711 " .. dir)
    -- /tmp read-only in a mount namespace of its own, this test's directory beneath it still writable
    local script = "mount --bind $1 $1 && mount --rbind /tmp /tmp && mount -o remount,bind,ro /tmp && " ..
      "TMPDIR=$1 \"$0\" run -- true; echo status=$?; TMPDIR=$1 \"$0\" run --storage $1/s -- sh -c 'echo ran'"
    local out = h.capture({ "unshare", "-m", "--propagation", "private", "sh", "-c", script, h.host, dir })
    h.rmrf(dir)
    assert.matches("cannot_enforce: filesystem_confinement: cannot make a temporary storage in /tmp .*" ..
      "give %-%-storage DIR\nstatus=3\n", out)
    assert.matches("status=3\nran\n$", out)
  end)

  it("run refuses a single-label --allow name with the reason, in a file too", function()
    local out, status = h.corral("run", "--allow", "garbage", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches('%-%-allow: "garbage": a single%-label name is not a host', out)
    local dir = h.tmpdir("cli-allow")
    h.write(dir .. "/list", "pypi.org:443\nintranet:80\n")
    out, status = h.corral("run", "--allow-file", dir .. "/list", "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("%-%-allow%-file: [^\n]*/list:2: \"intranet:80\": a single%-label name is not a host", out)
    h.write(dir .. "/list", "pypi.org:443\n192.0.2.1\n")
    out, status = h.corral("run", "--allow-file", dir .. "/list", "--allow", "a.test", "--", "true")
    h.rmrf(dir)
    assert.are.equal(0, status, out) -- control: dotted names and an address pass
  end)

  for _, mechanism in ipairs({ "native", "bwrap" }) do
    it("run under " .. mechanism .. " names a missing command (127) and one it cannot execute (126)", function()
      local out, status = h.corral("run", "--mechanism", mechanism, "--", "no-such-command-corral", "x")
      assert.are.equal(127, status, out)
      assert.are.equal("corral run: no-such-command-corral: command not found\n", out)
      out, status = h.corral("run", "--mechanism", mechanism, "--", "/nonexistent/program")
      assert.are.equal(127, status, out)
      assert.are.equal("corral run: /nonexistent/program: No such file or directory\n", out)
      out, status = h.corral("run", "--mechanism", mechanism, "--", "/etc")
      assert.are.equal(126, status, out)
      assert.are.equal("corral run: /etc: Permission denied\n", out)
      -- what only the sandbox can judge (a workspace's files, its /tmp): the same statuses
      local ws = h.tmpdir("cli-ws")
      h.write(ws .. "/plain", "data\n")
      h.write(ws .. "/badinterp", "#!/nonexistent/interpreter\n")
      os.execute("chmod 0755 " .. ws .. " " .. ws .. "/badinterp")
      local statuses = {}
      for _, cmd in ipairs({ "/workspace/missing", "/workspace/plain", "/workspace/badinterp", "/tmp" }) do
        local _, st = h.corral("run", "--mechanism", mechanism, "--workspace", ws, "--", cmd)
        statuses[#statuses + 1] = st
      end
      h.rmrf(ws)
      assert.are.same({ 127, 126, 127, 126 }, statuses)
      -- controls: a command that exits 127 itself says nothing of the kind, and one that
      -- exists only inside the sandbox (its storage, on its PATH or by a relative path) runs
      out, status = h.corral("run", "--mechanism", mechanism, "--", "sh", "-c", "exit 127")
      assert.are.equal(127, status, out)
      assert.are.equal("", out)
      local dir = h.tmpdir("cli-missing")
      os.execute("chmod 0711 " .. dir)
      local st = dir .. "/t"
      out, status = h.corral("run", "--mechanism", mechanism, "--storage", st, "--", "sh", "-c",
        "mkdir -p bin && printf '#!/bin/sh\\necho inside-$1\\n' > bin/t && chmod +x bin/t")
      assert.are.equal(0, status, out)
      out, status = h.corral("run", "--mechanism", mechanism, "--storage", st, "--", "./bin/t", "rel")
      assert.are.equal(0, status, out)
      assert.matches("inside%-rel", out)
      out, status = h.corral("run", "--mechanism", mechanism, "--storage", st, "--", "/storage/bin/t", "abs")
      h.rmrf(dir)
      assert.are.equal(0, status, out)
      assert.matches("inside%-abs", out)
    end)
  end

  it("run reports 121 only when the memory cap ended the command itself", function()
    local hog = "/usr/bin/python3 -c 'x = bytearray(200 * 1024 * 1024)'"
    local out, status = h.corral("run", "--memory", "32M", "--", "sh", "-c", hog)
    assert.are.equal(121, status, out) -- control: the command itself killed at its cap
    assert.matches("memory cap ended", out)
    out, status = h.corral("run", "--memory", "32M", "--", "sh", "-c", hog .. "; echo went-on; exit 0")
    assert.are.equal(0, status, out) -- a child killed at the cap, the command carried on
    assert.matches("went%-on", out)
    assert.is_nil(out:find("memory cap ended", 1, true), out)
  end)

  it("run refuses a storage another sandbox is using, and takes it once it is free", function()
    local dir = h.tmpdir("lockst")
    os.execute("chmod 0711 " .. dir)
    local st = dir .. "/shared"
    local first = h.sh(h.host .. " run --storage " .. st .. " -- sh -c 'echo first-in; sleep 2' > " .. dir ..
      "/first.out 2>&1 & echo $!"):match("%d+")
    assert(h.wait_for(function() return (h.read(dir .. "/first.out") or ""):find("first-in", 1, true) ~= nil end, 5),
      h.read(dir .. "/first.out"))
    local out, status = h.corral("run", "--storage", st, "--", "true")
    assert.are.equal(2, status, out)
    assert.matches("in use by another sandbox", out)
    assert(h.wait_for(function() return not h.sh("ps -p " .. first .. " -o pid="):match("%d") end, 10))
    out, status = h.corral("run", "--storage", st, "--", "true")
    assert.are.equal(0, status, out) -- control: once the first is done, the storage is free
    h.rmrf(dir)
  end)

  it("run puts the terminal back as it found it", function()
    local script = h.host .. " run -- sh -c 'stty -echo intr undef; stty -a | grep -o \"intr = [^;]*\"'; " ..
      "stty -a | grep -o \"intr = [^;]*\"; stty -a | grep -o \" -echo \" || echo echo-on"
    local out = h.sh("printf '' | script -qec " .. h.quote(script) .. " /dev/null")
    out = out:gsub("\r", "")
    assert.matches("intr = <undef>\nintr = %^C\necho%-on", out) -- inside: changed (control); after: back
  end)

  it("run sweeps the temporary storage of killed runs, and only that", function()
    local dead = h.sh("sh -c 'echo $$'"):match("%d+") -- a process that has exited
    local stale = "/tmp/corral-run-" .. dead .. "-sweep1"
    local live = "/tmp/corral-run-" .. require("corral.core").proc.getpid() .. "-sweep2" -- this runner
    local foreign = "/tmp/corral-run-" .. dead .. "-sweep3"
    local outside = h.tmpdir("sweep-outside")
    h.write(outside .. "/keep", "keep")
    -- Each tree is made whole elsewhere, then renamed into place: any `corral run` on this
    -- host sweeps /tmp, and must never see one half made (a foreign tree not yet chowned).
    local stage = h.tmpdir("sweep-stage")
    for i, d in ipairs({ stale, live, foreign }) do
      local tmp = stage .. "/" .. i
      assert(os.execute("mkdir -p " .. tmp .. "/tenant"))
      -- A link planted inside the stale tree must be removed, never followed.
      if d == stale then assert(os.execute("ln -s " .. outside .. " " .. tmp .. "/tenant/link")) end
      if d == foreign then assert(os.execute("chown 4242 " .. tmp)) end
      assert(os.execute("mv -T " .. tmp .. " " .. d))
    end
    h.rmrf(stage)
    local out, status = h.corral("run", "--", "true")
    assert.are.equal(0, status, out)
    assert.is_nil(h.sh("test -e " .. stale .. " && echo present"):match("present"))
    assert.are.equal("keep", h.read(outside .. "/keep"))
    assert.matches("present", h.sh("test -d " .. live .. " && echo present")) -- its owner lives
    assert.matches("present", h.sh("test -d " .. foreign .. " && echo present")) -- not ours
    os.execute("rm -rf " .. live .. " " .. foreign)
    h.rmrf(outside)
  end)

  it("run refused at provisioning still sweeps what dead probes left (the sweeps run as it ends)", function()
    local dead = h.sh("sh -c 'echo $$'"):match("%d+") -- a process that has exited
    local stale = "/tmp/corral-probe-" .. dead .. "-sweep4"
    local st = h.tmpdir("sweep-busy")
    assert(os.execute("mkdir " .. stale))
    -- the storage held by another holder's lock: the provision is refused
    -- the holder waits for the lock (without -n: the probe below holds it for a moment,
    -- and a holder that gave up then would leave the storage free)
    local holder = io.popen("exec flock " .. h.quote(st) .. " -c 'read -r _'", "w")
    assert.is_true(h.wait_for(function() return not os.execute("flock -n " .. h.quote(st) .. " true") end, 20),
      "the holder never took the lock")
    local out, status = h.corral("run", "--storage", st, "--", "true")
    holder:close()
    assert.are.equal(2, status, out)
    assert.matches("in use by another sandbox", out)
    assert.is_nil(h.sh("test -e " .. stale .. " && echo present"):match("present"))
    os.execute("rm -rf " .. stale)
    h.rmrf(st)
  end)

  it("sbpl prints the deny-default profile with the resolved boundary", function()
    os.execute("ln -sfn " .. box .. " " .. root .. "/link")
    local out, status = h.corral("sbpl", "--permit", root .. "/link")
    assert.are.equal(0, status, out)
    assert.matches("^%(version 1%)", out)
    assert.matches("%(deny default%)", out)
    assert.matches('%(subpath "' .. box:gsub("%p", "%%%0") .. '"%)', out)
    assert.is_nil(out:find(root .. "/link", 1, true))
  end)

  it("resolve follows PATH and symlinks, and fails naming a command it cannot find", function()
    local out, status = h.corral("resolve", "sh")
    assert.are.equal(0, status) -- control
    assert.are.equal(h.sh("readlink -f $(command -v sh)"), out)
    out, status = h.corral("resolve", "no-such-command-corral")
    assert.are.equal(1, status, out)
    assert.are.equal("corral resolve: no-such-command-corral: command not found\n", out)
    out, status = h.corral("resolve", "/nonexistent/program")
    assert.are.equal(1, status, out)
    assert.are.equal("corral resolve: /nonexistent/program: No such file or directory\n", out)
  end)

  it("probe reports each capability with its detail, as text and JSON", function()
    local out, status = h.corral("probe", "--json")
    assert.are.equal(0, status, out)
    local results = json.decode(out)
    local by = {}
    for _, r in ipairs(results) do by[r.name] = r end
    assert.is_true(by["confinement.landlock"].holds)
    assert.matches("ABI %d", by["confinement.landlock"].detail)
    assert.is_true(by.filesystem_confinement.holds)
    -- established by filling a disk of its own, which needs root and a loop device
    local core = require "corral.core"
    local loop = core.proc.geteuid() == 0 and core.fs.lstat("/dev/loop-control") ~= nil
    assert.are.equal(loop, by.disk_quota.holds, by.disk_quota.detail)
    if loop then assert.matches("failed with ENOSPC; a small write then succeeded", by.disk_quota.detail) end
    -- every result says when it was probed, afresh or kept from earlier this boot
    local now = os.time()
    for _, r in ipairs(results) do
      assert.is_number(r.probed_at, r.name)
      assert.is_true(r.probed_at <= now and r.probed_at > now - 86400 * 365, r.name)
    end
    out, status = h.corral("probe", "--json", "--fresh")
    assert.are.equal(0, status, out)
    for _, r in ipairs(json.decode(out)) do
      assert.is_number(r.probed_at, r.name)
      assert.is_nil(r.kept, r.name)
    end
    out = h.corral("probe")
    assert.matches("filesystem_confinement%s+holds", out)
    assert.matches("disk_quota%s+" .. (loop and "holds" or "absent"), out)
  end)
end)

describe("corral.run from Lua", function()
  local run = require "corral.run"
  local core = require "corral.core"

  local function own_temps()
    local n = 0
    for _, name in ipairs(core.fs.listdir("/tmp") or {}) do
      if name:find("^corral%-run%-" .. core.proc.getpid() .. "%-") then n = n + 1 end
    end
    return n
  end

  it("names a refused value by its field without the CLI's names, and leaves nothing", function()
    local status, err = run.execute({ argv = { "true" }, limits = { pids = "many" } })
    assert.is_nil(status)
    assert.are.equal("limits.pids", err.argument)
    status, err = run.execute({ argv = { "true" }, limits = { memory = "1" } })
    assert.is_nil(status)
    assert.are.equal("limits.memory", err.argument) -- from corral.sandbox, after the temporary storage
    status, err = run.execute({ argv = { "true" }, limits = { memory = "1" } },
      { names = { ["limits.memory"] = "-m" } })
    assert.is_nil(status)
    assert.are.equal("-m", err.argument)
    assert.are.equal(0, own_temps())
  end)

  local function blocked()
    local f = assert(io.open("/proc/self/status"))
    local mask = f:read("a"):match("SigBlk:%s*(%x+)")
    f:close()
    return mask
  end

  it("returns the command's status and says why corral ended a run #root", function()
    local mask = blocked()
    local said = {}
    local hooks = { say = function(line) said[#said + 1] = line end }
    local status = run.execute({ argv = { "sh", "-c", "exit 7" } }, hooks)
    assert.are.equal(7, status) -- control: the command's own status, nothing said
    assert.are.same({}, said)
    status = run.execute({ argv = { "sleep", "5" }, limits = { wall = "0.3s" } }, hooks)
    assert.are.equal(run.EXIT.wall, status)
    assert.are.same({ "the wall-clock limit ended the sandbox" }, said)
    assert.are.equal(0, own_temps())
    -- the forwarded signals were blocked for the run only: the caller lives on
    assert.are.equal(mask, blocked())
  end)

  it("gives a low nofile limit to a caller holding more fds than that limit #root", function()
    local said = {}
    local hooks = { say = function(line) said[#said + 1] = line end }
    -- control first: the limit itself is given when the caller holds few fds
    local status = run.execute({ argv = { "sh", "-c", "test $(ulimit -n) = 100" }, limits = { nofile = 100 } }, hooks)
    assert.are.equal(0, status, table.concat(said, "\n"))
    -- 150 more of the caller's own: they once filled every number beneath the limit in
    -- the sandbox's init, whose own pipe then failed (EMFILE: "fork tenant")
    local held = {}
    for i = 1, 150 do held[i] = assert(io.open("/dev/null")) end
    status = run.execute({ argv = { "sh", "-c", "test $(ulimit -n) = 100" }, limits = { nofile = 100 } }, hooks)
    for _, f in ipairs(held) do f:close() end
    assert.are.equal(0, status, table.concat(said, "\n"))
    assert.are.same({}, said)
  end)
end)

describe("resources.sweep", function()
  local resources = require "corral.resources"
  local core = require "corral.core"

  it("removes only entries whose creator is gone and that the remover takes", function()
    local dir = h.tmpdir("sweep")
    local dead = h.sh("sh -c 'echo $$'"):match("%d+")
    local names = { "x-" .. dead .. "-a", "x-" .. core.proc.getpid() .. "-b", "x-" .. dead .. "-keep", "y-" .. dead }
    for _, name in ipairs(names) do
      assert(core.fs.mkdir(dir .. "/" .. name, tonumber("700", 8)))
    end
    local removed = resources.sweep(dir, "^x%-(%d+)%-", function(path)
      return not path:find("keep", 1, true) and os.remove(path)
    end)
    local left = core.fs.listdir(dir)
    h.rmrf(dir)
    assert.are.equal(1, removed)
    local want = { "x-" .. dead .. "-keep", "x-" .. core.proc.getpid() .. "-b", "y-" .. dead }
    table.sort(want)
    assert.are.same(want, left)
  end)
end)
