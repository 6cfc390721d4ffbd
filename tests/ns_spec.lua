-- core.ns against the real kernel: namespace fds of this process and of children started
-- here (sh, unshare(1)), compared, entered and left; id maps written for a child in a
-- new user namespace. Children wait on a fifo so that every "before" is observed first.
local core = require "corral.core"
local ns = core.ns

local h = require "helpers"
local child, release = h.child, h.release

local function finish(p, pid, f)
  os.execute("kill " .. pid .. " 2>/dev/null")
  p:close()
  os.remove(f)
end

-- Runs fn and always brings this process back to the network namespace it started in,
-- so a failure cannot leave the rest of the suite in a namespace without a network.
local function returning_home(fn)
  local home = assert(ns.open("self", "net"))
  local ok, err = pcall(fn, home)
  assert(ns.setns(home, "net"))
  home:close()
  if not ok then error(err, 0) end
end

describe("core.ns", function()
  it("opens namespace fds and describes them", function()
    local fd <close> = assert(ns.open("self", "net"))
    local info = assert(ns.info(fd))
    assert.equal("net", info.kind)
    assert.equal(ns.CLONE_NEWNET, info.nstype)
    assert.is_true(info.inode > 0)
    local user <close> = assert(ns.open("self", "user"))
    assert.equal("user", assert(ns.info(user)).kind)
    assert.is_false(ns.same(fd, user))
  end)

  it("raises on a bad kind or pid, where a good one opens", function()
    assert.has_error(function() ns.open("self", "network") end)
    assert.has_error(function() ns.open("self", "pid_for_children") end)
    assert.has_error(function() ns.open("me", "net") end)
    assert.has_error(function() ns.open(0, "net") end)
    -- An OS failure is a return, not a raise: no such process.
    local fd, err, code = ns.open(2 ^ 22 + 1, "net")
    assert.is_nil(fd)
    assert.matches("open namespace", err)
    assert.equal(core.errno.ENOENT, code)
    local ok <close> = assert(ns.open("self", "uts")) -- control, after the refusals
    assert.has_error(function() ns.setns(ok, "utsname") end)
    assert(ns.setns(ok, "uts")) -- control: the same fd with its right kind enters
  end)

  it("compares a child's network namespace before and after it unshares", function()
    local p, pid, f = child("read _ < $F; exec unshare --net sh -c 'echo done; exec sleep 10'")
    local self <close> = assert(ns.open("self", "net"))
    local before <close> = assert(ns.open(pid, "net"))
    assert.is_true(ns.same(self, before)) -- control: two processes, one namespace
    release(f)
    assert.equal("done", p:read("l"))
    local after <close> = assert(ns.open(pid, "net"))
    assert.is_false(ns.same(self, after))
    assert.is_false(ns.same(before, after))
    finish(p, pid, f)
  end)

  it("enters a child's network namespace and comes back", function()
    local p, pid, f = child("read _ < $F; exec unshare --net sh -c 'echo done; exec sleep 10'")
    release(f)
    assert.equal("done", p:read("l"))
    local theirs <close> = assert(ns.open(pid, "net"))
    returning_home(function(home)
      assert.is_false(ns.same(home, theirs))
      assert(ns.setns(theirs, "net"))
      local now <close> = assert(ns.open("self", "net"))
      assert.is_true(ns.same(now, theirs))
      assert(ns.setns(home)) -- kind optional
      local back <close> = assert(ns.open("self", "net"))
      assert.is_true(ns.same(back, home))
    end)
    finish(p, pid, f)
  end)

  it("unshares this process's network namespace (and returns to the old one)", function()
    returning_home(function(home)
      local fd, err, code = ns.unshare(-1 & 0x7fffffff)
      assert.is_nil(fd, "unshare with every flag must fail")
      assert.equal(core.errno.EINVAL, code, err)
      assert(ns.unshare(ns.CLONE_NEWNET))
      local now <close> = assert(ns.open("self", "net"))
      assert.is_false(ns.same(now, home))
    end)
  end)

  it("writes id maps that make a child root in its user namespace", function()
    local p, pid, f = child("exec unshare --user sh -c 'id -u; read _ < $F; id -u; id -g'")
    local overflow = io.open("/proc/sys/kernel/overflowuid"):read("l")
    assert.equal(overflow, p:read("l")) -- control: unmapped, not root
    assert.has_error(function() ns.write_maps(pid, { { 0, 0, 0 } }) end)
    assert.has_error(function() ns.write_maps(pid, { { inside = 0, outside = -1, count = 1 } }) end)
    assert(ns.write_maps(pid, { { 0, 0, 1 } }, { { inside = 0, outside = 0, count = 1 } }))
    release(f)
    assert.equal("0", p:read("l"))
    assert.equal("0", p:read("l"))
    finish(p, pid, f)
  end)
end)
