--- The control channel of a running sandbox: each `corral run` registers a unix socket
-- in a runtime directory only its owner (and root) can enter, and serves it on its
-- egress loop (`corral.egress.loop`, which polls it beside the tenant's pidfd, or beside
-- a custom mechanism's watched child in corral.mechanism.watch, so no thread is needed);
-- the REPL of another corral process lists the registrations and asks them all at once
-- (`request_all`), one JSON line per request and one per answer.
--
-- The directory is `/run/corral/<uid>` for root, `$XDG_RUNTIME_DIR/corral` otherwise
-- (`/tmp/corral-<uid>` without one), mode 0700 and owned by the caller, or nothing is
-- registered. Each registration is `<pid>-<n>.sock`, removed when the run ends (its
-- `close`, also on an error through `<close>`; the forwarded signals end the run the
-- ordinary way) and, after a SIGKILL, swept by the next `register` or `list` once its
-- pid is gone. Whoever connects is checked with SO_PEERCRED before a byte is read: only
-- the owner's uid and root are answered, anyone else gets one refusal line; the owner's
-- uid only from this process's own user namespace (without root, a tenant's ids are the
-- owner's too, from a user namespace beneath).
--
-- Requests: `{"op": OP, ...}` with OP one of `info`, `status` (what `corral ls` shows;
-- the connection is closed after its answer), `connections`, `decisions` (`n`),
-- `ruleset`, `why` (`dest` "host:port"), `allow` (`entry`), `revoke` (`entry`, `cut`).
-- Answers: `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
-- @module corral.control
local core = require "corral.core"
local leftovers = require "corral.leftovers"
local runtime_dir = require "corral.runtime_dir"

local M = {}

--- A registration's file name: `<pid>-<n>.sock`.
M.PATTERN = "^(%d+)%-%d+%.sock$"

--- Longest request line the server reads, in bytes.
M.LINE_MAX = 65536

--- At most this many clients at once; more are closed at accept.
M.CLIENTS_MAX = 16

--- Seconds a client waits for an answer, and a server for a slow reader of one.
M.TIMEOUT = 3

local serial = 0

-- dkjson and the egress modules are loaded when a client first asks: most runs are
-- never asked, and loading them costs a run's start-up some milliseconds.
local function json() return require "corral.json" end
-- what a run answers: loaded by a server, not by a client (`corral ls`)
local function ops_module() return require "corral.control_ops" end

--- The runtime directory of this user's registrations (corral.runtime_dir).
-- @treturn[1] string the path
-- @return[2] nil
-- @treturn[2] string why it cannot be used (another owner, a mode that lets others in)
function M.dir()
  return runtime_dir.dir()
end

local function remove_stale(path)
  return os.remove(path)
end

--- Removes the registrations whose process is gone (a SIGKILLed run).
-- @tparam[opt] string dir (default `dir()`)
-- @treturn integer how many were removed
function M.sweep(dir)
  dir = dir or M.dir()
  if not dir then return 0 end
  return leftovers.sweep(dir, M.PATTERN, remove_stale)
end

-- ---- server ---------------------------------------------------------------------------

-- dkjson's own order: a line on the wire needs none stable, and corral.json's walk and
-- sort of every key is most of an answer's cost (100 keepers answering one ls).
local function encode(t)
  json() -- says so when dkjson is missing
  return require("dkjson").encode(t, { exception = function(_, v) return tostring(v) end }) .. "\n"
end

-- Plain data for JSON: error objects and other tables with __tostring as their text.
local function plain(v, depth)
  depth = depth or 0
  if type(v) ~= "table" then
    if type(v) == "userdata" or type(v) == "function" then return tostring(v) end
    return v
  end
  local mt = getmetatable(v)
  if (mt and mt.__tostring) or depth > 8 then return tostring(v) end
  local out = {}
  for k, x in pairs(v) do out[k] = plain(x, depth + 1) end
  return out
end

local function send_all(fd, data)
  while #data > 0 do
    local n, err = core.sock.send(fd, data)
    if not n then return nil, err end
    data = data:sub(n + 1)
  end
  return true
end

local Server = {}
Server.__index = Server

--- The fds the egress loop polls for this server: its listener and each client. Every
-- change of them says so (`corral.egress.loop.changed`).
Server.watch_notifies = true
function Server:watch()
  local w = {}
  if self.fd then w[1] = { fd = self.fd, on = function() self:accept() end } end
  for c in pairs(self.clients) do
    w[#w + 1] = { fd = c.fd, conn = true, on = function() self:read(c) end }
  end
  return w
end

function Server:drop(c)
  c.dropped = true
  c.fd:close()
  if self.clients[c] then
    self.clients[c] = nil
    require("corral.egress.loop").changed()
  end
end

function Server:accept()
  local fd = core.unix.accept(self.fd, M.TIMEOUT)
  if not fd then return end
  local cred, err = core.unix.peercred(fd)
  local uid = core.proc.geteuid()
  local refusal
  if not cred then
    refusal = "refused: " .. tostring(err)
  elseif cred.uid ~= uid and cred.uid ~= 0 then
    refusal = string.format("refused: uid %d is neither this sandbox's owner (uid %d) nor root", cred.uid, uid)
  elseif cred.uid == uid and uid ~= 0 then
    -- Without root a tenant's ids are the owner's own (its user namespace maps only
    -- them), so the uid alone would let a tenant that reaches this socket widen its own
    -- allowlist: the owner's processes are in this process's user namespace, a
    -- tenant's in one beneath it.
    local own, uerr = core.unix.peer_in_own_userns(fd)
    if not own then
      refusal = "refused: " .. (uerr and tostring(uerr) or string.format("uid %d connected from another user "
        .. "namespace (a sandbox's tenant, whose ids are its owner's without root), not this sandbox's owner", uid))
    end
  end
  local n = 0
  for _ in pairs(self.clients) do n = n + 1 end
  if not refusal and n >= M.CLIENTS_MAX then refusal = "refused: too many clients" end
  if refusal then
    -- Closed at its first read, not now: a peer still writing its request would get
    -- EPIPE instead of reading why.
    if send_all(fd, encode({ ok = false, error = refusal })) and n < M.CLIENTS_MAX then
      self.clients[{ fd = fd, refused = true }] = true
      require("corral.egress.loop").changed()
    else
      fd:close()
    end
    return
  end
  -- A request sent with the connect (corral ls asking 100 keepers) is answered in this
  -- turn of the loop, not the next; a connection it ends (`status`) is never polled, so
  -- the loop's list is not rebuilt for it.
  local c = { fd = fd, buf = "" }
  if (core.io.poll({ fd }, 0) or {})[1] then self:read(c) end
  if not (c.dropped or c.taken) then
    self.clients[c] = true
    require("corral.egress.loop").changed()
  end
end

-- Fds a client passed (SCM_RIGHTS) that no op took: closed with the line they came with.
local function close_fds(fds)
  for _, fd in ipairs(fds or {}) do fd:close() end
end

-- One read of a client: its bytes, and the fds that came with them where the server
-- takes fds (a session's exec); a server that takes none reads with recv, and the
-- kernel drops whatever fds a peer attached.
function Server:receive(c)
  if not self.fds_max then return core.sock.recv(c.fd, M.LINE_MAX, 0) end
  local data, fds = core.unix.recvmsg(c.fd, M.LINE_MAX, self.fds_max)
  if data and #fds > 0 then
    close_fds(c.fds)
    c.fds = fds
  end
  return data
end

function Server:read(c)
  local data = self:receive(c)
  if not data or data == "" or c.refused then
    close_fds(c.fds)
    return self:drop(c)
  end
  c.buf = c.buf .. data
  while true do
    local line, rest = c.buf:match("^([^\n]*)\n(.*)$")
    if not line then break end
    c.buf = rest
    local text = M.answer_line(self.ops, line, c)
    close_fds(c.fds)
    c.fds = nil
    if not text then
      -- the op answers on this connection itself, from now on (a session's exec, rm)
      self.clients[c] = nil
      require("corral.egress.loop").changed()
      return
    end
    if not send_all(c.fd, text) or c.last then return self:drop(c) end
  end
  if #c.buf > M.LINE_MAX then
    -- status: what an exec's client exits with for it (docs/sessions.md), a bad argument
    send_all(c.fd, encode({ ok = false, error = "request longer than " .. M.LINE_MAX .. " bytes", status = 2 }))
    self:drop(c)
  end
end

-- What an op is handed besides the request: the connection's fds that came with it
-- (`fds`, each taken by setting its slot to nil), `last()`, after which the connection
-- is closed once its answer is sent, and `take()`, after which the op owns the
-- connection (its fd, and `rest`, the bytes read past the request) and no answer is
-- written for it: the op answers when it is ready (a deferred answer).
local function connection(c)
  local conn = { fds = c.fds }
  -- the answer is the connection's last: closed once it is sent
  function conn.last() c.last = true end
  function conn.take()
    c.taken = true
    conn.fd, conn.rest = c.fd, c.buf
    c.buf = ""
    return conn
  end
  return conn
end

function Server:answer(line, c)
  local req = json().decode(line)
  if type(req) ~= "table" or type(req.op) ~= "string" then
    return { ok = false, error = "a request is one JSON object with op" }
  end
  local handler = self.ops[req.op]
  if not handler then return { ok = false, error = "unknown op " .. req.op } end
  local conn = c and connection(c)
  local ok, result, err = pcall(handler, req, conn)
  if conn and conn.fds ~= c.fds then c.fds = conn.fds end
  if c and c.taken then return nil end
  if not ok then return { ok = false, error = "op " .. req.op .. " failed: " .. tostring(result):match("^[^\n]*") } end
  if result == nil then return { ok = false, error = tostring(err) } end
  return { ok = true, result = plain(result) }
end

--- One request line answered by `ops` as a server answers it: the answer's JSON line,
-- or nil once the op took the connection. `client` is the connection's record (`{fd =,
-- buf =, fds =}`; nil: none, and an op that needs one fails). The server's own step,
-- named so that the fuzz targets (tests/fuzz/lua/control.lua, session.lua) drive what
-- a client's bytes reach without a socket.
-- @tparam table ops
-- @tparam string line
-- @tparam[opt] table client
-- @treturn string|nil
function M.answer_line(ops, line, client)
  local answer = Server.answer({ ops = ops }, line, client)
  if client and client.taken then return nil end
  return encode(answer)
end

--- Stops serving and removes the registration; idempotent.
function Server:close()
  if not self.fd then return end
  require("corral.egress.loop").remove(self)
  for c in pairs(self.clients) do self:drop(c) end
  ops_module().release(self.ops)
  self.fd:close()
  self.fd = nil
  os.remove(self.path)
end
Server.__close = Server.close

--- Registers a running sandbox and serves its control socket on the egress loop.
-- @tparam table ops request handlers by op name: `fn(request, conn)` → result, or nil,
--   error; or nothing after `conn.take()` (the op answers on the connection itself)
-- @tparam[opt] table opts `path`: the socket's path (a session's, which must not exist;
--   default `<pid>-<n>.sock` in `dir()`); `fds_max`: how many fds a request may carry
-- @treturn[1] table the registration (`path`, `close`; a to-be-closed value)
-- @return[2] nil
-- @treturn[2] string why nothing was registered (the run goes on without it)
-- @treturn[2] integer the errno, where one says why (EADDRINUSE: the path is bound)
function M.serve(ops, opts)
  opts = opts or {}
  local dir, err = M.dir()
  if not dir then return nil, err end
  M.sweep(dir)
  local path = opts.path
  if not path then
    serial = serial + 1
    path = string.format("%s/%d-%d.sock", dir, core.proc.getpid(), serial)
    os.remove(path) -- a pid's earlier life, killed before its sweep could tell it was gone
  end
  local fd, errno
  fd, err, errno = core.unix.listen(path, tonumber("600", 8))
  if not fd then return nil, err, errno end
  local self = setmetatable({ fd = fd, path = path, clients = {}, ops = ops, fds_max = opts.fds_max }, Server)
  require("corral.egress.loop").add(self)
  return self
end

-- ---- client ---------------------------------------------------------------------------

--- A session's socket name (corral.session): `session-<ID>.sock`.
M.SESSION_PATTERN = "^session%-([%w][%w_.-]*)%.sock$"

--- Every registration of this user, after a sweep: each run's, and each session's (a
-- session's socket whose keeper was killed is swept by corral.session, not here).
-- @treturn {table,...} `{path =, pid =}` each (a session's: `{path =, session =}`), by path
function M.list()
  local dir = M.dir()
  if not dir then return {} end
  M.sweep(dir)
  local out = {}
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local pid = name:match(M.PATTERN)
    if pid then out[#out + 1] = { path = dir .. "/" .. name, pid = tonumber(pid) } end
    -- a session's keeper (corral.session): its pid is in its info answer
    local session = name:match(M.SESSION_PATTERN)
    if session then out[#out + 1] = { path = dir .. "/" .. name, session = session } end
  end
  table.sort(out, function(a, b) return a.path < b.path end)
  return out
end

--- Sends one request to a registration and waits for its answer.
-- @tparam string path the socket
-- @tparam table req `{op =, ...}`
-- @tparam[opt] number timeout seconds (default `TIMEOUT`)
-- @return[1] the result
-- @return[2] nil
-- @treturn[2] string the server's error, or why it could not be asked
-- @treturn[2] string|nil "unanswered" when the server never answered (gone before or
--   while it was asked, or silent past the timeout): nil for the server's own refusal
function M.request(path, req, timeout)
  timeout = timeout or M.TIMEOUT
  local fd <close>, err = core.unix.connect(path, timeout)
  if not fd then return nil, err, "unanswered" end
  local ok, serr = send_all(fd, encode(req))
  if not ok then return nil, serr, "unanswered" end
  local buf, deadline = "", core.clock.monotime() + timeout
  while not buf:find("\n", 1, true) do
    local left = deadline - core.clock.monotime()
    if left <= 0 then return nil, path .. ": no answer within " .. timeout .. " s", "unanswered" end
    local data, rerr = core.sock.recv(fd, M.LINE_MAX, left)
    if not data then return nil, rerr, "unanswered" end
    if data == "" then return nil, path .. ": closed without an answer", "unanswered" end
    buf = buf .. data
  end
  local answer = json().decode(buf:match("^[^\n]*"))
  if type(answer) ~= "table" then return nil, path .. ": not a JSON answer" end
  if not answer.ok then return nil, tostring(answer.error) end
  return answer.result
end

--- Sends one request to each registration at once and waits, `timeout` seconds in all,
-- for their answers: a run that does not answer costs one wait, not one each. Each
-- connect is non-blocking (a unix socket's completes at once or fails), so one that
-- never accepts costs nothing either.
-- @tparam {string,...} paths the sockets
-- @tparam table req `{op =, ...}`
-- @tparam[opt] number timeout seconds (default `TIMEOUT`)
-- @tparam[opt] function meanwhile called once every request is sent, before the wait
--   (the caller's own work, done while the servers answer)
-- @treturn {table,...} for each path, in order: `{result =}` or `{error =}`
function M.request_all(paths, req, timeout, meanwhile)
  timeout = timeout or M.TIMEOUT
  local deadline = core.clock.monotime() + timeout
  local out, waiting = {}, {}
  local line = encode(req)
  for i, path in ipairs(paths) do
    local fd, err = core.unix.connect(path, 0)
    if fd and not send_all(fd, line) then
      fd:close()
      fd, err = nil, path .. ": the request could not be sent"
    end
    if fd then
      waiting[#waiting + 1] = { i = i, fd = fd, buf = "" }
    else
      out[i] = { error = tostring(err) }
    end
  end
  if meanwhile then meanwhile() end
  -- the answer of one reply line
  local function answer_of(c, text)
    local answer = json().decode(text)
    if type(answer) ~= "table" then return { error = paths[c.i] .. ": not a JSON answer" } end
    if answer.ok then return { result = answer.result } end
    return { error = tostring(answer.error) }
  end
  -- reads what c's socket has; its answer once it is whole
  local function read(c)
    local data = core.sock.recv(c.fd, M.LINE_MAX, 0)
    if not data or data == "" then return { error = paths[c.i] .. ": closed without an answer" } end
    c.buf = c.buf .. data
    local text = c.buf:match("^([^\n]*)\n")
    if text then return answer_of(c, text) end
    if #c.buf > M.LINE_MAX then return { error = paths[c.i] .. ": answer longer than " .. M.LINE_MAX .. " bytes" } end
  end
  while #waiting > 0 do
    local left = deadline - core.clock.monotime()
    if left <= 0 then
      for _, c in ipairs(waiting) do out[c.i] = { error = paths[c.i] .. ": no answer within " .. timeout .. " s" } end
      break
    end
    local fds = {}
    for k, c in ipairs(waiting) do fds[k] = c.fd end
    local still, ready = {}, {}
    for _, k in ipairs(core.io.poll(fds, left) or {}) do ready[k] = true end
    for k, c in ipairs(waiting) do
      local answer = ready[k] and read(c)
      if answer then
        out[c.i] = answer
        c.fd:close()
      else
        still[#still + 1] = c
      end
    end
    waiting = still
  end
  for _, c in ipairs(waiting) do c.fd:close() end
  return out
end

-- ---- what a run answers (corral.control_ops) ------------------------------------------

function M.cgroup_usage(...) return ops_module().cgroup_usage(...) end
function M.parse_dest(...) return ops_module().parse_dest(...) end
function M.run_ops(...) return ops_module().for_run(...) end

--- Registers a run (`corral.run.execute` calls it once the sandbox is provisioned).
-- @tparam table mech
-- @tparam table sb
-- @tparam[opt] table run `{argv =}`
-- @treturn[1] table the registration, to close when the run ends
-- @return[2] nil
-- @treturn[2] string why nothing was registered
function M.register(mech, sb, run)
  return M.serve(M.run_ops(mech, sb, run))
end

return M
