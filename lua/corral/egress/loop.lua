--- The one event loop per host process that drives every sandbox's egress plane: the
-- relay's epoll fd, each plane's responder and acceptor, and whatever the caller waits
-- on (a tenant's pidfd), polled together. Lua decisions run here, on this loop.
--
-- The loop serves every sandbox of the host, and every event on it carries tenant input,
-- so each handler runs protected: an error is logged as a deny event (kind `error`) and
-- counted in `errors`, and the loop and the other sandboxes carry on. Any number of fds
-- is polled (in batches past `POLL_MAX`), and an fd closed under the loop is skipped.
--
-- Relays: one core relay for every connection of every sandbox, one epoll loop per host
-- process. A plane hands it each allowed connection (`connect`), with the decision to log
-- when the connection ends; the loop remembers each outbound connection's destination
-- (sandbox, name or IP, port), so that `recheck` can re-decide destinations and reset
-- (core `relay:reset(id)`, RST both ways) the connections of those the policy no longer
-- allows, while the others carry on. Its tables are its own: others call its functions.
-- @module corral.egress.loop
local core = require "corral.core"
local turns = require "corral.egress.turns"
local proctree = require "corral.proctree"

-- Loaded when first used: a run without a plane or a log (most) never emits an event,
-- and loading the module cost ~0.13 ms of each `corral run`.
local function events() return require "corral.egress.events" end

local M = {}

local state
-- By connection id: the decision logged at connect (logged again, with bytes, at the
-- end), why it was cut (`recheck`, `cut`), the key (sandbox) it is counted under, and
-- what runs when its held client has sent more (`opts.on_held`).
local pending, cuts, keys, on_held = {}, {}, {}, {}
local ending = {} -- ids reset because their sandbox's plane went away
local idle_of = {} -- by connection id: its idle timeout (seconds), to say so when it ran out

local Relays = {}
Relays.__index = Relays
local relay_events -- below: handles what the relay reports

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

--- The process-wide loop (created on first use), for diagnostics: `relay:count(key)`.
function M.get()
  if not state then
    state = { relay = new_relays(), planes = {} }
  end
  return state
end

--- Live connections (connecting or relaying) counted under key (a sandbox id), or all.
-- @tparam[opt] string key
-- @treturn integer
function M.count(key)
  return M.get().relay:count(key)
end

--- The live outbound connections of sandbox key, as their connect decisions logged
-- them (for the REPL's `connections`).
-- @tparam string key the sandbox id
-- @treturn {table,...} `{id =, name =, ip =, port =, upstream =, entry =}` each, by id
function M.connections(key)
  local out = {}
  for _, d in pairs(M.get().relay.by_key[key] or {}) do
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
  local id, err, errno = M.get().relay:add_connect(client, ip, port, opts, dest)
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
  return M.get().relay.relay:peek(id)
end

--- Relays connection id's held client from its first byte on.
function M.release(id)
  on_held[id] = nil
  return M.get().relay.relay:release(id)
end

--- Resets connection id both ways; its end is logged as a `cut` event (verdict deny)
-- with `reason` and the bytes it had moved.
-- @tparam integer id
-- @tparam string reason
-- @treturn boolean whether a live connection was cut
function M.cut(id, reason)
  if not state then return false end
  on_held[id] = nil
  if not state.relay.relay:reset(id) then return false end
  cuts[id] = reason -- logged when the loop reads the reset's event
  return true
end

--- Serves a plane (`corral.egress.plane`, or any table like it): each step polls what
-- `plane:watch()` lists — `{fd =, on = handler called without arguments, conn = true for
-- a connection (polled after the listeners), owner = sandbox id?}` each — and `recheck`
-- asks `plane:redecide(dest)`.
-- @tparam table plane with `id`
function M.add(plane)
  M.get().planes[plane] = true
  M.changed()
end

-- Bumped by `changed`: the polled list is rebuilt when it moved (see `step`).
local version = 0

--- Says that a served object's `watch()` list is no longer what it was (an fd added or
-- removed, a deadline moved). An object whose `watch_notifies` is true calls it on every
-- such change, and its list is then built once and polled as is until the next call or
-- its `deadline()` passes; any other object's list is rebuilt at every turn.
function M.changed()
  version = version + 1
end

-- The loop a forked child left to its parent (kept, never collected: its objects are
-- the parent's, shared through the fork).
local abandoned = {}

--- In a child forked from the host (a custom mechanism's watched exec,
-- corral.mechanism.watch): leaves every plane, connection and control socket served so
-- far to the parent, which goes on serving them, and starts an empty loop here. Two
-- processes polling one epoll set and the same listeners would each take the other's
-- events.
function M.forget()
  if state then abandoned[#abandoned + 1] = state end
  state, pending, cuts, keys, idle_of = nil, {}, {}, {}, {}
  M.changed()
end

--- The planes currently served, for the REPL.
function M.planes()
  local out = {}
  for p in pairs(M.get().planes) do out[#out + 1] = p end
  return out
end

-- What the relay reports: the end of an allowed connection is the same decision, now
-- with its byte counts (bytes = up + down), and why it failed when it did; a connection
-- `recheck` reset is logged as `cut`, with the bytes it had moved.
relay_events = function(loop)
  local evs = loop.relay.relay:run(0) or {}
  for _, ev in ipairs(evs) do
    local ctx = pending[ev.id]
    local held = ev.kind == "held" and on_held[ev.id]
    if held then
      local ok, err = pcall(held, ev.id)
      if not ok then
        M.errors = M.errors + 1
        M.cut(ev.id, "first flight check failed: " .. tostring(err):sub(1, 200))
      end
    end
    -- a raced connection is logged with the address that won it
    if ev.kind == "connected" and ctx and ctx.upstreams then ctx.upstream = ctx.upstreams[ev.addr] end
    if ev.kind == "closed" or ev.kind == "failed" then
      loop.relay:ended(ev.id)
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
  return #evs
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

--- Stops serving a plane. Its sandbox's connections still open (an upstream that never
-- closes outlives the tenant) are reset both ways, and each is logged as it ends, with
-- the bytes it moved: no allowed connection goes without its closing record.
-- @tparam table plane with `id`
function M.remove(plane)
  if not state then return end
  state.planes[plane] = nil
  M.changed()
  relay_events(state) -- the ends already under way are logged as they happened
  local inbound, open = plane.id and plane.id .. "/inbound", {}
  for id, key in pairs(keys) do
    if key == plane.id or key == inbound then open[#open + 1] = id end
  end
  table.sort(open)
  for _, id in ipairs(open) do
    ending[id] = true
    state.relay.relay:reset(id)
  end
  if #open > 0 then relay_events(state) end
end

--- Handles what the relay has ready, without waiting, until it reports nothing or
-- `seconds` have passed: the ends of connections a tenant closed just before it exited.
-- @tparam[opt=0.1] number seconds
function M.drain(seconds)
  if not state then return end
  local deadline = core.clock.monotime() + (seconds or 0.1)
  while relay_events(state) > 0 and core.clock.monotime() < deadline do end
end

--- Re-decides the open outbound connections of sandbox `id` with its plane's current
-- policy, and resets (RST, both ways) every connection whose destination it no longer
-- allows; each is logged as a `cut` event (verdict deny, the new decision's reason,
-- the bytes it had moved).
-- @tparam string id the sandbox id
-- @treturn integer how many connections were cut
function M.recheck(id)
  if not state then return 0 end
  local plane
  for p in pairs(state.planes) do
    if p.id == id then plane = p end
  end
  if not plane then return 0 end
  local relays, n = state.relay, 0
  local doomed = {}
  for _, d in pairs(relays.by_key[id] or {}) do
    -- fail closed: a re-decision that raises is a deny
    local ok, why = pcall(plane.redecide, plane, d.dest)
    if not ok then why = "re-decision failed: " .. tostring(why):sub(1, 200) end
    if why then
      for cid in pairs(d.ids) do doomed[#doomed + 1] = { cid, why } end
    end
  end
  table.sort(doomed, function(a, b) return a[1] < b[1] end)
  for _, c in ipairs(doomed) do
    if relays.relay:reset(c[1]) then
      on_held[c[1]] = nil
      cuts[c[1]] = "cut: " .. c[2]
      n = n + 1
    end
  end
  relay_events(state) -- the resets' own events: logged as cut, with their bytes
  return n
end

-- An fd the loop may hand to poll: present, and not closed under it.
local function fileno(fd) return fd:fileno() end

local function usable(fd)
  if fd == nil then return false end
  local ok, n = pcall(fileno, fd)
  return not ok or n ~= nil
end

-- A raise in a handler is one bad event, never the host's end: it is logged as a deny
-- (naming the sandbox when the handler belongs to one) and the loop carries on.
local function run_handler(fn, sandbox, ...)
  local ok, err = xpcall(fn, debug.traceback, ...)
  if ok then return end
  M.errors = M.errors + 1
  pcall(events().emit, { sandbox = sandbox, kind = "error", verdict = "deny",
    reason = "egress loop: " .. tostring(err):match("^[^\n]*"):sub(1, 300) })
end

--- Handler errors caught so far (each was logged as a deny event).
M.errors = 0

--- At most this many fds go to one poll(2) call (`core.io.poll`'s own limit).
M.POLL_MAX = 256

-- Polls any number of fds: one call when they fit, else the first batch (the relay, the
-- listeners and the caller's: they are put first) waits and every batch is then swept
-- without waiting, so no fd is starved and none makes core.io.poll raise. In one call,
-- the relay (fds[1]) moves its connections' bytes while it waits (core.relay's poll):
-- the turn comes back here only for an fd of the list, a relay event or the timeout.
-- Measured with scripts/bench/egress-curl: a request took ~6 turns of this loop, its
-- request and its answer crossing in two of them (each ~20-40 us of Lua on the first
-- byte's path); now ~3.4 (its DNS answers, the accept, the end), p50 added ~25 us less.
local function poll_all(fds, timeout)
  if #fds <= M.POLL_MAX then return fds[1]:poll(fds, timeout) or {} end
  local ready, batches = {}, {}
  for i = 1, #fds, M.POLL_MAX do batches[#batches + 1] = { i, math.min(#fds, i + M.POLL_MAX - 1) } end
  local function sweep(wait)
    for n, b in ipairs(batches) do
      local hit = core.io.poll(table.move(fds, b[1], b[2], 1, {}), n == 1 and wait or 0) or {}
      for _, i in ipairs(hit) do ready[#ready + 1] = b[1] + i - 1 end
    end
  end
  sweep(0)
  -- Nothing ready anywhere: wait on the first batch, briefly, so that the later ones
  -- (DNS-over-TCP connections) are swept again within 50 ms.
  if #ready == 0 then sweep(math.min(timeout or 0.05, 0.05)) end
  return ready
end

local function relay_ready() relay_events(M.get()) end

-- Whether list (the extra fds a caller polls) is the one `built` holds, entry by entry.
local function same_extra(built, list)
  local n = list and #list or 0
  if built.n_extra ~= n then return false end
  for i = 1, n do
    if built.extra[i] ~= list[i] then return false end
  end
  return true
end

-- The list one turn polls, with each fd's handler and owner: the relay first, then the
-- planes' listeners, then the caller's extra fds, then the planes' connections; and the
-- soonest deadline of a plane (a held connection's wait). Built from every plane's
-- watch() only when one may have changed it (`changed`, a deadline passed, a plane that
-- does not notify), else reused: the rebuild was ~15-30 us of each turn, measured with
-- scripts/bench/egress-curl, and a request takes several turns.
local built
local function poll_list(loop, extra, now)
  if built and built.version == version and not built.volatile and built.loop == loop
    and not (built.soonest and now >= built.soonest) and same_extra(built, extra) then
    return built
  end
  local fds, handlers, owners = { loop.relay.relay }, { relay_ready }, { false }
  local later, volatile = {}, false
  local at = version
  for plane in pairs(loop.planes) do
    volatile = volatile or not plane.watch_notifies
    for _, w in ipairs(plane:watch()) do
      -- a plane's fd closed or cleared under the loop is skipped, never handed to poll
      if usable(w.fd) then
        if w.conn then
          later[#later + 1] = w
        else
          local n = #fds + 1
          fds[n], handlers[n], owners[n] = w.fd, w.on, plane.id or false
        end
      end
    end
  end
  local first_extra = #fds + 1
  local n_extra = extra and #extra or 0
  for i = 1, n_extra do fds[#fds + 1] = extra[i] end
  local first_later = #fds + 1
  for _, w in ipairs(later) do
    local n = #fds + 1
    fds[n], handlers[n], owners[n] = w.fd, w.on, w.owner or false
  end
  -- a plane's held connection whose wait ends sooner shortens the wait (see acceptor)
  local soonest
  for plane in pairs(loop.planes) do
    local d = plane.deadline and plane:deadline()
    if d and (not soonest or d < soonest) then soonest = d end
  end
  built = { fds = fds, handlers = handlers, owners = owners, first_extra = first_extra, first_later = first_later,
    soonest = soonest, loop = loop, extra = table.move(extra or {}, 1, n_extra, 1, {}), n_extra = n_extra,
    -- a watch() that changed the list (a held connection's wait ended) calls for another look
    version = version == at and version or -1, volatile = volatile }
  return built
end

--- Waits up to timeout seconds for work, handles it, and returns which of `extra` (a list
-- of fds or objects with :fileno()) became readable, as a set of indices.
function M.step(timeout, extra)
  local loop = M.get()
  local list = poll_list(loop, extra, core.clock.monotime())
  local fds, handlers, owners, first_extra, first_later = list.fds, list.handlers, list.owners, list.first_extra,
    list.first_later
  local soonest = list.soonest
  if soonest and timeout and timeout >= 0 then
    timeout = math.max(0, math.min(timeout, soonest - core.clock.monotime()))
  end
  local ok, ready = pcall(poll_all, fds, timeout)
  if not ok then
    -- an object closed under the list it was built with: look at every plane again
    built = nil
    list = poll_list(loop, extra, core.clock.monotime())
    fds, handlers, owners, first_extra, first_later = list.fds, list.handlers, list.owners, list.first_extra,
      list.first_later
    ready = poll_all(fds, 0)
  end
  local now = core.clock.monotime()
  for plane in pairs(loop.planes) do
    if plane.tick then run_handler(plane.tick, plane.id, plane, now) end
  end
  local hit, handled = {}, false
  for _, i in ipairs(ready) do
    if i >= first_extra and i < first_later then
      hit[i - first_extra + 1] = true
    else
      run_handler(handlers[i], owners[i] or nil)
      handled = handled or i > 1
    end
  end
  -- What the handlers just started (an upstream connect to a near server, a released
  -- client) is often ready already: relayed in this turn rather than the next.
  if handled then run_handler(relay_ready) end
  -- the event log's rate limiters, once something loaded it (a plane, a log)
  turns.run()
  return hit
end

--- Serves the loop for `seconds` (for hosts that run a sandbox started with `start`
-- and want its connections relayed while they wait).
function M.serve(seconds)
  local deadline = core.clock.monotime() + (seconds or 0)
  repeat M.step(math.max(0, math.min(1, deadline - core.clock.monotime()))) until core.clock.monotime() >= deadline
end

--- Whether a forwarded signal starts the grace after which the sandbox is killed:
-- SIGTERM and SIGHUP at once (a supervisor or a hang-up ends the sandbox whatever it
-- handles); SIGINT the second time, or the first when every process of the sandbox
-- ignores it (`ignored`: Ctrl-C would do nothing at all). A command that handles Ctrl-C
-- (a shell, a REPL) runs on after one, as at a terminal.
-- @tparam integer sig the signal just forwarded
-- @tparam integer interrupts how many SIGINTs were forwarded, this one included
-- @tparam[opt] function ignored asked only for a first SIGINT: whether the sandbox ignores it
-- @treturn boolean
function M.starts_grace(sig, interrupts, ignored)
  if sig == 2 then return interrupts >= 2 or (ignored ~= nil and ignored()) end
  return true
end

--- Waits for a sandbox process: serving the loop meanwhile (opts.serve), up to
-- opts.wall seconds, forwarding the signals that arrive on opts.signals (a
-- core.signal.fd) to it, or handing each to opts.deliver(sig), which answers false
-- while it cannot deliver yet (it is asked again a tenth of a second later, in order,
-- until the process ends), and calling each of opts.feeds' `on()` when its `fd` is
-- readable (and once more after the process ended; `on` returns false at the feed's
-- end). With opts.grace, the deadline also comes that many seconds after the first
-- forwarded signal that starts the grace (`starts_grace`). Returns its code and how it ended, or proc:wait's nil, msg,
-- ETIMEDOUT while it still runs at the deadline, then the forwarded signal's number
-- when it was the grace, not the wall, that ran out.
-- @tparam userdata proc a corral.process
-- @tparam[opt] table opts `{serve =, wall =, signals =, deliver =, grace =, feeds = {{fd =, on =}, ...}}`
function M.wait(proc, opts)
  opts = opts or {}
  local feeds = opts.feeds or {}
  -- Whatever is added to the loop (a run's control socket, corral.control) is served
  -- too, egress plane or not.
  local serve = opts.serve or next(M.get().planes) ~= nil
  if not serve and not opts.signals and #feeds == 0 then return proc:wait(opts.wall) end
  local deadline = opts.wall and core.clock.monotime() + opts.wall
  local extra, fed, signals_at = { proc }, {}, nil
  if opts.signals then
    extra[2], signals_at = opts.signals, 2
  end
  for _, f in ipairs(feeds) do
    extra[#extra + 1] = f.fd
    fed[#extra] = f.on
  end
  local function drain_feeds()
    for _, f in ipairs(feeds) do f.on() end
  end
  local deliver = opts.deliver or function(sig)
    proc:kill(sig)
    return true
  end
  local signalled, undelivered, interrupts = nil, {}, 0
  while true do
    local left = deadline and deadline - core.clock.monotime()
    if left and left <= 0 then
      drain_feeds()
      local code, msg, errno = proc:wait(0)
      if code == nil and signalled then return nil, msg, errno, signalled end
      return code, msg, errno
    end
    local timeout = math.min(left or 1, undelivered[1] and 0.1 or 1)
    local hit
    if serve then
      hit = M.step(timeout, extra)
    else
      hit = {}
      for _, i in ipairs(core.io.poll(extra, timeout) or {}) do hit[i] = true end
    end
    if signals_at and hit[signals_at] then
      local sig = core.signal.read(opts.signals)
      if sig then
        undelivered[#undelivered + 1] = sig
        if sig == 2 then interrupts = interrupts + 1 end
        if opts.grace and not signalled and
          M.starts_grace(sig, interrupts, function() return proctree.all_ignore(proc:pid(), sig) end) then
          signalled = sig
          local at = core.clock.monotime() + opts.grace
          if not deadline or at < deadline then deadline = at end
        end
      end
    end
    while undelivered[1] and deliver(undelivered[1]) do table.remove(undelivered, 1) end
    for i, on in pairs(fed) do
      -- a feed at its end (false) is polled no more: a hung-up pipe is always readable
      if hit[i] and on() == false then fed[i], extra[i] = nil, proc end
    end
    if hit[1] or not proc:running() then
      if opts.serve then M.drain() end
      drain_feeds()
      return proc:wait()
    end
  end
end

return M
