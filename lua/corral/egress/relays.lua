--- The connections the egress loop relays: one core relay for every connection of every
-- sandbox, one per host process. A plane hands it each allowed connection (`connect`),
-- with the decision to log when the connection ends; each outbound connection's
-- destination (sandbox, name or IP, port) is remembered, so that `doom` can re-decide
-- destinations and reset (core `relay:reset(id)`, RST both ways) the connections of those
-- the policy no longer allows, while the others carry on. `corral.egress.loop` polls the
-- core relay (`core`) and hands what it reports to `run`; its tables are its own.
-- @module corral.egress.relays
local core = require "corral.core"

-- Loaded when first used: a run without a plane or a log (most) never emits an event.
local function events() return require "corral.egress.events" end

local M = {}

local current -- the Relays, made on first use
-- The relays a forked child left to its parent (kept, never collected: their fds are
-- the parent's, shared through the fork).
local abandoned = {}
-- By connection id: the decision logged at connect (logged again, with bytes, at the
-- end), why it was cut (`doom`, `cut`), the key (sandbox) it is counted under, and
-- what runs when its held client has sent more (`opts.on_held`).
local pending, cuts, keys, on_held = {}, {}, {}, {}
local ending = {} -- ids reset because their sandbox's plane went away
local idle_of = {} -- by connection id: its idle timeout (seconds), to say so when it ran out

local Relays = {}
Relays.__index = Relays

local function new_relays()
  return setmetatable({ relay = assert(core.relay.new()), dest_of = {}, by_key = {} }, Relays)
end

local function dest_key(dest)
  return table.concat({ dest.name or "", dest.ip or "", tostring(dest.port) }, "\0")
end

--- As core.relay's add_connect; with `dest` (`{name =, ip =, port =}`, the decision's
-- subject) the connection is remembered under that destination of sandbox opts.key.
function Relays:add_connect(client, ip, port, opts, dest)
  local id, err, errno = self.relay:add_connect(client, ip, port, opts)
  if not id then return nil, err, errno end
  if dest then
    local key, dk = opts.key, dest_key(dest)
    local dests = self.by_key[key]
    if not dests then
      dests = {}
      self.by_key[key] = dests
    end
    local d = dests[dk]
    if not d then
      d = { dest = dest, ids = {} }
      dests[dk] = d
    end
    d.ids[id] = true
    self.dest_of[id] = { key = key, dk = dk }
  end
  return id
end

--- Forgets an ended connection's destination.
function Relays:ended(id)
  local where = self.dest_of[id]
  if not where then return end
  self.dest_of[id] = nil
  local dests = self.by_key[where.key]
  local d = dests and dests[where.dk]
  if not d then return end
  d.ids[id] = nil
  if next(d.ids) == nil then dests[where.dk] = nil end
  if next(dests) == nil then self.by_key[where.key] = nil end
end

--- Live connections (connecting or relaying) counted under key, or all of them.
function Relays:count(key)
  return self.relay:count(key)
end

--- The process's relays (made on first use): `relay` is the core relay.
-- @treturn table
function M.get()
  if not current then current = new_relays() end
  return current
end

--- The core relay, which the loop polls first.
function M.core()
  return M.get().relay
end

