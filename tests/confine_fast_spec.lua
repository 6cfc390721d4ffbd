-- `corral confine --exec`'s C fast path (core/host/confine_fast.c): for every line it
-- handles, the spec it builds is the one Lua builds (`corral confine --json`); every line
-- it does not cover goes to the Lua path unchanged; and what it runs is confined.
-- CORRAL_CONFINE_FAST_DEBUG=spec prints the C-built spec instead of running it (or
-- "fast path declined: why", exit 99); =run says on stderr that the fast path ran it.
local core = require "corral.core"
local h = require "helpers"
local json = require "dkjson"
local shell = require "corral.shell"

local DECLINED = 99

local function with_env(env, host, argv)
  local line = { "env" }
  for _, e in ipairs(env) do line[#line + 1] = e end
  line[#line + 1] = host
  for _, a in ipairs(argv) do line[#line + 1] = a end
  return h.capture(line)
end

-- The fast path's spec and Lua's, for `confine --exec ARGS` and `confine --json ARGS`
-- in the same environment (the debug variable is set for both: it is one of the names).
local function both(host, args, env)
  local e = { "CORRAL_CONFINE_FAST_DEBUG=spec", table.unpack(env or {}) }
  local fast, fstatus = with_env(e, host, { "confine", "--exec", table.unpack(args) })
  local lua, lstatus = with_env(e, host, { "confine", "--json", table.unpack(args) })
  return fast, fstatus, lua, lstatus
end

local function assert_same_spec(host, args, env)
  local fast, fstatus, lua, lstatus = both(host, args, env)
  assert.are.equal(0, lstatus, lua)
  assert.are.equal(0, fstatus, "the fast path did not handle " .. shell.join(args) .. ": " .. fast)
  local f, l = json.decode(fast), json.decode(lua)
  assert.is_table(f, fast)
  assert.are.same(l, f)
  return f
end

local function assert_declined(host, args, env)
  local fast, fstatus = both(host, args, env)
  assert.are.equal(DECLINED, fstatus, fast)
  assert.matches("fast path declined: ", fast)
end

describe("confine's C fast path #root", function()
  -- host: a copy of the host with its own probe cache file (cache), which no other test
  -- rewrites (an in-process probe of a spec's own interpreter keeps another key there)
  local root, box, extra, sib, host, cache, layers

  setup(function()
    root = h.tmpdir("confine-fast")
    box, extra, sib = root .. "/box", root .. "/extra", root .. "/sibling"
    h.sh([[set -e; cd "$1"; mkdir box extra sibling
      cd box; mkdir -p sub/deep src/repo a/b/c/r4 vendor/lib .vscode
      git -C src/repo init -q; git -C a/b/c/r4 init -q; git -C vendor/lib init -q
      mkdir -p src/repo/.git/modules/m1 src/repo/.git/modules/m2/hooks
      echo x > src/repo/.git/modules/m1/config
      echo 'export A=1' > .envrc; echo 'alias ll=ls' > .bashrc; echo '{}' > .vscode/tasks.json
      ln -s .bashrc .profile; echo reg=1 > npmrc.real; ln npmrc.real .npmrc; mkfifo .yarnrc
      mkdir -p linked/realgit/hooks; ln -s realgit linked/.git
      mkdir -p linked2 && git -C linked2 init -q && mv linked2/.git linked2/gitdir && ln -s gitdir linked2/.git
      echo f > file.txt; echo secret > ../sibling/secret
      cd ../extra; git init -q; echo e > ../extra-file
      /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' ../agent.sock
      mkdir ../big; cd ../big
      for i in $(seq 10 69); do mkdir -p "r$i/.git/hooks"; echo c > "r$i/.git/config"; done
      mkdir files; cd files; seq 1 5000 | xargs touch; mkdir -p zz/repo/.git/hooks]], root)
    h.must("ln -s " .. h.quote(box) .. " " .. h.quote(root .. "/box-link"))
    -- the front (served here) and the host beside it, as make install lays them out
    host, cache = h.private_host(root)
    -- the probe cache holds what holds (a first Lua run probes, and keeps what holds)
    local out, status = h.capture({ host, "confine", "--json", "--permit", box, "--", "true" })
    assert(status == 0, out)
    layers = table.concat(json.decode(out).layers, ",")
  end)

  teardown(function()
    if cache and cache:match("^/") then os.remove(cache) end
    h.rmrf(root)
  end)

  local function layers_hold() return layers == "ns,landlock" end

  describe("builds exactly Lua's spec", function()
    local cases = {
      { "a plain --permit", function() return { "--permit", box, "--", "true" } end },
      { "a command by name, and its arguments", function()
        return { "--permit", box, "--", "sh", "-c", "echo \"$@\"", "x", "a b", "tab\there", "new\nline", "é" } end },
      { "an absolute command", function() return { "--permit", box, "--", "/bin/echo", "hi" } end },
      { "--permit through a symlink, and with a trailing slash", function()
        return { "--permit", root .. "/box-link/", "--", "true" } end },
      { "--permit with .. in it", function() return { "--permit", box .. "/sub/../sub/..", "--", "true" } end },
      { "several --extra: directories, a file and a unix socket", function()
        return { "--permit", box .. "/sub", "--extra", extra, "--extra", root .. "/extra-file", "--extra",
          sib, "--extra", root .. "/agent.sock", "--", "true" } end },
      { "a command given by a relative path", function()
        return { "--permit", box, "--", "scripts/../scripts/run-tests", "--help" } end },
      { "--cd beneath --permit", function()
        return { "--cd", box .. "/sub/deep", "--permit", box, "--", "true" } end },
      { "--cd inside an --extra directory", function()
        return { "--permit", box .. "/sub", "--extra", extra, "--cd", extra, "--", "true" } end },
      { "--read-only, a file and a directory", function()
        return { "--permit", box, "--read-only", box .. "/file.txt", "--read-only", box .. "/sub/deep", "--",
          "true" } end },
      { "--writable, existing and missing (its parent resolved)", function()
        return { "--permit", box, "--writable", box .. "/src", "--writable", box .. "/.idea", "--writable",
          root .. "/box-link/.vscode", "--", "true" } end },
      { "--writable dropping a repository nested deeper", function()
        return { "--permit", box, "--writable", box .. "/vendor", "--", "true" } end },
      { "sixty repositories, and a search stopped at its bound", function()
        return { "--permit", root .. "/big", "--extra", root .. "/big/files", "--", "true" } end,
        function(spec)
          assert.is_true(spec.read_only.stopped)
          assert.are.equal(60 * 2, #spec.read_only.paths)
        end },
      { "options in another order", function()
        return { "--extra", extra, "--cd", extra, "--permit", box, "--", "true" } end },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
        local spec = assert_same_spec(host, c[2]())
        assert.are.same({ "ns", "landlock" }, spec.layers)
        if c[3] then c[3](spec) end
      end)
    end

    it("covers what the tree holds: held, absent, symlinks, hard links, a fifo, submodules, depth", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      local spec = assert_same_spec(host, { "--permit", box, "--", "true" })
      local ro = spec.read_only
      local held = table.concat(ro.paths, "\n") .. "\n"
      for _, p in ipairs({ "/.envrc", "/.bashrc", "/.vscode", "/src/repo/.git/hooks", "/src/repo/.git/config",
        "/src/repo/.git/modules/m1/config", "/src/repo/.git/modules/m2/hooks", "/vendor/lib/.git/hooks" }) do
        assert.truthy(held:find(box .. p .. "\n", 1, true), p .. " not held: " .. held)
      end
      -- a repository 4 levels down is past the search's bound
      assert.falsy(held:find("/r4/", 1, true), held)
      local why = {}
      for _, u in ipairs(ro.unprotected) do why[u.path:sub(#box + 1)] = u.why end
      assert.matches("^a symlink", why["/.profile"])
      assert.matches("^2 hard links", why["/.npmrc"])
      assert.matches("^neither a file nor a directory", why["/.yarnrc"])
      assert.matches("/linked/%.git on its way is a symlink", why["/linked/.git/hooks"])
      assert.matches("on its way is a symlink", why["/linked2/.git/config"])
    end)

    it("the text is Lua's, byte for byte", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      local fast, fstatus, lua = both(host, { "--permit", box, "--extra", extra, "--", "true" })
      assert.are.equal(0, fstatus, fast)
      assert.are.equal(lua, fast)
    end)

    it("the host program run by its own name builds the same spec as the front", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      local own = host:gsub("[^/]*$", "") .. "corral-host"
      if not core.fs.lstat(own) then return pending("this build has no front: corral is the host") end
      local args = { "--permit", box, "--extra", extra, "--", "true" }
      local via_front, fstatus = both(host, args)
      local via_host, hstatus = both(own, args)
      assert.are.equal(0, fstatus, via_front)
      assert.are.equal(0, hstatus, via_host)
      assert.are.equal(via_front, via_host)
    end)
  end)

  describe("declines to the Lua path", function()
    local bad = {
      -- each is the Lua path's argument error (exit 2) naming the flag
      { "a relative --permit", function() return { "--permit", "box", "--", "true" } end, 2, "--permit" },
      { "a missing --permit", function() return { "--permit", root .. "/nope", "--", "true" } end, 2, "--permit" },
      { "--permit /", function() return { "--permit", "/", "--", "true" } end, 2, "--permit" },
      { "--permit given twice", function() return { "--permit", box, "--permit", extra, "--", "true" } end, 2,
        "--permit" },
      { "--permit without its value", function() return { "--permit", "--", "true" } end, 2, "--permit" },
      { "no --permit", function() return { "--", "true" } end, 2, "--permit" },
      { "an unknown option", function() return { "--permit", box, "--bogus", "--", "true" } end, 2, "--bogus" },
      { "--permit=DIR", function() return { "--permit=" .. root .. "/nope", "--", "true" } end, 2, "--permit" },
      { "a file --extra inside --permit", function()
        return { "--permit", box, "--extra", box .. "/file.txt", "--", "true" } end, 2, "--extra" },
      { "a relative --extra", function() return { "--permit", box, "--extra", "extra", "--", "true" } end, 2,
        "--extra" },
      { "a relative --read-only", function()
        return { "--permit", box, "--read-only", "file.txt", "--", "true" } end, 2, "--read-only" },
      { "--read-only outside the boundary", function()
        return { "--permit", box, "--read-only", sib .. "/secret", "--", "true" } end, 2, "--read-only" },
      { "--read-only missing", function()
        return { "--permit", box, "--read-only", box .. "/nope", "--", "true" } end, 2, "--read-only" },
      { "--read-only a hard-linked file", function()
        return { "--permit", box, "--read-only", box .. "/.npmrc", "--", "true" } end, 2, "--read-only" },
      { "--writable inside a read-only path", function()
        return { "--permit", box, "--writable", box .. "/.vscode/tasks.json", "--", "true" } end, 2,
        "--writable" },
      { "--cd outside the boundary", function() return { "--permit", box, "--cd", sib, "--", "true" } end, 2,
        "--cd" },
      { "no command", function() return { "--permit", box, "--" } end, 2, "CMD" },
      { "a command not found", function() return { "--permit", box, "--", "no-such-cmd-x" } end, 127,
        "not found" },
    }
    for _, c in ipairs(bad) do
      it(c[1] .. ": Lua's refusal, exit " .. c[3], function()
        assert_declined(host, c[2]())
        -- the --exec line itself goes to the Lua path, which refuses it naming the flag
        local out, status = h.capture({ host, "confine", "--exec", table.unpack(c[2]()) })
        assert.are.equal(c[3], status, out)
        assert.truthy(out:find(c[4], 1, true), out)
      end)
    end

    it("what it does not cover: --broker, --layers, LUA_INIT, a broker's variable", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      assert_declined(host, { "--broker", "--permit", box, "--", "true" })
      assert_declined(host, { "--layers", "ns,landlock", "--permit", box, "--", "true" })
      assert_declined(host, { "--permit", box, "--", "true" }, { "LUA_INIT=x = 1" })
      assert_declined(host, { "--permit", box, "--", "true" }, { "CORRAL_BROKER=/nonexistent" })
      -- control: the same line without them is handled
      assert_same_spec(host, { "--permit", box, "--", "true" })
    end)
  end)

  describe("confines what it runs", function()
    it("refuses a write outside and to .git/hooks; control: a write inside, to .git/info", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      local script = h.attempt_then_control(
        'echo x > "$1/new"; echo evil >> src/repo/.git/hooks/pre-commit; touch src/repo/.git/hooks/post',
        'echo in > control && touch src/repo/.git/info/new && echo control-ok')
      local out, status = with_env({ "CORRAL_CONFINE_FAST_DEBUG=run" }, host,
        { "confine", "--exec", "--permit", box, "--", "sh", "-c", script, "sh", sib })
      assert.matches("corral confine: fast path\n", out, 1, true)
      h.assert_refused(h.after_attempt(out, "control%-ok"), out)
      assert.are.equal(0, status, out)
      assert.is_nil(h.read(sib .. "/new"))
      assert.is_nil(h.read(box .. "/src/repo/.git/hooks/post"))
      assert.are.equal("in\n", h.read(box .. "/control"))
      assert.truthy(h.read(box .. "/src/repo/.git/info/new"))
    end)

    it("runs in --cd with the caller's environment and passes the command's status", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      local out, status = with_env({ "CORRAL_CONFINE_FAST_DEBUG=run", "FAST_MARK=v1" }, host,
        { "confine", "--exec", "--permit", box, "--cd", box .. "/sub", "--", "sh", "-c",
          'echo "$PWD $FAST_MARK"; exit 7' })
      assert.matches("corral confine: fast path\n", out, 1, true)
      assert.truthy(out:find(box .. "/sub v1\n", 1, true), out)
      assert.are.equal(7, status, out)
    end)
  end)

  describe("with a stale or absent probe cache", function()
    local function fast_says()
      local out, status = with_env({ "CORRAL_CONFINE_FAST_DEBUG=spec" }, host,
        { "confine", "--exec", "--permit", box, "--", "true" })
      return status == 0 and "handled" or out:match("declined: ([^\n]*)") or out
    end

    local function lua_runs()
      local out, status = h.capture({ host, "confine", "--exec", "--permit", box, "--", "sh", "-c", "echo ran" })
      assert.are.equal(0, status, out)
      assert.are.equal("ran\n", out)
    end

    it("declines when the file is absent, another key's, or lacks a layer; Lua then runs", function()
      if not layers_hold() then return pending("the ns and landlock layers do not both hold here") end
      lua_runs() -- probes, if it must, and keeps the results
      assert.are.equal("handled", fast_says())
      -- absent
      os.remove(cache)
      assert.matches("no valid probe cache", fast_says())
      lua_runs()
      assert.are.equal("handled", fast_says()) -- control: Lua kept them again
      -- another host state's (its boot line changed)
      local text = assert(h.read(cache))
      h.write(cache, (text:gsub("\nboot=[^\n]*", "\nboot=another-boot", 1)))
      assert.matches("another host state", fast_says())
      lua_runs()
      assert.are.equal("handled", fast_says())
      -- the landlock layer not kept as holding
      text = assert(h.read(cache))
      h.write(cache, (text:gsub("\nholds\tconfinement%.landlock\t[^\n]*", "", 1)))
      assert.matches("does not show both layers", fast_says())
      lua_runs()
      assert.are.equal("handled", fast_says())
    end)
  end)
end)
