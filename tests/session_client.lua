-- A client of a session's socket speaking the exec protocol (docs/sessions.md) from Lua,
-- for the tests: run through the host, `corral tests/session_client.lua [-t] [--env
-- NAME=VALUE]... [--cwd DIR] [--input TEXT] [--fds N] ID -- CMD...`. It passes its own
-- fds 0-2 (none with -t: it then relays the pty's master to stdout, having typed TEXT
-- into it; --fds N passes N instead, a malformed request), forwards SIGINT,
-- SIGTERM and SIGHUP, and exits with the command's status or the refusal's.
local core = require "corral.core"
local json = require "corral.json"
local session = require "corral.session"

local args, i = { env = {}, argv = {} }, 1
while arg[i] do
  local a = arg[i]
  if a == "--" then
    args.argv = table.move(arg, i + 1, #arg, 1, {})
    break
  elseif a == "-t" then
    args.tty = true
  elseif a == "--env" then
    i = i + 1
    local k, v = arg[i]:match("^([^=]*)=(.*)$")
    args.env[k] = v
  elseif a == "--cwd" then
    i = i + 1
    args.cwd = arg[i]
  elseif a == "--input" then -- typed into the pty once the command started (-t)
    i = i + 1
    args.input = arg[i]
  elseif a == "--fds" then -- how many fds to pass (a malformed request)
    i = i + 1
    args.fds = tonumber(arg[i])
  else
    args.id = a
  end
  i = i + 1
end

-- held from the start: a signal sent once the command runs is forwarded, never this
-- client's death
local sigs = core.signal.fd({ "INT", "TERM", "HUP" })
local path = session.path(args.id)
local fd, err = core.unix.connect(path, 3)
if not fd then
  io.stderr:write("session_client: ", tostring(err), "\n")
  os.exit(2)
end
local req = { op = "exec", argv = args.argv, env = args.env, cwd = args.cwd, tty = args.tty == true,
              rows = 24, cols = 80, term = args.tty and "xterm" or nil }
local fds = {}
for n = 0, (args.fds or (args.tty and 0 or 3)) - 1 do fds[#fds + 1] = n end
assert(core.unix.sendmsg(fd, json.encode(req) .. "\n", fds))

local buf, master = "", nil
local function next_line()
  while not buf:find("\n", 1, true) do
    local data, got = core.unix.recvmsg(fd, 65536, 1, true)
    if not data or data == "" then return nil end
    if got[1] then master = got[1] end
    buf = buf .. data
  end
  local line
  line, buf = buf:match("^([^\n]*)\n(.*)$")
  return json.decode(line)
end

local started = next_line()
if not started then os.exit(1) end
if not started.ok then
  io.stderr:write("session_client: ", tostring(started.error), "\n")
  os.exit(started.status or 1)
end
local watch = { fd, sigs }
if master then
  watch[3] = master
  if args.input then core.io.write(master, args.input) end
end
while true do
  local ready = core.io.poll(watch, -1) or {}
  for _, k in ipairs(ready) do
    if k == 1 then
      local ended = next_line()
      if not ended then os.exit(1) end
      if ended.result and ended.result.exit then
        if master then -- what the pty still holds
          while core.io.poll({ master }, 0.2)[1] do
            local d = core.io.read(master, 65536)
            if not d or d == "" then break end
            io.stdout:write(d)
          end
        end
        io.stdout:flush()
        os.exit(ended.result.exit)
      end
    elseif k == 2 then
      local s = core.signal.read(sigs)
      if s then core.unix.sendmsg(fd, json.encode({ op = "signal", signal = s }) .. "\n") end
    elseif k == 3 then
      local d = core.io.read(master, 65536)
      if d and d ~= "" then io.stdout:write(d) io.stdout:flush() else watch[3] = nil end
    end
  end
end
