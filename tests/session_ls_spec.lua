-- `corral ls` over live keepers (docs/sessions.md): every keeper asked at once with the
-- cheap `status` op, whose numbers are info's; those that never answer (accepting or
-- not) cost one bounded wait and are listed as not answering, while the live session
-- beside them is listed (the control); once they are gone, their sockets are swept and
-- they are listed no more. A keeper of an older corral, without status, is asked info.
-- Another uid's ls lists none of root's. Run `make` first.
local core = require "corral.core"
local h = require "helpers"
local json = require "dkjson"

local is_root = core.proc.geteuid() == 0

local function defer(fn) h.defer(finally, fn) end

-- ls --json as rows by id, and how long it took.
local function ls(argv)
  local t0 = core.clock.monotime()
  local out, status = h.capture(argv or { h.host, "ls", "--json" })
  local took = core.clock.monotime() - t0
  assert.are.equal(0, status, out)
  local rows = {}
  for _, r in ipairs(json.decode(out:match("%b[]")) or {}) do rows[r.id] = r end
  return rows, took, out
end

local function exists(path) return core.fs.lstat(path) ~= nil end

-- A socket at `path` that never answers (a stuck keeper): one that accepts every
-- connection, or (`full`) one that accepts none, its backlog filled by its own
-- connections. Its process's pid, once it listens.
local function stuck_keeper(path, full)
  local p = assert(io.popen("/usr/bin/python3 -c " .. h.quote([[
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
held = []
if sys.argv[2] == "full":
    s.listen(0)
    while True:
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(sys.argv[1])
        except BlockingIOError:
            break
        held.append(c)
    while True:
        time.sleep(60)
s.listen(16)
while True:
    held.append(s.accept()[0])
]]) .. " " .. h.quote(path) .. (full and " full" or " accept") .. " >/dev/null 2>&1 & echo $!"))
  local pid = p:read("l")
  p:close()
  assert(h.wait_for(function() return exists(path) end, 5), "the stuck keeper did not listen")
  return pid
end

