-- corral.leftovers: scratch named `<prefix><pid>-XXXXXX`, made in $TMPDIR or /tmp, and the
-- sweep that removes what a dead pid left of it; never a link, nor what another user made.
local core = require "corral.core"
local h = require "helpers"
local leftovers = require "corral.leftovers"

describe("leftovers", function()
  local dir, dead
  before_each(function()
    dir = h.tmpdir("leftovers")
    dead = h.sh("sh -c 'echo $$'"):match("%d+") -- a process that has exited
  end)
  after_each(function() h.rmrf(dir) end)

  it("makes a private directory whose name its pattern matches, capturing this pid", function()
    local made = assert(leftovers.make(dir, ".corral-probe-"))
    local name = made:match("[^/]+$")
    assert.are.equal(dir .. "/" .. name, made)
    assert.are.equal(tostring(core.proc.getpid()), name:match(leftovers.pattern(".corral-probe-")))
    assert.are.equal("dir", core.fs.lstat(made).type)
    assert.are.equal(tonumber("700", 8), core.fs.lstat(made).mode & tonumber("777", 8))
    -- the prefix is matched as written: its "." and "-" are no pattern characters
    assert.is_nil(("xcorral-probe-" .. dead .. "-abc"):match(leftovers.pattern(".corral-probe-")))
    assert.is_nil(("corral-probe-" .. dead .. "-abc"):match(leftovers.pattern(".corral-probe-")))
  end)

  it("sweeps a dead pid's trees of its prefix, not a link to one, not a live pid's, nor another prefix's", function()
    local outside = h.tmpdir("leftovers-outside")
    h.write(outside .. "/keep", "keep")
    local stale = dir .. "/corral-x-" .. dead .. "-a1"
    assert(core.fs.mkdir(stale, tonumber("700", 8)))
    assert(os.execute("ln -s " .. h.quote(outside) .. " " .. h.quote(stale .. "/link")))
    assert(os.execute("ln -s " .. h.quote(outside) .. " " .. h.quote(dir .. "/corral-x-" .. dead .. "-l1")))
    local live = assert(leftovers.make(dir, "corral-x-"))
    assert(core.fs.mkdir(dir .. "/corral-y-" .. dead .. "-b1", tonumber("700", 8)))
    assert.are.equal(1, leftovers.sweep_own(dir, "corral-x-"))
    local left = core.fs.listdir(dir)
    local kept = h.read(outside .. "/keep")
    h.rmrf(outside)
    table.sort(left)
    local want = { "corral-x-" .. dead .. "-l1", live:match("[^/]+$"), "corral-y-" .. dead .. "-b1" }
    table.sort(want)
    assert.are.same(want, left)
    assert.are.equal("keep", kept) -- the link inside the stale tree was removed, never followed
  end)

  it("removes a file of ours, but not a link nor a directory under a file's name", function()
    h.write(dir .. "/target", "t")
    assert(os.execute("ln -s target " .. h.quote(dir .. "/link")))
    assert(core.fs.mkdir(dir .. "/adir", tonumber("700", 8)))
    assert.is_false(leftovers.remove_own_file(dir .. "/link"))
    assert.is_false(leftovers.remove_own_file(dir .. "/adir"))
    assert.is_true(leftovers.remove_own_file(dir .. "/target")) -- control: a plain file of ours goes
    assert.is_nil(core.fs.lstat(dir .. "/target"))
    assert.is_truthy(core.fs.lstat(dir .. "/link"))
  end)

  it("puts scratch in $TMPDIR when it is absolute, else /tmp", function()
    local function base(env)
      local out = h.sh(env .. " " .. h.quote(h.host) .. " -e " .. h.quote("print(require('corral.leftovers').base())"))
      return (out:gsub("\n$", ""))
    end
    assert.are.equal("/tmp", base("env -u TMPDIR"))
    assert.are.equal("/tmp", base("TMPDIR=relative"))
    assert.are.equal(dir, base("TMPDIR=" .. h.quote(dir .. "//")))
  end)

  it("puts sweeps off while a put_off scope is open, runs them once at run or close", function()
    local ran = {}
    local function sweep(name) return function() ran[#ran + 1] = name end end
    do
      local scope <close> = leftovers.put_off()
      leftovers.sweep_soon(sweep("a"))
      leftovers.sweep_soon(sweep("b"))
      assert.are.same({}, ran) -- put off
      scope.run()
      assert.are.same({ "a", "b" }, ran)
      scope.run()
      assert.are.same({ "a", "b" }, ran) -- once
    end
    do
      local scope <close> = leftovers.put_off() -- luacheck: ignore
      leftovers.sweep_soon(sweep("c"))
      assert.are.same({ "a", "b" }, ran)
    end
    assert.are.same({ "a", "b", "c" }, ran) -- a scope that ends without run runs them
    leftovers.sweep_soon(sweep("d")) -- control: no scope open, it runs at once
    assert.are.same({ "a", "b", "c", "d" }, ran)
  end)

  it("puts off sweep_own_soon too, then sweeps each prefix of a directory at run", function()
    local a, b = dir .. "/corral-a-" .. dead .. "-x1", dir .. "/corral-b-" .. dead .. "-x2"
    local live = dir .. "/corral-a-" .. core.proc.getpid() .. "-x3" -- this process's own
    for _, d in ipairs({ a, b, live }) do assert(core.fs.mkdir(d, tonumber("700", 8))) end
    local scope <close> = leftovers.put_off()
    leftovers.sweep_own_soon(dir, "corral-a-")
    leftovers.sweep_own_soon(dir, "corral-b-")
    assert.is_truthy(core.fs.lstat(a) and core.fs.lstat(b)) -- put off
    scope.run()
    assert.is_nil(core.fs.lstat(a))
    assert.is_nil(core.fs.lstat(b))
    assert.is_truthy(core.fs.lstat(live)) -- control: a live pid's stays
  end)
end)
