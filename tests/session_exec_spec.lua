-- `corral exec`, the C client of a live sandbox's keeper (core/host/session_exec.c):
-- its arguments refused naming the flag, no keeper, a runtime directory others may
-- enter; then, against a real keeper (`corral create`), status, stdio, signals, a
-- terminal of the sandbox's own, and a killed client's command gone.
local h = require "helpers"

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
    { { "nobox", "--env", "CORRAL_EXEC_UNSET_VAR", "--", "true" }, "--env", { "nobox", "--env", "PATH", "--", "true" } },
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
