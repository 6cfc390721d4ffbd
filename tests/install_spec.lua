-- The installed layout: `make install` stages a tree a package could ship, and an
-- install under /usr/local runs from inside its own confinements, where the build
-- tree's binary is invisible. Each refusal is followed by its control in the same run.
local h = require "helpers"

local BUILD = os.getenv("CORRAL_BUILD") or "build"

local function make_install(vars)
  local out, status = h.capture({ "make", "-s", "install", "BUILD=" .. BUILD, table.unpack(vars) })
  assert.are.equal(0, status, out)
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

describe("make install", function()
  it("stages binary, Lua modules, the C module, man pages for corral(1) and each command, docs", function()
    local dest = h.tmpdir("destdir")
    make_install({ "DESTDIR=" .. dest, "PREFIX=/usr" })
    for _, f in ipairs({ "/usr/bin/corral", "/usr/bin/corral-host", "/usr/bin/corral-exec-confined",
      "/usr/lib/lua/5.4/corral/core.so",
      "/usr/lib/lua/5.4/corral/sign.so",
      "/usr/share/lua/5.4/corral/cli.lua", "/usr/share/lua/5.4/corral/mechanism/native.lua",
      "/usr/share/man/man1/corral.1", "/usr/share/doc/corral/README.md",
      "/usr/share/doc/corral/boundary.md" }) do
      assert.truthy(exists(dest .. f), f .. " missing")
    end
    -- every command `corral help` lists has its page
    local list = h.corral("help")
    local n = 0
    for name in list:gmatch("\n  ([%w-]+) ") do
      n = n + 1
      assert.truthy(exists(dest .. "/usr/share/man/man1/corral-" .. name .. ".1"), name)
    end
    assert.truthy(n >= 5, list)
    -- the staged binary finds its own modules, with no build tree on any path
    local out, status = h.capture({ "env", "-i", dest .. "/usr/bin/corral", "help", "confine" })
    assert.are.equal(0, status, out)
    assert.matches("corral confine", out)
    -- and so does corral-runtime, the host under that name (a link to it, not to the
    -- front: no exec between an engine and the runtime), with its page
    assert.are.equal("corral-host\n", h.sh("readlink " .. h.quote(dest .. "/usr/bin/corral-runtime")))
    out, status = h.capture({ "env", "-i", dest .. "/usr/bin/corral-runtime", "--help" })
    assert.are.equal(0, status, out)
    assert.matches("^usage: corral%-runtime", out)
    assert.truthy(exists(dest .. "/usr/share/man/man1/corral-runtime.1"))
    h.rmrf(dest)
  end)
end)

describe("installed under /usr/local #root", function()
  local root, box
  local PREFIX = "/usr/local"
  local BIN = PREFIX .. "/bin/corral"

  setup(function()
    -- never over another install: this test owns /usr/local/bin/corral only when absent
    if exists(BIN) then return end
    make_install({ "PREFIX=" .. PREFIX })
    root = h.tmpdir("installed")
    box = root .. "/box"
    assert(os.execute("mkdir -p " .. box .. "/inner && chmod 755 " .. root))
    h.write(box .. "/outer-file", "OUTER-DATA\n")
    h.write(box .. "/inner/f", "INNER-DATA\n")
  end)

  teardown(function()
    if root then
      h.forget_probe_cache(BIN) -- the installed corral keeps a cache file of its own
      h.capture({ "make", "-s", "uninstall", "BUILD=" .. BUILD, "PREFIX=" .. PREFIX })
      h.rmrf(root)
    end
  end)

  local function confined(...)
    return h.capture({ "env", "-i", "PATH=" .. h.PATH, BIN, "confine", "--permit", box, "--exec",
      "--", ... })
  end

  it("names the installed wrapper program, beside the binary", function()
    if not root then return pending(BIN .. " exists already") end
    local out, status = h.capture({ BIN, "confine", "--json", "--permit", box, "--", "true" })
    assert.are.equal(0, status, out)
    assert.matches('"cmd"%s*:%s*"' .. (BIN .. "-exec-confined"):gsub("%p", "%%%0") .. '"', out)
  end)

  it("runs corral from inside its own confinement", function()
    if not root then return pending(BIN .. " exists already") end
    local out, status = confined(BIN, "-v")
    assert.are.equal(0, status, out)
    assert.matches("^corral %d", out)
  end)

  it("nests corral confine with a narrower --permit; --permit / is refused, then the control", function()
    if not root then return pending(BIN .. " exists already") end
    local inner = box .. "/inner"
    local nest = BIN .. " confine --exec --permit "
    local out, status = confined("sh", "-c", table.concat({
      h.attempt_then_control(nest .. inner .. " -- cat " .. box .. "/outer-file",
        nest .. inner .. " -- cat " .. inner .. "/f && echo nested-ok-1"),
      h.attempt_then_control(nest .. "/ -- cat " .. box .. "/outer-file",
        nest .. inner .. " -- cat " .. inner .. "/f && echo nested-ok-2"),
    }, "; "))
    local rest = out
    for i = 1, 2 do
      local rc, control, attempt = h.after_attempt(rest, "INNER%-DATA\nnested%-ok%-" .. i)
      h.assert_refused(rc, out)
      assert.is_nil(attempt:find("OUTER-DATA", 1, true), out)
      rest = control:sub(select(2, control:find("nested%-ok%-" .. i)) + 1)
    end
    assert.are.equal(0, status, out)
  end)
end)
