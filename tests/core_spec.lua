-- corral.core's surface: one namespace per C module, and the constants the Lua side
-- reads from C instead of restating them.
local core = require "corral.core"
local h = require "helpers"

describe("corral.core", function()
  it("holds only namespaces (one per C module) and its version", function()
    local tables = 0
    for name, v in pairs(core) do
      if name == "_VERSION" then
        assert.is_string(v)
      else
        assert.are.equal("table", type(v), "core." .. name .. " is not a namespace")
        tables = tables + 1
      end
    end
    assert.truthy(tables > 20) -- control: the modules are there
    assert.is_function(core.sock.listen)
  end)

  it("fills each namespace itself: functions or constants, never a table named after it", function()
    for name, ns in pairs(core) do
      if type(ns) == "table" then
        assert.is_nil(rawget(ns, name), "core." .. name .. "." .. name .. ": a module nested in its own namespace")
        local members = 0
        for _ in pairs(ns) do members = members + 1 end
        assert.truthy(members > 0, "core." .. name .. " is empty")
      end
    end
  end)

  it("exports the exit statuses corral gives of its own (core/lib/exitcodes.h)", function()
    assert.are.same({ USAGE = 2, CANNOT = 3, START_REFUSED = 120, MEMORY = 121, TEARDOWN = 122, WALL = 124,
                      SETUP = 125, NOEXEC = 126, NOTFOUND = 127 }, core.exit)
  end)

  it("makes pipes whose ends are CLOEXEC and whose read end never blocks", function()
    local rd, wr = assert(core.io.pipe())
    for _, fd in ipairs({ rd, wr }) do
      local info = assert(io.open("/proc/self/fdinfo/" .. fd:fileno())):read("a")
      local flags = tonumber(info:match("flags:%s*(%d+)"), 8)
      assert.are.equal(tonumber("2000000", 8), flags & tonumber("2000000", 8)) -- O_CLOEXEC
    end
    local nothing, _, errno = core.io.read(rd, 16)
    assert.is_nil(nothing)
    assert.are.equal(core.errno.EAGAIN, errno) -- empty: no wait
    assert.are.equal(5, core.io.write(wr, "hello"))
    assert.are.equal("hello", core.io.read(rd, 16)) -- control: what was written is read
    wr:close()
    assert.are.equal("", core.io.read(rd, 16)) -- every writer gone: the end
    rd:close()
  end)

  it("writes to a reader gone as EPIPE, never SIGPIPE: a pipe, and a socket its peer reset", function()
    -- in a child host, so that a SIGPIPE ends it, not this suite; each write first reaches
    -- a reader (the control), then the reader goes
    local out, status = h.capture({ h.host, "-e", [[
      local core = require "corral.core"
      local rd, wr = assert(core.io.pipe())
      assert(core.io.write(wr, "x") == 1)
      rd:close()
      local n, _, errno = core.io.write(wr, "x")
      print("pipe", n, errno == core.errno.EPIPE)
      local lfd, port = assert(core.sock.listen("127.0.0.1", 0))
      local c = assert(core.sock.connect("127.0.0.1", port, 1))
      local s = assert(core.sock.accept(lfd, 1))
      assert(core.io.write(c, "x") == 1)
      s:close() -- with the byte unread: a reset
      for _ = 1, 20 do
        n, _, errno = core.io.write(c, "x")
        if not n then break end
        core.io.poll({}, 0.01)
      end
      print("socket", n, errno == core.errno.EPIPE or errno == core.errno.ECONNRESET)
      print("alive")]] })
    assert.are.equal(0, status, out)
    assert.matches("pipe\tnil\ttrue\n", out, 1, true)
    assert.matches("socket\tnil\ttrue\n", out, 1, true)
    assert.matches("alive", out)
  end)

  it("exports the errno numbers and the egress mark the Lua side compares with", function()
    assert.are.equal(17, core.errno.EEXIST) -- Linux's errno.h
    assert.are.equal(11, core.errno.EAGAIN)
    assert.are.equal(110, core.errno.ETIMEDOUT)
    assert.are.equal(core.nft.DEFAULT_MARK, require("corral.egress.plane").MARK)
    assert.is_true(math.type(core.nft.MAX_PORT_RANGES) == "integer" and core.nft.MAX_PORT_RANGES > 0)
  end)

  it("raises a bad argument through luaL_argerror (\"bad argument #\"), and a good one still works", function()
    local ok, err = pcall(core.io.poll, { {} }, 0)
    assert.is_false(ok)
    assert.matches("bad argument #1 .*entry 1: expected an fd", err)
    ok, err = pcall(core.tier.run, { path = "/bin/true", argv = 5 })
    assert.is_false(ok)
    assert.matches("bad argument #1 .*argv must be a list", err)
    local many = {}
    for i = 1, 1000 do many[i] = "/" end
    ok, err = pcall(core.vm.eval, "return 1", { read = many })
    assert.is_false(ok)
    assert.matches("bad argument #2 .*read grants", err)
    -- controls, after the raises: a good list polls, a closed fd is skipped
    local closed = assert(core.sock.listen("127.0.0.1", 0))
    closed:close()
    assert.are.same({}, core.io.poll({ closed }, 0))
  end)

  it("polls a corral object's own fd read in C: a process's pidfd, a relay loop's epoll fd", function()
    local relay = assert(core.relay.new())
    assert.are.same({}, core.io.poll({ relay }, 0)) -- idle: not readable
    local proc, pipe = core.spawn.fork()
    if not proc then core.proc.exit(0) end
    pipe:close()
    assert.are.same({ 2 }, core.io.poll({ relay, proc }, 5)) -- the exited child's pidfd
    assert.are.equal(0, (proc:wait(5)))
    relay:close()
    assert.are.same({}, core.io.poll({ relay }, 0)) -- a closed loop reads -1 and is skipped
  end)

  it("lists a directory sorted in byte order, without . and ..", function()
    local dir = h.tmpdir("listdir")
    for _, name in ipairs({ "b", "a1", "C", "a", ".hidden" }) do h.write(dir .. "/" .. name, "") end
    local names = core.fs.listdir(dir)
    h.rmrf(dir)
    assert.are.same({ ".hidden", "C", "a", "a1", "b" }, names)
    local _, err, errno = core.fs.listdir(dir) -- gone: the failure protocol
    assert.matches("No such file", err)
    assert.are.equal(core.errno.ENOENT, errno)
  end)
end)
