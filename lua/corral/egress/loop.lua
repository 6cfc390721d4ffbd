--- The one event loop per host process that drives every sandbox's egress plane: the
-- relay's epoll fd, each plane's responder and acceptor, and whatever the caller waits
-- on (a tenant's pidfd), polled together. Lua decisions run here, on this loop.
--
-- The loop serves every sandbox of the host, and every event on it carries tenant input,
-- so each handler runs protected: an error is logged as a deny event (kind `error`) and
-- counted in `errors`, and the loop and the other sandboxes carry on. Any number of fds
-- is polled (in batches past `POLL_MAX`), and an fd closed under the loop is skipped.
--
-- Relays: one core relay for every connection of every sandbox (`corral.egress.relays`,
-- which remembers each connection's decision and destination); the loop polls it first
-- and, at `recheck`, has it reset the connections of the destinations a sandbox's plane
-- no longer allows. Its tables are its own: others call its functions.
-- @module corral.egress.loop
local core = require "corral.core"
local relays = require "corral.egress.relays"
local turns = require "corral.egress.turns"
local proctree = require "corral.proctree"

-- Loaded when first used: a run without a plane or a log (most) never emits an event,
-- and loading the module cost ~0.13 ms of each `corral run`.
local function events() return require "corral.egress.events" end

local M = {}

local state

--- The process-wide loop (created on first use): the planes it serves.
function M.get()
  if not state then
    state = { planes = {} }
  end
  return state
end

--- Live connections (connecting or relaying) counted under key (a sandbox id), or all
-- (`corral.egress.relays.count`, which the REPL asks through the loop).
-- @tparam[opt] string key
-- @treturn integer
function M.count(key)
  return relays.count(key)
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
  state = nil
  relays.forget()
  M.changed()
end

--- The planes currently served, for the REPL.
function M.planes()
  local out = {}
  for p in pairs(M.get().planes) do out[#out + 1] = p end
  return out
end

-- What the relay reports (`corral.egress.relays.run`); a held client's handler that
-- raised is counted with the loop's errors.
local function relay_events()
  local n, raised = relays.run()
  M.errors = M.errors + raised
  return n
end

--- Stops serving a plane. Its sandbox's connections still open (an upstream that never
-- closes outlives the tenant) are reset both ways, and each is logged as it ends, with
-- the bytes it moved: no allowed connection goes without its closing record.
-- @tparam table plane with `id`
function M.remove(plane)
  if not state then return end
  state.planes[plane] = nil
  M.changed()
  relay_events() -- the ends already under way are logged as they happened
  if relays.reset_sandbox(plane.id) > 0 then relay_events() end
end

--- Handles what the relay has ready, without waiting, until it reports nothing or
-- `seconds` have passed: the ends of connections a tenant closed just before it exited.
-- @tparam[opt=0.1] number seconds
function M.drain(seconds)
  if not state then return end
  local deadline = core.clock.monotime() + (seconds or 0.1)
  while relay_events() > 0 and core.clock.monotime() < deadline do end
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
  local n = relays.doom(id, plane)
  relay_events() -- the resets' own events: logged as cut, with their bytes
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

local function relay_ready() relay_events() end


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
  local fds, handlers, owners = { relays.core() }, { relay_ready }, { false }
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
