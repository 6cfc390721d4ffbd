--- A confined agent's `corral run|create|exec|rm|ls|policy`, sent to the broker of the
-- `corral confine --broker` that confines it (corral.broker.server has the wire).
--
-- CORRAL_BROKER is heeded only inside a confinement: this process has no_new_privs set
-- (the wrapper sets it; an operator's shell does not), and the socket's listener is
-- outside this process's pid namespace (the namespace layer) or one of its ancestors
-- (Landlock alone): the process that confined it. A name in the environment alone
-- proves neither, so an operator whose environment carries one runs the command here.
-- @module corral.broker.client
local core = require "corral.core"
local file = require "corral.file"
local json = require "corral.json"
local proctree = require "corral.proctree"

local M = {}

--- The subcommands a broker serves.
M.SUBCOMMANDS = { run = true, create = true, exec = true, rm = true, ls = true, policy = true }

local SIGNALS = { "INT", "TERM", "HUP", "QUIT", "USR1", "USR2" }
-- Variables a tenant's environment starts from (corral run's base), sent with the
-- ones the request's --env flags name.
local BASE_ENV = { "PATH", "HOME", "LANG", "TERM", "TZ" }

--- Whether this process runs confined (no_new_privs, which the confinement wrapper sets).
-- @treturn boolean
function M.confined()
  local status = file.read("/proc/self/status") or ""
  return status:match("\nNoNewPrivs:%s*1") ~= nil
end

-- Whether `pid` is one of this process's ancestors.
local function ancestor(pid)
  local p = core.proc.getpid()
  for _ = 1, 4096 do
    p = proctree.parent(p)
    if not p or p < 1 then return false end
    if p == pid then return true end
  end
  return false
end

-- The variables named by --env (a name alone: its value is ours to send) before `--`.
local function env_names(argv)
  local names = {}
  for _, k in ipairs(BASE_ENV) do names[#names + 1] = k end
  local i = 2
  while i <= #argv and argv[i] ~= "--" do
    local v = argv[i]:match("^%-%-env=(.*)$")
    if argv[i] == "--env" then
      i = i + 1
      v = argv[i]
    end
    if v and v:match("^[%a_][%w_]*$") then names[#names + 1] = v end
    i = i + 1
  end
  local env = {}
  for _, k in ipairs(names) do env[k] = os.getenv(k) end
  return env
end

local function say(sub, msg)
  io.stderr:write("corral ", sub, ": ", msg, "\n")
end

-- Relays the request's answers and our signals until it ends; its exit status.
local function follow(sub, fd)
  local signals = core.signal.fd(SIGNALS)
  local buf = ""
  local function done(status)
    if signals then
      signals:close()
      core.signal.unblock(SIGNALS)
    end
    return status
  end
  while true do
    for _, i in ipairs(core.io.poll({ fd, signals }, -1) or {}) do
      if i == 2 then
        local sig, from_tty = core.signal.read(signals)
        -- a terminal's signal reached the broker's corral (in its process group) already
        if sig and not from_tty then core.io.write(fd, json.encode({ op = "signal", signal = sig }) .. "\n") end
      else
        local data = core.io.read(fd, 65536)
        if not data then data = "" end
        if data == "" then
          say(sub, "the broker closed the request before it ended")
          return done(1)
        end
        buf = buf .. data
        for line in buf:gmatch("([^\n]*)\n") do
          local ok, msg = pcall(json.decode, line)
          if not ok or type(msg) ~= "table" then
            say(sub, "the broker's answer is not JSON")
            return done(1)
          end
          if msg.ok == false then
            say(sub, tostring(msg.error))
            return done(math.tointeger(msg.status) or 1)
          end
          if type(msg.result) == "table" and msg.result.exit then return done(math.tointeger(msg.result.exit) or 1) end
        end
        buf = buf:match("[^\n]*$")
      end
    end
  end
end

--- Sends `corral SUB …` to the broker, when one should serve it.
-- @tparam {string,...} argv the subcommand and its words
-- @treturn integer|nil the exit status, or nil when the command runs here instead
function M.run(argv)
  local path, sub = os.getenv("CORRAL_BROKER"), argv[1]
  if not path or path == "" or not M.SUBCOMMANDS[sub] then return nil end
  if not M.confined() then
    io.stderr:write("corral: CORRAL_BROKER ignored: this process is not confined (no_new_privs is unset)\n")
    return nil
  end
  local fd, err = core.unix.connect(path, 5)
  if not fd then
    say(sub, "broker " .. path .. ": " .. tostring(err))
    return core.exit.CANNOT
  end
  local cred = core.unix.peercred(fd)
  if not cred or (cred.pid ~= 0 and not ancestor(cred.pid)) then
    say(sub, "refused: the broker at " .. path .. " is not the process that confines this one")
    return core.exit.CANNOT
  end
  local cwd = core.path.resolve(".")
  local line = json.encode({ op = "request", sub = sub, argv = { table.unpack(argv, 2) }, cwd = cwd or "/",
    env = env_names(argv) }) .. "\n"
  local sent, serr = core.unix.sendmsg(fd, line, { 0, 1, 2 })
  if not sent then
    say(sub, "broker: " .. tostring(serr))
    return core.exit.CANNOT
  end
  return follow(sub, fd)
end

return M