--- In a child forked from the host (see `corral.egress.loop.forget`): leaves every
-- connection to the parent; the next use makes new relays here.
function M.forget()
  if current then abandoned[#abandoned + 1] = current end
  current, pending, cuts, keys, idle_of = nil, {}, {}, {}, {}
end

--- Live connections (connecting or relaying) counted under key (a sandbox id), or all.
-- @tparam[opt] string key
-- @treturn integer
function M.count(key)
  return M.get():count(key)
end

--- The live outbound connections of sandbox key, as their connect decisions logged
-- them (for the REPL's `connections`).
-- @tparam string key the sandbox id
-- @treturn {table,...} `{id =, name =, ip =, port =, upstream =, entry =}` each, by id
function M.connections(key)
  local out = {}
  for _, d in pairs(M.get().by_key[key] or {}) do
    for id in pairs(d.ids) do
      local ctx = pending[id] or {}
      out[#out + 1] = { id = id, name = d.dest.name, ip = d.dest.ip or ctx.ip, port = d.dest.port,
        upstream = ctx.upstream, entry = type(ctx.entry) == "table" and ctx.entry.text or ctx.entry }
    end
  end
  table.sort(out, function(a, b) return a.id < b.id end)
  return out
end

--- Relays an accepted client to ip:port (see core.relay's add_connect for opts). With
-- `dest` (`{name =, ip =, port =}`, the decision's subject) the connection is remembered
-- under that destination of sandbox `opts.key` for `recheck`; with `ctx` (the connect
-- event) its end is logged as the same decision with its byte counts. With `opts.hold`,
-- nothing the client sends is relayed until `release(id)`, and `opts.on_held(id)` runs
-- (protected: an error cuts the connection) whenever it has sent more; see `peek`.
-- @treturn[1] integer the connection id
-- @return[2] nil
-- @treturn[2] string why not
-- @return[2] integer errno
function M.connect(client, ip, port, opts, dest, ctx)
  local handler = opts.on_held
  if handler then
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.on_held, o.hold = nil, true
    opts = o
  end
  local id, err, errno = M.get():add_connect(client, ip, port, opts, dest)
  if not id then return nil, err, errno end
  pending[id], keys[id], on_held[id], idle_of[id] = ctx, opts.key, handler, opts.idle
  return id
end

--- What connection id's held client has sent so far, not consumed.
-- @tparam integer id
-- @treturn[1] string the bytes ("" when it sent nothing before its end)
-- @treturn[1] boolean whether it has ended its side (nothing more will come)
-- @return[2] nil
-- @treturn[2] string why
-- @treturn[2] integer errno (EAGAIN: nothing yet)
function M.peek(id)
  return M.get().relay:peek(id)
end

--- Relays connection id's held client from its first byte on.
function M.release(id)
  on_held[id] = nil
  return M.get().relay:release(id)
end

--- Resets connection id both ways; its end is logged as a `cut` event (verdict deny)
-- with `reason` and the bytes it had moved.
-- @tparam integer id
-- @tparam string reason
-- @treturn boolean whether a live connection was cut
function M.cut(id, reason)
  if not current then return false end
  on_held[id] = nil
  if not current.relay:reset(id) then return false end
  cuts[id] = reason -- logged when the loop reads the reset's event
  return true
end

--- Handles what the relay reports, without waiting: the end of an allowed connection is
-- the same decision, now with its byte counts (bytes = up + down), and why it failed when
-- it did; a connection `doom` or `cut` reset is logged as `cut`, with the bytes it had
-- moved. A held client's handler runs protected: an error cuts its connection.
-- @treturn integer how many events the relay reported
-- @treturn integer how many handlers raised
function M.run()
  if not current then return 0, 0 end
  local evs, raised = current.relay:run(0) or {}, 0
  for _, ev in ipairs(evs) do
    local ctx = pending[ev.id]
    local held = ev.kind == "held" and on_held[ev.id]
    if held then
      local ok, err = pcall(held, ev.id)
      if not ok then
        raised = raised + 1
        M.cut(ev.id, "first flight check failed: " .. tostring(err):sub(1, 200))
      end
    end
    -- a raced connection is logged with the address that won it
    if ev.kind == "connected" and ctx and ctx.upstreams then ctx.upstream = ctx.upstreams[ev.addr] end
    if ev.kind == "closed" or ev.kind == "failed" then
      current:ended(ev.id)
      local idle = idle_of[ev.id]
      pending[ev.id], keys[ev.id], on_held[ev.id], idle_of[ev.id] = nil, nil, nil, nil
      local gone = ending[ev.id]
      ending[ev.id] = nil
      local cut = cuts[ev.id]
      cuts[ev.id] = nil
      if ctx then
        local bytes = (ev.up or 0) + (ev.down or 0)
        if cut then
          events().emit({ sandbox = ctx.sandbox, kind = "cut", name = ctx.name, ip = ctx.ip, port = ctx.port,
            upstream = ctx.upstream, entry = ctx.entry, verdict = "deny", reason = cut,
            bytes_up = ev.up, bytes_down = ev.down, bytes = bytes })
        else
          events().emit({ sandbox = ctx.sandbox, kind = ev.kind, name = ctx.name, ip = ctx.ip, port = ctx.port,
            upstream = ctx.upstream, entry = ctx.entry, verdict = "allow",
            reason = (ev.kind == "failed" or M.out_of_fds(ev.err)) and M.failure(ev, ctx, gone)
              -- the relay's idle timer, not either end, closed it (as a UDP flow's is said)
              or (ev.kind == "closed" and ev.err == core.errno.ETIMEDOUT and (idle or 0) > 0 and
                string.format("idle for %g s", idle)) or ctx.reason,
            bytes_up = ev.up, bytes_down = ev.down, bytes = bytes })
        end
      end
    end
  end
  return #evs, raised
end

--- Whether errno `err` is this host running out of file descriptors (EMFILE: this
-- process's RLIMIT_NOFILE; ENFILE: the system's), which is no answer from any upstream.
-- @tparam integer|nil err
-- @treturn boolean
function M.out_of_fds(err)
  return err ~= nil and (err == core.errno.EMFILE or err == core.errno.ENFILE)
end

--- The words for this host out of file descriptors.
-- @tparam string detail what failed and its error ("accept: Too many open files")
-- @treturn string
function M.fd_shortage(detail)
  return string.format("corral is out of file descriptors (%s): raise its RLIMIT_NOFILE (ulimit -n) or "
    .. "lower --max-connections", tostring(detail))
end

--- Why a connection's upstream never connected, in words: "upstream: Connection refused
-- (10.1.2.3)", naming every address that was tried; or why this host could not carry
-- it (out of file descriptors), which no upstream is blamed for.
-- @tparam table ev the relay's failed (or closed) event (`err`, `msg`)
-- @tparam table ctx the connect decision (`upstream`, `upstreams`)
-- @tparam[opt] boolean gone the sandbox ended while it was still connecting
-- @treturn string
function M.failure(ev, ctx, gone)
  local tried = ctx.upstreams and table.concat(ctx.upstreams, ", ") or ctx.upstream
  if gone and ev.kind == "failed" then
    return "upstream: no answer before the sandbox ended" .. (tried and (" (" .. tried .. ")") or "")
  end
  if M.out_of_fds(ev.err) then
    return M.fd_shortage((ev.kind == "failed" and "connecting to " .. tostring(tried) or "relaying") .. ": "
      .. tostring(ev.msg or ev.err))
  end
  return "upstream: " .. tostring(ev.msg or ev.err) .. (tried and (" (" .. tried .. ")") or "")
end

--- Resets both ways the connections of a sandbox still open (its own and its inbound
-- service's); each is logged as it ends (`run`), with the bytes it moved.
-- @tparam[opt] string sandbox its id (nil: none)
-- @treturn integer how many were reset
function M.reset_sandbox(sandbox)
  if not current then return 0 end
  local inbound, open = sandbox and sandbox .. "/inbound", {}
  for id, key in pairs(keys) do
    if key == sandbox or key == inbound then open[#open + 1] = id end
  end
  table.sort(open)
  for _, id in ipairs(open) do
    ending[id] = true
    current.relay:reset(id)
  end
  return #open
end

--- Re-decides the open outbound connections of sandbox `id` with `plane:redecide(dest)`
-- (nil while allowed, else why not) and resets (RST, both ways) every connection whose
-- destination it no longer allows; each is logged as a `cut` when `run` reads its end.
-- @tparam string id the sandbox id
-- @tparam table plane its plane (`corral.egress.plane`, or any table with `redecide`)
-- @treturn integer how many connections were cut
function M.doom(id, plane)
  if not current then return 0 end
  local n, doomed = 0, {}
  for _, d in pairs(current.by_key[id] or {}) do
    -- fail closed: a re-decision that raises is a deny
    local ok, why = pcall(plane.redecide, plane, d.dest)
    if not ok then why = "re-decision failed: " .. tostring(why):sub(1, 200) end
    if why then
      for cid in pairs(d.ids) do doomed[#doomed + 1] = { cid, why } end
    end
  end
  table.sort(doomed, function(a, b) return a[1] < b[1] end)
  for _, c in ipairs(doomed) do
    if current.relay:reset(c[1]) then
      on_held[c[1]] = nil
      cuts[c[1]] = "cut: " .. c[2]
      n = n + 1
    end
  end
  return n
end

return M
