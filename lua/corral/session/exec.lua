--- A session's `exec` op (docs/sessions.md, the wire protocol): the request checked as
-- `corral run` checks its arguments (the environment policy of corral.hardening, each
-- refusal naming --env, --cwd or the command), the command spawned inside the running
-- sandbox (corral.mechanism.lifecycle `join`: its namespaces, cgroup, seccomp filter and
-- capability set) on the client's fds or on a pty of the sandbox's own devpts, then
-- watched on the keeper's egress loop beside every other exec: its end answered, the
-- client's signals forwarded, the client's going away ending the exec's whole tree.
-- @module corral.session.exec
local core = require "corral.core"
local hardening = require "corral.hardening"
local json = require "corral.json"
local lifecycle = require "corral.mechanism.lifecycle"

local M = {}

--- The signals a client may forward (SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2,
-- SIGTERM, SIGWINCH): those a terminal or a supervisor sends, never SIGKILL or SIGSTOP,
-- which would strand the command without the process that waits for it.
M.SIGNALS = { [1] = true, [2] = true, [3] = true, [10] = true, [12] = true, [15] = true, [28] = true }

--- Longest line a running exec's client may send (a signal request).
M.LINE_MAX = 4096

local function loop() return require "corral.egress.loop" end

local function send(fd, t, fds)
  return core.unix.sendmsg(fd, json.encode(t) .. "\n", fds)
end

-- The two answers every exec sends, `{"ok":true,"result":{KEY:N}}`: the bytes
-- corral.json writes for them, without an encoder's walk on each exec.
local function send_result(fd, key, n, fds)
  return core.unix.sendmsg(fd, string.format('{"ok":true,"result":{"%s":%d}}\n', key, n), fds)
end

