-- core.seccomp: the tenant filter installed by a Lua child process, observed through the
-- real programs that child runs afterwards (the filter is inherited across fork and
-- exec). The same child script runs once without the filter as the control, and the
-- filtered child's allowed calls run after its denied ones.
local core = require "corral.core"
local h = require "helpers"

-- Under `make test` / `make asan` the runner names the host; by hand, stock lua5.4 loads
-- ./corral/core.so.
local LUA = os.getenv("CORRAL_HOST") or "lua5.4"

local CHILD = [[
package.cpath = "./?.so;" .. package.cpath
local core = require "corral.core"
if arg[1] == "filtered" then
  local ok, err = core.seccomp.install_tenant()
  print("install", ok and "ok" or err)
end
local function run(name, cmd)
  local p = io.popen("LC_ALL=C " .. cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  print(name, ok and "ok" or out:match("Operation not permitted") and "EPERM" or out)
end
run("userns", "unshare --user true")
run("mount", "unshare --mount --propagation private true")
-- the controls, after the denied calls
local f = io.open("/proc/self/status")
print("open", f and "ok" or "fail")
run("uts", "unshare --uts true")
]]

local function run_child(mode)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(CHILD)
  f:close()
  local p = assert(io.popen(LUA .. " " .. path .. " " .. mode .. " 2>&1"))
  local out = p:read("a")
  local ok, how, code = p:close()
  os.remove(path)
  local results = {}
  for k, v in out:gmatch("(%w+)\t([^\n]*)") do results[k] = v end
  return results, ok, how, code, out
end

describe("core.seccomp", function()
  it("exports the tenant program as classic BPF, the same bytes every time", function()
    local a = assert(core.seccomp.tenant_program())
    local b = assert(core.seccomp.tenant_program())
    assert.is_true(#a > 0)
    assert.equal(0, #a % 8) -- struct sock_filter is 8 bytes
    assert.equal(a, b)
  end)

  it("denies user namespaces and mounts to a child, which keeps running", function()
    local plain, pok, _, _, pout = run_child("plain")
    assert.is_true(pok, pout)
    -- Control: without the filter, root does all three.
    assert.same({ open = "ok", uts = "ok", userns = "ok", mount = "ok" }, plain)

    local filtered, fok, how, code, fout = run_child("filtered")
    assert.is_true(fok, ("%s %s\n%s"):format(how, code, fout))
    -- Same child with the filter: it runs to the end, opens files, unshares UTS (an
    -- allowed clone flag), and gets EPERM — not death — for the denied calls.
    assert.same({ install = "ok", open = "ok", uts = "ok", userns = "EPERM", mount = "EPERM" },
      filtered)
    assert.is_true(h.in_order(fout, { "userns\tEPERM", "mount\tEPERM", "open\tok", "uts\tok" }), fout)
  end)
end)
