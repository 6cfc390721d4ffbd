-- core.cgroup against the real kernel, with real children: `sh -c` processes started
-- here wait on a fifo until core.cgroup has attached them, then fork or allocate. A
-- control runs in the same child, after the denial wherever the denial does not end
-- it. A test whose controller this host does not give to our cgroup is marked
-- pending, never passed.
local core = require "corral.core"
local cgroup = core.cgroup
local h = require "helpers"
local own_pid, child, release = h.own_pid, h.child, h.release

local MiB = 1024 * 1024

local function is_dir(path)
  local f = io.open(path .. "/cgroup.procs")
  if f then f:close() end
  return f ~= nil
end

local function procs(dir)
  local f = assert(io.open(dir .. "/cgroup.procs"))
  local list = {}
  for line in f:lines() do list[#list + 1] = math.tointeger(tonumber(line)) end
  f:close()
  return list
end

local function contains(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

local info = assert(cgroup.info())

describe("core.cgroup", function()
  it("describes the hierarchy this process runs in", function()
    assert.is_string(info.version)
    assert.equal(info.version == "hybrid", info.v1 and info.v2)
    local me, n = own_pid(), 0
    for _, dir in pairs(info.paths) do
      -- Each own path really is this process's cgroup.
      assert.is_true(contains(procs(dir), me), dir)
      n = n + 1
    end
    assert.is_true(n > 0)
  end)

  it("rejects misspelt or negative limits, where a correct table creates", function()
    assert.has_error(function() cgroup.create { memroy = MiB } end)
    assert.has_error(function() cgroup.create { pids = -1 } end)
    assert.has_error(function() cgroup.create { name = "x", cpu_quota_us = "lots" } end)
    local none, err = cgroup.create { name = "a/b" }
    assert.is_nil(none)
    assert.matches("create cgroup", err)
    local ok <close> = assert(cgroup.create {}) -- control, after the refusals
    assert.is_true(#ok:paths() > 0)
  end)

  it("caps the number of processes: N-1 forks succeed, the next is refused", function()
    if not info.controllers.pids then pending("no pids controller beneath our cgroup") return end
    local g <close> = assert(cgroup.create { pids = 4 })
    assert.is_true(g:held().pids)
    local p, pid, f = child("read _ < $F; n=0; while [ $n -lt 10 ]; do " ..
      "sleep 10 >/dev/null 2>&1 & n=$((n+1)); echo $n; done; echo no-cap")
    assert(g:attach(pid))
    release(f)
    local out = p:read("a")
    p:close()
    -- Control: the shell and three children fit under 4; the fourth fork fails.
    assert.equal("1\n2\n3\n", out:match("^[%d\n]*"))
    assert.matches("Cannot fork", out)
    assert.is_nil(out:match("no%-cap"))
    assert.equal(3, g:usage().pids) -- the sleeps; the shell has exited
  end)

  it("caps memory: 128 MiB is OOM-killed, and 16 MiB fits under 32 MiB after it", function()
    if not info.controllers.memory then pending("no memory controller beneath our cgroup") return end
    local g <close> = assert(cgroup.create { memory = 32 * MiB })
    assert.is_true(g:held().memory)
    assert.equal(0, g:usage().oom_kills)
    local p, pid, f = child("read _ < $F; " ..
      "dd if=/dev/zero of=/dev/null bs=128M count=1 2>/dev/null; echo $?; " ..
      "dd if=/dev/zero of=/dev/null bs=16M count=1 2>/dev/null; echo $?")
    assert(g:attach(pid))
    release(f)
    assert.equal("137", p:read("l")) -- 128 + SIGKILL
    assert.equal("0", p:read("l"))   -- control, in the same child after the kill
    p:close()
    local u = g:usage()
    assert.is_true(u.oom_kills >= 1)
    assert.is_true(u.memory_peak >= 16 * MiB and u.memory_peak <= 32 * MiB)
  end)

  it("destroys with live processes inside, removes every directory, and is idempotent", function()
    local g = assert(cgroup.create { name = "corral-" .. own_pid() .. "-spec" })
    local paths = g:paths()
    assert.is_true(#paths > 0)
    local p, pid = child("exec sleep 30")
    assert(g:attach(pid))
    for _, dir in ipairs(paths) do
      assert.is_true(is_dir(dir))
      assert.is_true(contains(procs(dir), pid))
    end
    assert(g:destroy())
    for _, dir in ipairs(paths) do assert.is_false(is_dir(dir), dir) end
    local _, how, code = p:close()
    assert.equal("signal", how)
    assert.equal(9, code)
    assert.is_true(g:destroy()) -- again: nothing to do
    assert.has_error(function() g:usage() end)
  end)

  it("kills every process and keeps the cgroup; <close> removes it", function()
    local paths
    do
      local g <close> = assert(cgroup.create {})
      paths = g:paths()
      local p, pid, f = child("read _ < $F; sleep 30 >/dev/null & sleep 30 >/dev/null & " ..
        "echo started; wait")
      assert(g:attach(pid))
      release(f)
      assert.equal("started", p:read("l"))
      for _, dir in ipairs(paths) do assert.equal(3, #procs(dir), dir) end
      assert(g:kill())
      local _, how = p:close()
      assert.equal("signal", how)
      for _, dir in ipairs(paths) do
        assert.same({}, procs(dir))
        assert.is_true(is_dir(dir))
      end
    end
    for _, dir in ipairs(paths) do assert.is_false(is_dir(dir), dir) end
  end)

  it("leaves nothing behind", function()
    collectgarbage()
    local prefix = "corral-" .. own_pid() .. "-"
    for _, dir in pairs(info.paths) do
      local ls = assert(io.popen("ls -1 " .. dir))
      for name in ls:lines() do
        assert.is_nil(name:find(prefix, 1, true) and name, dir)
      end
      ls:close()
    end
  end)
end)
