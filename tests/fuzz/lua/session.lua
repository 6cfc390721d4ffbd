--- Fuzz target: what a client sends a session's socket (`session-ID.sock`: every input is
-- the bytes of its connections, one request line each), answered by the keeper's ops
-- (corral.session.keeper: a run's, `exec`, `rm`) for a session whose mechanism starts
-- nothing (its `join` refuses). Each line comes on a fresh connection with 3 fds, as
-- `corral exec` sends them; an op that takes the connection (exec, rm) answers on it.
-- Nothing may raise; every answer, on the connection or returned, is one JSON line, and
-- an exec's refusal carries its status (1-255); no fd is left open once a line is done.
local S = require "support"
local answers = require "control" -- the control target: how an answer is checked
local control = require "corral.control"
local core = require "corral.core"
local keeper = require "corral.session.keeper"

local MSG_DONTWAIT = 0x40

local mech = {
  name = "fuzz",
  cgroup_paths = function() return {} end,
  join = function() return nil, "fuzz: this mechanism starts nothing" end,
}
local sb = { id = "fuzz-session", env = { PATH = "/usr/bin:/bin", HOME = "/root" }, limits = {} }
local init = { pid = function() return core.proc.getpid() end, running = function() return true end }
local session = { id = "fuzz-session", mech = mech, sb = sb, execs = {}, init = init }
local ops = keeper.ops(session, {}, mech, sb)

local path = S.scratch .. "/session-fuzz.sock"
local listener = assert(core.unix.listen(path))

local function close_all(list)
  for _, fd in pairs(list or {}) do fd:close() end
end

local function open_fds() return #core.fs.listdir("/proc/self/fd") end

return function(data)
  for _, line in ipairs(S.lines(data)) do
    local before = open_fds()
    local peer = assert(core.unix.connect(path))
    local fd = assert(core.unix.accept(listener))
    local r0, w0 = assert(core.io.pipe())
    local r1, w1 = assert(core.io.pipe())
    local client = { fd = fd, buf = "", fds = { r0, w0, w1 } }
    local ok, err = pcall(control.answer_line, ops, line, client)
    r1:close()
    close_all(client.fds) -- the server closes what the op did not take
    if session.rm then
      session.rm.fd:close()
      session.rm, session.done = nil, nil
    end
    if not client.taken then fd:close() end
    local sent = core.sock.recv(peer, 65536, MSG_DONTWAIT)
    peer:close()
    if not ok then
      if type(err) == "table" and err.fuzz_check then error(err, 0) end
      S.check(false, "control.answer_line raised: " .. tostring(err))
    end
    S.check(open_fds() == before, "every fd closed after: " .. line)
    if not client.taken then answers.answer_ok(err) end
    if sent and sent ~= "" then
      local a = answers.answer_ok(sent)
      if not a.ok then S.check(math.tointeger(a.status) and a.status >= 1 and a.status <= 255, "a refusal's status") end
    end
  end
end
