--- A conformance check's world: the storage root, sandboxes, servers and host processes
-- one check uses, its helpers (run a script in a box, dial out, serve, the control), and
-- their removal. Which checks run and how their outcomes are judged is
-- corral.conformance's.
-- @module corral.conformance.world
local core = require "corral.core"
local leftovers = require "corral.leftovers"
local mechanism = require "corral.mechanism"
local sandbox = require "corral.sandbox"

local M = {}

local World = {}
World.__index = World

local read_file = require("corral.file").read

--- A random hex token (from the kernel's generator).
-- @treturn string 24 hex digits
function M.token()
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(12)
  f:close()
  return (bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- A check's scratch, named with the run's pid so that a later run removes what a
-- SIGKILLed one left (corral.leftovers).
local SCRATCH_PREFIX = "corral-conformance-"
M.SCRATCH_PATTERN = leftovers.pattern(SCRATCH_PREFIX)

--- Removes the scratch of conformance runs that are gone (SIGKILLed mid-check).
function M.sweep() return leftovers.sweep_own(leftovers.base(), SCRATCH_PREFIX) end

--- A world for one check: its storage root, sandboxes, servers and host processes;
-- close() removes them.
-- @param mech the mechanism under test (loaded)
-- @tparam table opts the run's options
-- @treturn[1] table the world
-- @return[2] nil
-- @treturn[2] string why no storage root was made
function M.new(mech, opts)
  local root, err = leftovers.make(leftovers.base(), SCRATCH_PREFIX)
  if not root then return nil, err end
  root = core.path.resolve(root) or root
  core.fs.chmod(root, tonumber("711", 8))
  return setmetatable({ mech = mech, opts = opts, root = root, boxes = {}, servers = {}, procs = {},
                        n = 0 }, World)
end

World.token = M.token

-- A callback of the mechanism under test, called as the host calls it (gated, checked).
function World:call(name, sb, ...)
  return mechanism.host_call(self.mech, name, sb, ...)
end

--- Provisions a sandbox with a file `own` holding a fresh token in its storage.
-- @treturn table box, or nil and the error
function World:sandbox(fields)
  self.n = self.n + 1
  local t = { id = "cf" .. self.n, storage_root = self.root }
  for k, v in pairs(fields or {}) do t[k] = v end
  local sb, err = sandbox.new(t)
  if not sb then return nil, err end
  local ok, perr = self:call("provision", sb)
  if not ok then return nil, perr end
  -- the host's view of the storage: its directory, or a disk's filesystem (storage_view)
  local dir = type(self.mech.storage_view) == "function" and self.mech.storage_view(sb) or self.root .. "/" .. sb.id
  local box = { sb = sb, dir = dir, id = sb.id, own = self:token(), host_id = sandbox.host_id(sb) }
  self.boxes[#self.boxes + 1] = box
  self:write(box, "own", box.own)
  return box
end

--- Writes a file into a box's storage from the host (owned by the box's host id).
function World.write(_, box, name, text, mode)
  local path = box.dir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  core.fs.chmod(path, tonumber(mode or "644", 8))
  core.fs.chown(path, box.host_id, box.host_id)
  return path
end

--- Reads a file of a box's storage from the host (nil when absent).
function World.read(_, box, name) return read_file(box.dir .. "/" .. name) end

--- A TCP server on the host's loopback: each connection gets `reply` and its data lands in `got`.
function World:tcp_server(addr, reply)
  local fd, port = core.sock.listen(addr or "127.0.0.1", 0)
  if not fd then return nil, port end
  local s = { kind = "tcp", fd = fd, port = port, addr = addr or "127.0.0.1", reply = reply, conns = {},
              accepted = 0, got = "" }
  self.servers[#self.servers + 1] = s
  return s
end

--- A UDP socket of the check's own on the host's loopback; datagrams land in `got`.
function World:udp_server(addr)
  local ns = core.ns.open("self", "net")
  if not ns then return nil, "cannot open the host's network namespace" end
  local fd, port = core.listen.in_netns(ns, "udp", addr or "127.0.0.1", 0)
  ns:close()
  if not fd then return nil, port end
  local s = { kind = "udp", fd = fd, port = port, got = "" }
  self.servers[#self.servers + 1] = s
  return s
end

local function readable(fd)
  local r = core.io.poll({ fd }, 0)
  return r and r[1] ~= nil
end

function World:serve_servers()
  for _, s in ipairs(self.servers) do
    if s.kind == "tcp" then
      while true do
        local c = core.sock.accept(s.fd, 0)
        if not c then break end
        s.accepted = s.accepted + 1
        if s.reply then core.io.write(c, s.reply) end
        s.conns[#s.conns + 1] = c
      end
      for i = #s.conns, 1, -1 do
        local c = s.conns[i]
        while readable(c) do
          local data = core.io.read(c, 65536)
          if not data or data == "" then
            c:close()
            table.remove(s.conns, i)
            break
          end
          s.got = s.got .. data
        end
      end
    else
      while readable(s.fd) do
        local data = core.udp.recv(s.fd)
        if not data then break end
        s.got = s.got .. data .. "\n"
      end
    end
  end
end

-- A signal the caller holds (opts.signals) ends the check at its next pump, raised so
-- that the check's world is closed as any other's; kept on the world in case the check
-- catches the error.
function World:check_signals()
  local sig = self.opts.signals and core.signal.read(self.opts.signals)
  if sig then
    self.stopped = self.stopped or sig
    error({ stopped = sig }, 0)
  end
end

--- Serves the mechanism's egress loop (if any) and the check's servers for `seconds`.
function World:pump(seconds)
  local deadline = core.clock.monotime() + (seconds or 0)
  repeat
    self:check_signals()
    local slice = math.max(0, math.min(0.01, deadline - core.clock.monotime()))
    if self.mech.serve then self.mech.serve(slice) else core.io.poll({}, slice) end
    self:serve_servers()
  until core.clock.monotime() >= deadline
end

--- Runs a shell script in a box with `start` until it ends (or `timeout`, default 20 s).
-- @treturn string its stdout and stderr, or nil and the error
function World:run(box, script, timeout)
  local out = self.root .. "/out-" .. self:token()
  local ok, err = self:call("start", box.sb, { "/bin/sh", "-c", script }, { output = out })
  if not ok then return nil, err end
  local deadline = core.clock.monotime() + (timeout or 20)
  while self:call("status", box.sb) == "running" and core.clock.monotime() < deadline do self:pump(0.01) end
  self:call("stop", box.sb)
  self:pump(0)
  local text = read_file(out) or ""
  os.remove(out)
  return text
end

--- Starts a long-running script in a box (a target other boxes aim at).
function World:start(box, script)
  return self:call("start", box.sb, { "/bin/sh", "-c", script },
    { output = self.root .. "/start-" .. box.id })
end

--- Runs a shell script with `exec` (limits such as wall apply); returns output, result.
function World:exec(box, script)
  local out = self.root .. "/out-" .. self:token()
  local r, err = self:call("exec", box.sb, { "/bin/sh", "-c", script }, { output = out })
  local text = read_file(out) or ""
  os.remove(out)
  return text, r, err
end

--- Waits (serving) until `cond()` holds, at most `seconds`.
function World:wait_for(cond, seconds)
  local deadline = core.clock.monotime() + (seconds or 5)
  while core.clock.monotime() < deadline do
    if cond() then return true end
    self:pump(0.01)
  end
  return cond() and true or false
end

--- The control every tenant script ends with: the box's own storage read, written and read back.
function World.control(_, box)
  box.ctl = (box.ctl or 0) + 1
  return string.format('\nc=$(cat /storage/own 2>/dev/null) && printf %%s "$c" > /storage/ctl-%d && ' ..
    '[ "$(cat /storage/ctl-%d)" = "$c" ] && echo "CTL-OK:$c"\n', box.ctl, box.ctl)
end

--- Whether the last control of `box` succeeded, and what it did.
function World:control_ok(box, out)
  local name = "ctl-" .. tostring(box.ctl)
  local written = self:read(box, name)
  os.remove(box.dir .. "/" .. name)
  if out and out:find("CTL-OK:" .. box.own, 1, true) and written == box.own then
    return true, "own storage read and written back (seen by the host)"
  end
  return false, "own storage not read and written back" .. (out and out ~= "" and (": " .. out:sub(-160)) or
    " (no output at all)")
end

-- Which of the check's tools the tenant's own PATH lacks, asked after the attempt: a
-- refusal by a missing tool distinguishes nothing, so such a check is unavailable.
function World:tool_probe()
  if not self.tools or #self.tools == 0 then return "" end
  return "\nfor t in " .. table.concat(self.tools, " ") ..
    -- split in the script so that a tenant printing its own command line shows no marker
    "; do command -v $t >/dev/null 2>&1 || echo CF-NO''TOOL:$t; done"
end

function World:note_missing(out)
  for t in (out or ""):gmatch("CF%-NOTOOL:([%w._+-]+)\n") do
    self.missing = self.missing or {}
    if not self.missing[t] then
      self.missing[t] = true
      self.missing[#self.missing + 1] = t
    end
  end
end

--- Runs `attempt` in a subshell (so its exit ends only it), then the control, in one script.
-- @treturn string output, boolean control succeeded, string what the control did
function World:attempt(box, attempt, timeout)
  local out, err = self:run(box, "( " .. attempt .. "\n) 2>&1 </dev/null" .. self:tool_probe() .. self:control(box),
    timeout)
  if not out then return "", false, "could not start: " .. tostring(err) end
  self:note_missing(out)
  local ok, detail = self:control_ok(box, out)
  return out, ok, detail
end

-- The tenant's client: `dial.py tcp|udp HOST PORT PAYLOAD` prints `DIAL:HOST:PORT:ok:<reply>`
-- or `…:err:<errno>`; HOST `gateway` is the default route's next hop.
M.DIAL = [[
import socket, sys
kind, host, port, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
try:
    if host == "gateway":  # the default route's next hop, the way out of a routed namespace
        gw = [l.split()[2] for l in open("/proc/net/route").read().splitlines()[1:] if l.split()[1] == "00000000"]
        if not gw: raise OSError(0, "no default route")
        host = socket.inet_ntoa(bytes.fromhex(gw[0])[::-1])
    fam = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)[0]
    s = socket.socket(fam[0], fam[1])
    s.settimeout(2)
    if kind == "udp":
        s.sendto(payload, fam[4]); print("DIAL:%s:%d:sent:" % (host, port), flush=True)
    else:
        s.connect(fam[4]); s.sendall(payload + b"\n"); s.settimeout(1)
        got = b""
        try:
            while len(got) < 4096:
                d = s.recv(4096)
                if not d: break
                got += d
                if got.endswith(b"\n"): break
        except socket.timeout:
            pass
        print("DIAL:%s:%d:ok:%s" % (host, port, got.decode(errors="replace").strip()), flush=True)
except OSError as e:
    print("DIAL:%s:%d:err:%s" % (host, port, e.errno or e), flush=True)
]]

--- Puts `M.DIAL` in a box's storage and returns the command that runs it.
function World:dialer(box)
  self:write(box, "dial.py", M.DIAL)
  return "python3 /storage/dial.py"
end

--- Connects from the host (serving meanwhile, so host relays move); returns what arrived
-- within `seconds` (sooner once `expect` has), or nil and why not.
function World:host_dial(host, port, payload, seconds, expect)
  local fd, err = core.sock.connect(host, port, 2)
  if not fd then return nil, err end
  if payload then core.io.write(fd, payload) end
  local got = ""
  self:wait_for(function()
    if readable(fd) then
      local d = core.io.read(fd, 4096)
      if not d or d == "" then return true end
      got = got .. d
    end
    return expect ~= nil and got:find(expect, 1, true) ~= nil
  end, seconds or 2)
  fd:close()
  return got
end

--- A host process (a target) running `sh -c script` as `uid` when given. A target with the
-- tenant's own host id is reachable by uid alone, so only a namespace can hide it.
function World:host_process(script, env, uid)
  local devnull = assert(io.open("/dev/null", "r+"))
  local p, err = core.spawn.start({ plain = true, plain_ids = uid ~= nil, uid = uid, gid = uid, path = "/bin/sh",
                               argv = { "sh", "-c", script }, env = env or {},
                               stdin = devnull, stdout = devnull, stderr = devnull })
  devnull:close()
  if not p then return nil, err end
  self.procs[#self.procs + 1] = p
  return p
end

--- The host's first non-loopback IPv4 address, or nil (read from the kernel's FIB).
function World.host_ipv4()
  local fib = read_file("/proc/net/fib_trie") or ""
  for ip in fib:gmatch("|%-%- ([%d%.]+)\n%s+/32 host LOCAL") do
    if not ip:match("^127%.") then return ip end
  end
  return nil
end

--- Whether an executable exists on the host; the tenant's own PATH is asked by `tool_probe`.
function World.tool(name)
  for _, dir in ipairs({ "/usr/bin", "/bin", "/usr/sbin", "/sbin" }) do
    local st = core.fs.lstat(dir .. "/" .. name)
    if st then return dir .. "/" .. name end
  end
  return nil
end

function World:close()
  for _, p in ipairs(self.procs) do
    if p:running() then p:kill(9) end
    p:wait(1)
    p:close()
  end
  for _, s in ipairs(self.servers) do
    for _, c in ipairs(s.conns or {}) do c:close() end
    s.fd:close()
  end
  for _, b in ipairs(self.boxes) do self:call("destroy", b.sb) end
  core.fs.remove_tree(self.root)
end

M.World = World

return M
