-- Drives the corral host on a real pseudo-terminal (util-linux `script`) and reads the
-- screen back: what host_spec and repl_spec type into the REPL.
local h = require "helpers"

local M = {}

-- A caller's LUA_INIT must not leak into the children whose output is asserted.
M.CLEAN = "env -u LUA_INIT -u LUA_INIT_5_4 "

-- Runs a shell command; returns stdout, stderr, exit status.
function M.run(cmd)
  local errf = os.tmpname()
  local p = assert(io.popen("( " .. cmd .. " ) 2>" .. errf))
  local out = p:read("a")
  local _, _, code = p:close()
  local err = h.read(errf)
  os.remove(errf)
  return out, err, code
end

--- Runs the host with `args` on a pseudo-terminal. steps: strings are typed, numbers are
-- pauses (seconds), `{until_ = SH, seconds = N}` a pause until the shell condition SH
-- holds, N seconds at most. env: `env` arguments, options (-u) first (default: no history
-- file). Returns the terminal output (CR and escape sequences removed) and the status.
-- @tparam string args
-- @tparam table steps
-- @tparam[opt] string env
-- @tparam[opt=10] number timeout seconds for the whole session
function M.repl(args, steps, env, timeout)
  local feed = {}
  for _, s in ipairs(steps) do
    if type(s) == "number" then
      feed[#feed + 1] = "sleep " .. s
    elseif type(s) == "table" then
      feed[#feed + 1] = string.format("i=0; until { %s; } >/dev/null 2>&1 || [ $i -ge %d ]; do sleep 0.05; " ..
        "i=$((i+1)); done", s.until_, math.ceil(s.seconds * 20))
    else
      feed[#feed + 1] = "printf '%s' " .. h.quote(s)
    end
  end
  -- script runs the command through $SHELL; `exec` makes the host the terminal's only
  -- foreground process, so Ctrl-C reaches it alone. Without it, CI's dash (SHELL=/bin/sh)
  -- stayed as the parent, took the SIGINT and made script report 130 although the host
  -- carried on.
  local cmd = "(" .. table.concat(feed, "; ") .. ") | " .. M.CLEAN
    .. (env or "CORRAL_HISTORY=") .. " TERM=dumb timeout " .. (timeout or 10) .. " script -qfec "
    .. h.quote("exec " .. h.host .. (args ~= "" and " " .. args or "")) .. " /dev/null"
  local out, _, code = M.run(cmd)
  out = out:gsub("\r", ""):gsub("\27%[[%d;?]*%a", "")
  return out, code
end

--- Position of output line s: a whole line, or right after a prompt (without readline
-- the terminal echoes typed-ahead input before the prompt). Echoed input never matches.
function M.line_at(out, s)
  return ("\n" .. out):find("\n" .. s .. "\n", 1, true) or out:find("> " .. s .. "\n", 1, true)
end

--- Whether the host was linked with readline (history, completion): the host says so
-- (statically linked, it would not show in ldd).
function M.has_readline()
  local out = M.run(h.quote(h.host) .. " -e 'print(require(\"corral.host\").readline)'")
  return out:find("true", 1, true) ~= nil
end

return M
