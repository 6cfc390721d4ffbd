-- Shared test helpers: temporary trees, running commands, reading results.
-- Everything here runs real processes; nothing mocks the kernel.
local core = require "corral.core"
local shell = require "corral.shell"

local M = {}

M.host = os.getenv("CORRAL_HOST") or (os.getenv("PWD") .. "/build/corral")

--- A fresh private directory, resolved (so it compares equal to what corral resolves).
function M.tmpdir(tag)
  local d = assert(core.mkdtemp("/tmp/corral-test-" .. (tag or "") .. "-"))
  return assert(core.resolve_path(d))
end

function M.rmrf(path)
  if path and path:match("^/tmp/corral%-") then os.execute("rm -rf " .. shell.quote(path)) end
end

function M.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

function M.read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function M.sh(script, ...)
  local out, status = shell.capture({ "sh", "-c", script, "sh", ... })
  return out, status
end

--- Runs a launch spec as a caller would: working directory spec.cd, environment
-- exactly spec.env, program spec.cmd with spec.args. `redirect` is appended to the
-- shell line (e.g. "3</some/dir"). Returns output (stdout+stderr) and exit status.
function M.run_spec(spec, redirect)
  local env = { "env", "-i" }
  for _, pair in ipairs(spec.env) do env[#env + 1] = pair[1] .. "=" .. pair[2] end
  local argv = { spec.cmd }
  for _, a in ipairs(spec.args) do argv[#argv + 1] = a end
  local line = "cd " .. shell.quote(spec.cd) .. " && " .. shell.join(env) .. " " ..
    shell.join(argv) .. " " .. (redirect or "") .. " 2>&1"
  local p = assert(io.popen(line, "r"))
  local out = p:read("a")
  local _, how, code = p:close()
  if how == "signal" then code = 128 + code end
  return out, code
end

--- Runs argv (a list) and returns output and status.
M.capture = shell.capture

--- Runs the corral host with the given arguments.
function M.corral(...)
  return shell.capture({ M.host, ... })
end

M.PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

--- A TCP port on 127.0.0.1 that nothing listens on now (read from /proc/net/tcp).
function M.free_port()
  local used = {}
  for _, f in ipairs({ "/proc/net/tcp", "/proc/net/tcp6" }) do
    for port in (M.read(f) or ""):gmatch(":(%x%x%x%x) %x+:%x+ 0A") do used[tonumber(port, 16)] = true end
  end
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 100000)
  for _ = 1, 100 do
    local p = math.random(20000, 60000)
    if not used[p] then return p end
  end
  error("no free port found")
end

--- Waits until cond() is true, for at most `seconds`.
function M.wait_for(cond, seconds)
  local deadline = os.time() + (seconds or 5)
  while os.time() <= deadline do
    if cond() then return true end
    os.execute("sleep 0.02")
  end
  return cond()
end

return M
