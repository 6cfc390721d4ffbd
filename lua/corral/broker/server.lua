--- The broker of `corral confine --exec --broker`: the confining corral stays outside the
-- boundary as a small keeper. It forks the confined command (the child becomes the
-- confinement wrapper exactly as `--exec` alone does), serves a unix socket that only
-- the agent's root shows, and runs each request it grants as a real `corral SUB …` of its
-- own, outside, on the agent's stdin/stdout/stderr, answering with its exit status.
--
-- Wire (one connection per request, docs/sessions.md): the client sends ONE message,
--   {"op":"request","sub":"run","argv":[...],"cwd":"/dir","env":{"NAME":"VALUE"}}\n
-- with its fds 0, 1, 2 attached (SCM_RIGHTS). The broker answers
--   {"ok":false,"error":"TEXT","status":N}\n  (refused), or
--   {"ok":true,"result":{"pid":N}}\n then {"ok":true,"result":{"exit":N}}\n.
-- Meanwhile the client may send {"op":"signal","signal":S}\n; its EOF ends the request
-- (SIGTERM, then SIGKILL after a grace).
-- @module corral.broker.server
local core = require "corral.core"
local grant = require "corral.broker.grant"
local agent_limits = require "corral.broker.agent_limits"
local bound = require "corral.broker.boundary"
local own_code = require "corral.broker.own_code"
local json = require "corral.json"
local leftovers = require "corral.leftovers"
local proctree = require "corral.proctree"
local runtime_dir = require "corral.runtime_dir"

local M = {}

--- Requests served at once (waiting for their message, or running), and live sessions.
M.MAX_REQUESTS = 8
M.MAX_SESSIONS = 16
local REQUEST_TIMEOUT, GRACE, MESSAGE_MAX = 5, 3, 65536
local SIGNALS = { "INT", "TERM", "HUP", "QUIT", "USR1", "USR2" }
local FORWARDED = { [1] = true, [2] = true, [3] = true, [10] = true, [12] = true, [15] = true }
-- What the real corral is given from the keeper's own environment: where its runtime
-- directory, scratch, state and tools are. The agent's values never set what corral
-- itself reads (PATH finds bwrap; the loader reads LD_*): a tenant's --env values reach
-- `run` and `create` inside the boundary variable; only `exec`'s C client takes them
-- from its environment, and grant refuses the names a process's start-up reads there.
local KEEPER_ENV = { "XDG_RUNTIME_DIR", "TMPDIR", "PATH", "HOME", "LANG", "TZ", "CORRAL_STATE_DIR" }
local PREFIX = "broker-"

local function send(fd, t)
  core.io.write(fd, json.encode(t) .. "\n")
end

local function refuse(conn, why, status)
  send(conn.fd, { ok = false, error = why, status = status or core.exit.USAGE })
  conn.fd:close()
  conn.done = true
end