-- A refusal (the protocol's `status`), and the connection closed.
local function refuse(fd, status, text)
  send(fd, { ok = false, error = text, status = status })
  fd:close()
end

local function close_all(fds)
  for _, fd in pairs(fds or {}) do fd:close() end
end

local function is_string(v) return type(v) == "string" and not v:find("\0", 1, true) end

-- The request's environment over the sandbox's: nil and why (naming --env) when a
-- variable is malformed or credential-shaped.
local function environment(sb, asked)
  if asked ~= nil and type(asked) ~= "table" then return nil, "--env: must be an object of NAME: VALUE" end
  local env = {}
  for k, v in pairs(sb.env or {}) do env[k] = v end
  for name, value in pairs(asked or {}) do
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      return nil, "--env " .. tostring(name) .. ": not a variable name"
    end
    if not is_string(value) then return nil, "--env " .. name .. ": its value must be a string without NUL" end
    local why = hardening.refusal(name, value)
    if why then return nil, "--env " .. name .. ": refused: " .. why end
    env[name] = value
  end
  return env
end

-- The request checked: nil and why (each naming its flag) or the spawn's options.
local function checked(sb, req, fds)
  local argv = req.argv
  if type(argv) ~= "table" or #argv == 0 or not is_string(argv[1]) or argv[1] == "" then
    return nil, "CMD: missing or empty"
  end
  for i = 1, #argv do
    if not is_string(argv[i]) then return nil, "CMD: argument " .. i .. " is not a string without NUL" end
  end
  local env, why = environment(sb, req.env)
  if not env then return nil, why end
  if req.cwd ~= nil and not (is_string(req.cwd) and req.cwd:sub(1, 1) == "/") then
    return nil, "--cwd: must be an absolute path inside the sandbox"
  end
  local tty = req.tty == true
  if tty then
    if #fds > 0 then return nil, "-t: a terminal's exec passes no fds (its pty is the sandbox's)" end
    if req.term ~= nil and not (is_string(req.term) and #req.term <= 64 and req.term:match("^[%w][%w%.%-%+_]*$")) then
      return nil, "-t: TERM must be a terminfo name"
    end
    env.TERM = req.term or env.TERM
  elseif #fds ~= 3 then
    return nil, "exec passes exactly 3 fds (its 0, 1 and 2) without -t, got " .. #fds
  end
  local function size(v) return math.tointeger(v) and v >= 0 and v <= 65535 and v or 0 end
  -- nothing asked over the sandbox's own (no env, or an empty one, as the C client
  -- sends): its environment as planned once (env nil)
  if (req.env == nil or next(req.env) == nil) and not tty then env = nil end
  return { argv = argv, env = env, cwd = req.cwd, tty = tty, rows = size(req.rows), cols = size(req.cols) }
end

-- ---- a running exec, watched on the keeper's loop -----------------------------------

local Exec = {}
Exec.__index = Exec
Exec.watch_notifies = true

function Exec:watch()
  if not self.fd then return {} end
  return { { fd = self.proc, on = function() self:ended() end },
           { fd = self.fd, conn = true, on = function() self:read() end } }
end

function Exec:close()
  if not self.fd then return end
  if self.control then self.control.finish() end
  self.execs[self] = nil
  loop().remove(self)
  self.fd:close()
  self.fd = nil
end

-- The command ended: its status, then the connection closed.
function Exec:ended()
  local code = self.proc:wait()
  send_result(self.fd, "exit", code)
  self:close()
end

-- The sandbox's --wall bounds each exec as it bounds a run's command: past it, the
-- command's tree is killed and its status is corral run's for that (124).
function Exec:deadline() return self.due end

function Exec:tick(now)
  if not (self.fd and self.due and now >= self.due) then return end
  if self.control then self.control.kill() end
  lifecycle.kill_tree(self.proc)
  self.proc:kill()
  self.proc:wait()
  send_result(self.fd, "exit", core.exit.WALL)
  self:close()
end

--- Kills the exec and what it started that is still beneath it (SIGKILL), and forgets it.
function Exec:kill()
  if self.control then self.control.kill() end
  lifecycle.kill_tree(self.proc)
  self.proc:close()
  self:close()
end

-- The client's lines while the command runs ({"op":"signal","signal":S}), or its end.
function Exec:read()
  local data = core.sock.recv(self.fd, M.LINE_MAX, 0)
  if not data or data == "" then return self:kill() end
  self.buf = self.buf .. data
  for line in self.buf:gmatch("([^\n]*)\n") do
    local ok, req = pcall(json.decode, line)
    local sig = ok and type(req) == "table" and req.op == "signal" and math.tointeger(req.signal)
    if sig and M.SIGNALS[sig] then
      if self.control then self.control.signal(sig) else self.proc:kill(sig) end
    end
  end
  self.buf = self.buf:match("[^\n]*$")
  if #self.buf > M.LINE_MAX then self:kill() end
end

-- The spawn's failure as the protocol's status: the command not found (127) or not
-- executable (126), a --cwd the sandbox lacks (2), or what cannot be enforced (125).
local function failure(argv, err, failed)
  if failed then
    local cmd = argv[1]
    if failed.code == core.exit.NOTFOUND and not cmd:find("/", 1, true) then
      return failed.code, cmd .. ": command not found"
    end
    return failed.code, cmd .. ":" .. (tostring(failed.error):match(":([^:]*)$") or " cannot be executed")
  end
  local text = tostring(err)
  if text:find("spawn: chdir", 1, true) then return core.exit.USAGE, "--cwd: " .. text end
  return core.exit.SETUP, text
end

--- The exec op of a session, for corral.control's server (which hands it the fds that
-- came with the request and its connection).
-- @tparam table session `mech`, `sb`, `init` (the running process `start` left), `execs`
--   (the set of running execs, each with `kill`)
-- @treturn function the op
function M.op(session)
  return function(req, conn)
    local fds = conn.fds or {}
    conn.fds = nil
    local c = conn.take()
    local opts, why = checked(session.sb, req, fds)
    if not opts then
      close_all(fds)
      return refuse(c.fd, core.exit.USAGE, why)
    end
    -- the sandbox's init killed from outside: the sandbox is gone, as it is once the
    -- keeper (which notices within a second) has ended; never a join that cannot be
    if session.init and not session.init:running() then
      close_all(fds)
      session.done = true
      return refuse(c.fd, core.exit.USAGE, "no live sandbox " .. session.id .. ": its init has ended")
    end
    local master, slave
    if opts.tty then
      -- through the sandbox's root: its init's, or the process the mechanism names
      local root = session.mech.root_pid and session.mech.root_pid(session.sb) or session.init:pid()
      master, slave = core.tty.open_pty(root, opts.rows, opts.cols)
      if not master then
        return refuse(c.fd, core.exit.SETUP, "-t: no pty of the sandbox's own: " .. tostring(slave))
      end
      fds = { slave, slave, slave }
    end
    -- control: a mechanism whose joined process is not the command's parent (oci's
    -- engine client) says how to signal and kill the command (corral.session.joins)
    local proc, err, failed, control = session.mech.join(session.sb, opts.argv, { stdin = fds[1], stdout = fds[2],
      stderr = fds[3], env = opts.env, cwd = opts.cwd, ctty = opts.tty })
    close_all(fds)
    if not proc then
      if master then master:close() end
      return refuse(c.fd, failure(opts.argv, err, failed))
    end
    local ok = send_result(c.fd, "pid", proc:pid(), master and { master } or nil)
    if master then master:close() end
    local wall = session.sb.limits and session.sb.limits.wall
    local ex = setmetatable({ proc = proc, fd = c.fd, buf = "", execs = session.execs,
      due = wall and core.clock.monotime() + wall or nil, control = control }, Exec)
    session.execs[ex] = true
    loop().add(ex)
    if not ok then ex:kill() end
    if c.rest ~= "" then
      ex.buf = c.rest
    end
  end
end

return M
