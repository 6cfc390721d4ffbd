-- Named test network namespaces (corral-t-<pid>-<n>), each recorded before anything can
-- fail so that cleanup() removes every one, even after a failed test.
local rtnl = require("corral.core").rtnl

local M = {}

--- Runs a shell command; returns success and its output (stdout and stderr).
function M.run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return ok == true, out
end

local own_pid = require("helpers").own_pid

M.is_root = select(2, M.run("id -u")):match("^0") ~= nil

local created, serial = {}, 0

--- A new named netns: its name and an fd on it.
function M.netns()
  serial = serial + 1
  local name = ("corral-t-%s-%d"):format(own_pid(), serial)
  local entry = { name = name }
  created[#created + 1] = entry
  assert(M.run("ip netns add " .. name))
  entry.fd = assert(rtnl.netns_open("/run/netns/" .. name))
  return name, entry.fd
end

--- Removes every netns made by netns().
function M.cleanup()
  for _, e in ipairs(created) do
    if e.fd then e.fd:close() end
    M.run("ip netns del " .. e.name)
  end
  created = {}
end

return M