-- The boundary a launch spec's wrapper arguments grant: --permit and directory --extra
-- (writable), file --extra (read-only); sockets (ours among them) are not a boundary.
local function boundary_of(spec)
  local b = { dirs = {}, files = {} }
  for i, a in ipairs(spec.args) do
    local v = spec.args[i + 1]
    if a == "--" then break end
    if a == "--permit" or a == "--extra" then
      local st = core.fs.lstat(v)
      if st and st.type == "dir" then b.dirs[#b.dirs + 1] = v end
      if st and st.type == "file" then b.files[#b.files + 1] = v end
    end
  end
  return b
end

-- Whether `pid` is `root` or runs beneath it.
local function beneath(pid, root)
  for _ = 1, 4096 do
    if pid == root then return true end
    pid = proctree.parent(pid)
    if not pid or pid <= 1 then return false end
  end
  return false
end

-- The keeper's state: the agent, its boundary, the requests and sessions it holds.
local Broker = {}
Broker.__index = Broker

function Broker:active()
  local n = 0
  for _, c in ipairs(self.conns) do
    if not c.done or c.child then n = n + 1 end
  end
  return n
end

-- Connections waiting for their message that are ready (closed, most likely) handled
-- now: a client that closed some before connecting again finds their places free.
function Broker:settle()
  local waiting = {}
  for _, c in ipairs(self.conns) do
    if not c.done and not c.child then waiting[#waiting + 1] = c end
  end
  local fds = {}
  for i, c in ipairs(waiting) do fds[i] = c.fd end
  for _, i in ipairs(#fds > 0 and core.io.poll(fds, 0) or {}) do self:on_conn(waiting[i]) end
end

function Broker:accept()
  while true do
    local fd = core.unix.accept(self.listener, 1)
    if not fd then return end
    local conn = { fd = fd, since = core.clock.monotime() }
    local cred = core.unix.peercred(fd)
    if self:active() >= M.MAX_REQUESTS then self:settle() end
    if self:active() >= M.MAX_REQUESTS then
      refuse(conn, string.format("broker busy: %d requests at once already; try again when one ends",
        M.MAX_REQUESTS), 1)
    elseif not cred or cred.uid ~= core.proc.geteuid() or not beneath(cred.pid, self.agent:pid()) then
      -- only the agent's own processes: a tenant never reaches the socket, and nothing
      -- else of this uid asks on the agent's behalf
      refuse(conn, "refused: not a process of this broker's confined agent", core.exit.CANNOT)
    else
      conn.peer = cred.pid
      self.conns[#self.conns + 1] = conn
    end
  end
end

-- The keeper's PATH without the directories the agent may write (or relative ones):
-- the broker's corral finds bwrap, setsid and unshare on it, outside the boundary.
local function outside_path(path, boundary)
  local keep = {}
  for dir in path:gmatch("[^:]+") do
    local r = dir:sub(1, 1) == "/" and (core.path.resolve(dir) or dir)
    local inside = not r
    for _, d in ipairs(r and boundary.dirs or {}) do inside = inside or core.path.is_beneath(r, d) end
    if not inside then keep[#keep + 1] = dir end
  end
  return table.concat(keep, ":")
end

-- The agent's value of each name (strings without NUL; TERM too, a tenant's base).
local function agent_values(req, names)
  local env = {}
  for _, k in ipairs({ "TERM", table.unpack(names) }) do
    local v = req.env[k]
    if type(v) == "string" and not v:find("%z") then env[k] = v end
  end
  return env
end

-- The environment of the broker's `corral`: the boundary it enforces again at its own
-- resolution, the sessions its `ls` shows and the tenant's --env values
-- (corral.broker.boundary), the keeper's own variables, the agent's TERM; for `exec`
-- the --env names grant let through.
local function child_env(req, sub, env_names, broker)
  local values = agent_values(req, env_names)
  local envp = { bound.VAR .. "=" .. bound.encode(broker.boundary, broker.sessions, values),
                 table.unpack(own_code.search_env()) }
  for _, k in ipairs(KEEPER_ENV) do
    local v = os.getenv(k)
    if k == "PATH" and v then v = outside_path(v, broker.boundary) end
    if v then envp[#envp + 1] = k .. "=" .. v end
  end
  local from_agent = { values.TERM and "TERM" or nil }
  if sub == "exec" then table.move(env_names, 1, #env_names, #from_agent + 1, from_agent) end
  for _, k in ipairs(from_agent) do
    if values[k] then envp[#envp + 1] = k .. "=" .. values[k] end
  end
  return envp
end

-- A request's shape; its meaning is corral.broker.grant's.
local function well_formed(req)
  if type(req) ~= "table" or req.op ~= "request" or type(req.sub) ~= "string" or type(req.argv) ~= "table"
      or type(req.cwd) ~= "string" or type(req.env) ~= "table" then
    return false
  end
  for _, a in ipairs(req.argv) do
    if type(a) ~= "string" then return false end
  end
  return true
end

function Broker:launch(conn, data, fds)
  local ok, req = pcall(json.decode, data)
  if #fds ~= 3 or not ok or not well_formed(req) then
    return refuse(conn, "not a broker request (one JSON line with fds 0, 1 and 2 attached)")
  end
  local cwd = core.path.resolve(req.cwd)
  local inside = false
  for _, d in ipairs(self.boundary.dirs) do inside = inside or (cwd and core.path.is_beneath(cwd, d)) end
  if not inside then
    return refuse(conn, "the working directory " .. tostring(req.cwd) .. " is outside the boundary; cd into it")
  end
  local agent = agent_limits.of(conn.peer)
  if not agent then return refuse(conn, "the requesting process is gone", 1) end
  local count = 0
  for _ in pairs(self.sessions) do count = count + 1 end
  local g, why, status = grant.check(req.sub, req.argv, { cwd = cwd, boundary = self.boundary, agent = agent,
    sessions = self.sessions, session_count = count, max_sessions = M.MAX_SESSIONS })
  if not g then return refuse(conn, why, status) end
  local envp = child_env(req, req.sub, g.env_names, self)
  local argv = { self.host, table.unpack(g.argv) }
  local child, pipe = core.spawn.fork()
  if child == false then
    core.proc.execve(self.host, argv, envp, cwd, fds)
    core.proc.exit(core.exit.NOTFOUND)
  end
  if not child then return refuse(conn, "cannot start corral: " .. tostring(pipe), 1) end
  pipe:close()
  conn.child, conn.sub, conn.session = child, req.sub, g.session
  send(conn.fd, { ok = true, result = { pid = child:pid() } })
end

-- A request started or refused: either way the agent's fds are closed here at once (a
-- refused one kept would hold the client's stdout open, its reader waiting for the end).
function Broker:start(conn, data, fds)
  self:launch(conn, data, fds)
  for _, f in ipairs(fds) do f:close() end
end

function Broker:on_conn(conn)
  if not conn.child then
    local data, fds, errno = core.unix.recvmsg(conn.fd, MESSAGE_MAX, 3)
    if data == nil and errno == core.errno.EAGAIN then return end
    if not data or data == "" then
      conn.fd:close()
      conn.done = true
      return
    end
    return self:start(conn, data, fds)
  end
  local data = core.io.read(conn.fd, 4096)
  if not data then return end
  if data == "" then
    -- the client is gone: its request ends with it
    conn.child:kill(15)
    conn.killed_at = core.clock.monotime()
    conn.fd:close()
    conn.done = true
    return
  end
  for line in data:gmatch("[^\n]+") do
    local ok, msg = pcall(json.decode, line)
    if ok and type(msg) == "table" and msg.op == "signal" and FORWARDED[msg.signal] then
      conn.child:kill(msg.signal)
    end
  end
end

function Broker:on_child(conn)
  local code = conn.child:wait()
  conn.child = nil
  if code == 0 and conn.sub == "create" then self.sessions[conn.session] = true end
  if code == 0 and conn.sub == "rm" then self.sessions[conn.session] = nil end
  if not conn.done then
    send(conn.fd, { ok = true, result = { exit = code } })
    conn.fd:close()
    conn.done = true
  end
end

-- Requests whose message never came, and children whose client left past the grace.
function Broker:expire(now)
  for _, c in ipairs(self.conns) do
    if not c.done and not c.child and now - c.since > REQUEST_TIMEOUT then
      refuse(c, "no request within " .. REQUEST_TIMEOUT .. " s")
    end
    if c.child and c.killed_at and now - c.killed_at > GRACE then c.child:kill(9) end
  end
  local keep = {}
  for _, c in ipairs(self.conns) do
    if not c.done or c.child then keep[#keep + 1] = c end
  end
  self.conns = keep
end

-- One turn: everything that is ready handled; the agent's status once it has ended.
function Broker:turn()
  local list, at = { self.agent, self.listener, self.signals }, {}
  for _, c in ipairs(self.conns) do
    if not c.done then
      list[#list + 1] = c.fd
      at[#list] = { c, "conn" }
    end
    if c.child then
      list[#list + 1] = c.child
      at[#list] = { c, "child" }
    end
  end
  for _, i in ipairs(core.io.poll(list, 1) or {}) do
    if i == 1 then
      local code = self.agent:wait()
      return code
    elseif i == 2 then
      self:accept()
    elseif i == 3 then
      local sig, from_tty = core.signal.read(self.signals)
      -- a terminal's signal reached the agent's whole process group already
      if sig and not from_tty then self.agent:kill(sig) end
    elseif at[i][2] == "conn" and not at[i][1].done then
      self:on_conn(at[i][1])
    elseif at[i][2] == "child" and at[i][1].child then
      self:on_child(at[i][1])
    end
  end
  self:expire(core.clock.monotime())
end

-- What the broker still holds once the agent has ended: its requests (SIGTERM, then
-- SIGKILL after the grace) and the sessions it made (`corral rm`).
function Broker:finish()
  for _, c in ipairs(self.conns) do
    if c.child then c.child:kill(15) end
  end
  for _, c in ipairs(self.conns) do
    if c.child and not c.child:wait(GRACE) then c.child:kill(9) end
    if c.child then c.child:wait() end
    if not c.done then c.fd:close() end
  end
  for id in pairs(self.sessions) do
    local child = core.spawn.fork()
    if child == false then
      core.proc.execve(self.host, { self.host, "rm", id }, {}, "/")
      core.proc.exit(core.exit.NOTFOUND)
    end
    if child then child:wait(10) end
  end
  self.listener:close()
  leftovers.remove_own_tree(self.dir)
end

--- Runs a confined command with a broker beside it; returns once the command has ended.
-- @tparam function make_spec `make_spec(socket_path)` → the launch spec (the socket
--   granted as an --extra, CORRAL_BROKER naming it), or nil and the error
-- @tparam function exec `exec(spec)`: becomes the wrapper (in the forked child); returns
--   only on failure
-- @treturn[1] integer the command's exit status (128+N when signal N ended it)
-- @return[2] nil
-- @treturn[2] the error (`make_spec`'s, or why the socket cannot be made)
function M.keep(make_spec, exec)
  local rdir, rerr = runtime_dir.dir()
  if not rdir then return nil, "broker: runtime directory: " .. tostring(rerr) end
  leftovers.sweep_own(rdir, PREFIX)
  local dir, derr = leftovers.make(rdir, PREFIX)
  if not dir then return nil, "broker: " .. tostring(derr) end
  local path = dir .. "/sock"
  local listener, lerr = core.unix.listen(path, tonumber("600", 8), 64)
  local spec, serr
  if listener then spec, serr = make_spec(path) end
  if not spec then
    if listener then listener:close() end
    leftovers.remove_own_tree(dir)
    return nil, serr or ("broker: " .. tostring(lerr))
  end
  local signals = core.signal.fd(SIGNALS)
  local agent, pipe = core.spawn.fork()
  if agent == false then
    local _, msg = exec(spec)
    io.stderr:write("corral confine: ", tostring(msg), "\n")
    core.proc.exit(core.exit.SETUP)
  end
  if not agent then
    listener:close()
    leftovers.remove_own_tree(dir)
    return nil, "broker: " .. tostring(pipe)
  end
  pipe:close()
  local self = setmetatable({ agent = agent, listener = listener, signals = signals, dir = dir, conns = {},
    sessions = {}, boundary = boundary_of(spec), host = core.proc.host_executable() }, Broker)
  local status
  repeat status = self:turn() until status
  self:finish()
  signals:close()
  core.signal.unblock(SIGNALS)
  return status
end

return M