describe("corral ls", function()
  local id = "ls-spec-" .. h.own_pid()
  local created -- `{output, status}` of its create, made by the first test that needs it

  teardown(function()
    if created then h.corral("rm", id) end
  end)

  -- Whether the session is live (made now by the first test); pending without root.
  local function need_root()
    if is_root then
      created = created or { h.corral("create", id, "--allow", "ok.test:443") }
      assert.are.equal(0, created[2], created[1])
      return true
    end
    pending("the sessions ls lists are built as root here (native, the keeper's cgroups)")
    return false
  end

  it("status answers info's numbers, then closes the connection", function()
    if not need_root() then return end
    local control = require "corral.control"
    local path = control.dir() .. "/session-" .. id .. ".sock"
    local fd <close> = assert(core.unix.connect(path, 2))
    assert(core.sock.send(fd, '{"op":"status"}\n'))
    local got = ""
    local deadline = core.clock.monotime() + 5
    while core.clock.monotime() < deadline do
      local data = core.sock.recv(fd, 65536, deadline - core.clock.monotime())
      if not data or data == "" then break end
      got = got .. data
    end
    -- the whole answer, then the end of the connection (not a wait for another request)
    assert.matches("^[^\n]+\n$", got)
    local status = json.decode(got).result
    local info = assert(control.request(path, { op = "info" }))
    assert.are.equal(info.pid, status.pid)
    assert.are.equal(info.mechanism, status.mechanism)
    assert.are.equal(info.started, status.started)
    assert.are.equal(info.usage.pids, status.processes)
    assert.are.equal(2, status.processes) -- the sandbox's init and its waiting process
    -- resident memory moves a little between two readings; the same order of size
    local memory = info.usage.memory_current or info.usage.memory_rss
    assert.truthy(math.abs(status.memory - memory) < memory / 4, status.memory .. " vs " .. memory)
    assert.are.same({ allow = #info.egress.allow, connections = info.egress.connections,
      allowed = info.egress.allowed, denied = info.egress.denied }, status.egress)
  end)

  it("keepers that accept (or not) and never answer: ls answers within its bound and marks them; once gone, swept",
    function()
      if not need_root() then return end
      local bound = 2 -- ls's usage: a keeper that has not answered within 2 s
      local stuck = {}
      for i = 1, 3 do
        local sid = id .. "-stuck" .. i
        local path = require("corral.control").dir() .. "/session-" .. sid .. ".sock"
        -- the third accepts nothing: its connect cannot complete
        stuck[sid] = { path = path, pid = stuck_keeper(path, i == 3) }
        defer(function()
          os.execute("kill " .. stuck[sid].pid .. " 2>/dev/null")
          os.remove(path)
        end)
      end
      local rows, took = ls()
      -- three that never answer cost one wait, not three
      assert.truthy(took < bound + 1.5, string.format("ls took %.2f s with a bound of %g s", took, bound))
      for sid, s in pairs(stuck) do
        assert.truthy(rows[sid], sid .. " is not listed")
        assert.are.equal("session", rows[sid].kind)
        assert.is_string(rows[sid].error) -- why: no answer in time, or no connection
        assert.is_nil(rows[sid].pid)
        assert.truthy(exists(s.path), "a live keeper's socket was swept")
      end
      -- the control: the live session beside them answered in the same ls
      assert.truthy(rows[id], id .. " is not listed")
      assert.is_nil(rows[id].error)
      assert.are.equal(1, rows[id].egress.allow)
      local out = h.corral("ls")
      for sid in pairs(stuck) do
        assert.matches(sid:gsub("%-", "%%-") .. "%s+session%s+%-%s+%-%s+%-%s+%(no answer within 2 s%)", out)
      end
      -- gone (nothing listens at their sockets any more): swept, not listed; the live one is
      for _, s in pairs(stuck) do os.execute("kill " .. s.pid) end
      assert(h.wait_for(function()
        for _, s in pairs(stuck) do
          if exists("/proc/" .. s.pid) then return false end
        end
        return true
      end, 5), "the stuck keepers did not end")
      rows = ls()
      for sid, s in pairs(stuck) do
        assert.is_nil(rows[sid], sid .. " is still listed")
        assert.is_false(exists(s.path), s.path .. " was not swept")
      end
      assert.truthy(rows[id], id .. " is not listed")
    end)

  it("a keeper from before status (it answers unknown op) is listed from its info", function()
    if not need_root() then return end
    local sid = id .. "-older"
    local path = require("corral.control").dir() .. "/session-" .. sid .. ".sock"
    -- what an older keeper answers: status is no op of its, info is
    local p = assert(io.popen("/usr/bin/python3 -c " .. h.quote([[
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(16)
info = {"id": "x", "pid": os.getpid(), "mechanism": "native", "started": int(time.time()),
        "usage": {"pids": 3, "memory_rss": 1048576}, "tenant_pids": [],
        "egress": {"allow": ["a.test:443", "b.test:443"], "connections": 0, "allowed": 4, "denied": 5}}
while True:
    c = s.accept()[0]
    op = json.loads(c.makefile().readline())["op"]
    answer = {"ok": True, "result": info} if op == "info" else {"ok": False, "error": "unknown op " + op}
    c.sendall((json.dumps(answer) + "\n").encode())
    c.close()
]]) .. " " .. h.quote(path) .. " >/dev/null 2>&1 & echo $!"))
    local pid = p:read("l")
    p:close()
    defer(function()
      os.execute("kill " .. pid .. " 2>/dev/null")
      os.remove(path)
    end)
    assert(h.wait_for(function() return exists(path) end, 5), "the older keeper did not listen")
    local rows = ls()
    local row = assert(rows[sid], sid .. " is not listed")
    assert.are.same({ 3, 1048576, 2, 4, 5, math.tointeger(tonumber(pid)) }, { row.processes, row.memory,
      row.egress.allow, row.egress.allowed, row.egress.denied, math.tointeger(row.pid) })
    -- the control: the session of this corral, asked status, in the same ls
    assert.are.equal(1, rows[id].egress.allow)
  end)

  it("another uid's ls lists none of root's sessions; root's lists it", function()
    if not need_root() then return end
    local why = h.test_user_missing()
    if why then return pending(why) end
    local rows, _, out = ls(h.as_test_user({ h.host, "ls", "--json" }))
    assert.is_nil(rows[id], out)
    assert.truthy(ls()[id], id .. " is not listed by its owner")
  end)
end)
