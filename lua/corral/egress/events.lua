--- Egress events: every decision, delivered to subscribers and kept in a ring.
--
-- An event is a flat table: `{time =, sandbox =, kind =, name =, ip =, port =, verdict =,
-- reason =, bytes =}` plus any other scalar fields the emitter adds (`entry`, `upstream`,
-- `answer`, `qtype`, `bytes_up`, `bytes_down`, `count`, …). `emit` copies it: scalar
-- fields only, `sandbox` as its id when given a sandbox table, `ip` (and `upstream`),
-- always given as text, in canonical text (quoted when not an address), `time`
-- defaulting to now (seconds since the epoch, with microseconds: `now`) and `epoch` to
-- its sandbox's policy epoch now (see `corral.egress.registry`; absent for a sandbox
-- without a policy). Subscribers are called in order, each protected: a subscriber that raises is counted (`failures`),
-- never stops the others, and never reaches the caller of `emit`, whose decision stands.
--
-- The fields, by kind (a Lua event lacks a field that does not apply; its JSON line
-- carries `sandbox, name, ip, port, verdict, reason, bytes` always, `null` when absent):
--
-- - `dns`: name (as asked, \ddd escapes, once), ip = the synthetic address answered
--   (null otherwise), port = null, verdict, reason (for an answer: "allowed by ENTRY"),
--   bytes = 0, plus `answer` (answered, nxdomain, refused, nodata, servfail, formerr,
--   notimp, dropped) and `qtype`.
-- - `connect` (and `inbound`): the decision; bytes = 0 (nothing relayed yet, or ever).
--   A connection the ruleset refused at its SYN (no entry names its port: it never
--   reaches the acceptor) is a `connect` deny with `by = "ruleset"` and `count`, the SYNs
--   to that destination since the last such line (the plane reads the ruleset's record
--   once a second and when it closes; see `corral.egress.plane`).
-- - `closed` / `failed`: the end of an allowed connection, verdict allow, bytes = up +
--   down as relayed (also `bytes_up`, `bytes_down`).
-- - `cut`: an open connection reset because its destination is no longer allowed
--   (`corral.egress.revoke(sb, entry, {cut = true})`); verdict deny; bytes = up + down
--   moved before the cut (the relay reports them with the reset). A UDP flow's cut
--   carries `protocol = "udp"`.
-- - `udp`: the decision on a UDP flow (its first datagram; `corral.egress.udp`), with
--   `protocol = "udp"`, ip = the destination the tenant wrote to (a synthetic address
--   for a name), `upstream` once allowed; bytes = 0. A datagram the ruleset refused (no
--   `udp:` entry names its port) is a `udp` deny with `by = "ruleset"` and `count`, the
--   datagrams to that destination since the last such line, as for a refused SYN.
-- - `udp_closed`: the end of an allowed UDP flow (idle, or the sandbox ended), verdict
--   allow, bytes = up + down (also `bytes_up`, `bytes_down`), `count` the datagrams
--   relayed both ways, `dropped` those that could not be.
-- - `error`: a handler that raised; verdict deny, bytes = 0.
-- - `suppressed`: see below.
--
-- The state (subscribers, ring, counters) is process-wide, as the event loop is.
--
-- Volume: a tenant decides how many events there are (one per DNS query, one per
-- connection attempt), so a file would grow as fast as a tenant sends. Subscribers and
-- the ring see every event — they are the operator's own code and memory, and a bound
-- there would hide what a policy hook must see. What reaches a *file* is bounded:
-- `json_lines_writer` passes, per sandbox per second, at most `LOG_RATE` (200) events of
-- each class — `dns` (queries), `connect` (allowed connections as they open), `closed`
-- (their closed/failed/cut records, with the bytes), `refused` (connection denials,
-- handler errors), `udp` (UDP flow decisions) and `udp_closed` (UDP flows' ends, with
-- the bytes) — so that a flood of one class can never push another out of the log
-- (tests/egress_log_spec.lua: a DNS flood leaves the connection decisions in the file, a
-- flood of new connections the byte counts of those ending). The rest is counted: one
-- `suppressed` line per sandbox, per class and verdict, for each second that dropped
-- any, with the count and the sum of the dropped events' bytes (so no relayed byte
-- leaves the log). A file thus takes at most 6 × 200 + 11 lines per sandbox per second;
-- an `encode`d line is 210-340 bytes (a DNS deny, a closing record), 1.4 kB at most (a
-- name of 250 escaped octets): about 0.25 MB/s per sandbox at the full budget, 1.1 MB/s
-- in the worst case. The log file is mode 0600: it records what a tenant did (a new file
-- is created so, an existing one is tightened to it; the path `-` is standard output).
-- @module corral.egress.events
local core = require "corral.core"
local address = require "corral.egress.address"
-- Loaded when the first event is formatted: the loop loads this module in every run,
-- most of which emit nothing.
local function json() return require "corral.json" end

local M = {}

--- Default number of events the ring keeps.
M.RING_SIZE = 256

--- Events per sandbox per second, of each class, that `json_lines_writer` writes by default.
M.LOG_RATE = 200

--- The classes a file's budget is kept for, each its own (see `class`).
M.LOG_CLASSES = { "dns", "connect", "closed", "refused", "udp", "udp_closed" }

--- Fields every JSON line carries (null when the event has none).
M.LOG_FIELDS = { "sandbox", "name", "ip", "port", "verdict", "reason", "bytes" }

local subscribers = {}
local ring, ring_size, ring_next, ring_count = {}, M.RING_SIZE, 1, 0
local failed, last_error = 0, nil

local FIELD_ORDER = { "time", "epoch", "sandbox", "kind", "protocol", "name", "ip", "port", "verdict", "reason",
  "bytes", "entry", "by", "count", "answer", "qtype", "upstream", "bytes_up", "bytes_down", "dropped", "class",
  "suppressed" }

--- Now, in seconds since the epoch with microseconds (a log line's `time`).
-- @treturn number
function M.now()
  return math.floor(core.relay.walltime() * 1e6 + 0.5) / 1e6
end

-- Live limiters and their summary writers; weak, so a limiter goes with its subscriber.
local limiters = setmetatable({}, { __mode = "k" })

local function callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and type(mt.__call) == "function"
end

--- Adds a subscriber, called with a copy of each event; the same function twice is one.
-- @tparam function fn
-- @treturn function fn (the token for `unsubscribe`)
function M.subscribe(fn)
  if not callable(fn) then error("subscribe: expected a function, got " .. type(fn), 2) end
  for _, s in ipairs(subscribers) do
    if s.fn == fn then return fn end
  end
  subscribers[#subscribers + 1] = { fn = fn, failures = 0 }
  return fn
end

--- Removes a subscriber.
-- @tparam function fn
-- @treturn boolean whether it was subscribed
function M.unsubscribe(fn)
  for i, s in ipairs(subscribers) do
    if s.fn == fn then
      table.remove(subscribers, i)
      return true
    end
  end
  return false
end

local SCALAR = { string = true, number = true, boolean = true }

-- The text form of each address logged, remembered (corral.memo; at most 1,024): a
-- request logs its few addresses several times (measured: the log's normalisation was
-- ~30 % of the Lua work of a request through `corral run --allow`,
-- scripts/bench/egress-curl).
local address_text = require("corral.memo").bounded(function(ip)
  return address.address_text(ip) or string.format("%q", ip)
end, 1024)

local registry -- corral.egress.registry, loaded at the first event that names a sandbox

local function normalize(event)
  local ev = {}
  for k, v in pairs(event) do
    if SCALAR[type(v)] and type(k) == "string" then ev[k] = v end
  end
  local sb = event.sandbox
  if type(sb) == "table" then ev.sandbox = sb.id end
  if type(ev.ip) == "string" then ev.ip = address_text(ev.ip) end
  if type(ev.upstream) == "string" then ev.upstream = address_text(ev.upstream) end
  ev.time = ev.time or M.now()
  if ev.epoch == nil and type(ev.sandbox) == "string" then
    -- loaded here, not at the top: the registry's modules must never wait on this one
    registry = registry or require "corral.egress.registry"
    local epoch = registry.process:epoch(ev.sandbox)
    if epoch > 0 then ev.epoch = epoch end
  end
  return ev
end

--- Emits an event to every subscriber and records it in the ring.
-- @tparam table event
-- @treturn integer how many subscribers took it without raising
function M.emit(event)
  if type(event) ~= "table" then error("emit: expected a table, got " .. type(event), 2) end
  local ev = normalize(event)
  ring[ring_next] = ev
  ring_next = ring_next % ring_size + 1
  if ring_count < ring_size then ring_count = ring_count + 1 end
  local delivered = 0
  -- a snapshot: a subscriber may unsubscribe (itself or another) while being called
  for _, s in ipairs(table.move(subscribers, 1, #subscribers, 1, {})) do
    local ok, err = pcall(s.fn, ev)
    if ok then
      delivered = delivered + 1
    else
      s.failures = s.failures + 1
      failed = failed + 1
      last_error = tostring(err)
    end
  end
  return delivered
end

--- Subscriber failures so far.
-- @treturn integer how many calls raised
-- @treturn string|nil the last error
function M.failures()
  return failed, last_error
end

--- The most recent events, oldest first.
-- @tparam[opt] integer n at most this many (default: all the ring holds)
-- @treturn {table,...}
function M.recent(n)
  n = math.min(n or ring_count, ring_count)
  local out = {}
  for i = n, 1, -1 do
    out[#out + 1] = ring[(ring_next - i - 1) % ring_size + 1]
  end
  return out
end

--- Empties the ring and sets its size (for the REPL and the tests); subscribers stay.
-- @tparam[opt] integer size (default `RING_SIZE`)
function M.reset(size)
  size = size or M.RING_SIZE
  if math.type(size) ~= "integer" or size < 1 then error("reset: size must be a positive integer", 2) end
  ring, ring_size, ring_next, ring_count = {}, size, 1, 0
  failed, last_error = 0, nil
end

--- Encodes an event as one line of JSON, every field of `LOG_FIELDS` present (null if absent).
-- @tparam table event
-- @treturn string
function M.encode(event)
  local ev = {}
  for k, v in pairs(event) do ev[k] = v end
  for _, k in ipairs(M.LOG_FIELDS) do
    if ev[k] == nil then ev[k] = json().null end
  end
  return json().encode(ev, { keyorder = FIELD_ORDER })
end

--- The budget class of an event: `dns` for DNS answers; `closed` for the end of an
-- allowed connection (closed, failed or cut, with its bytes); `connect` for an allowed
-- connect or inbound; `udp` for a UDP flow's decision and `udp_closed` for its end (or
-- cut); `refused` for everything else (denied connections, handler errors).
-- @tparam table ev
-- @treturn string
function M.class(ev)
  local kind = ev.kind
  if kind == "dns" then return "dns" end
  if kind == "udp" then return "udp" end
  if kind == "udp_closed" or (kind == "cut" and ev.protocol == "udp") then return "udp_closed" end
  if kind == "closed" or kind == "failed" or kind == "cut" then return "closed" end
  if ev.verdict == "allow" then return "connect" end
  return "refused"
end

local function rates(rate, what)
  local out = {}
  for _, c in ipairs(M.LOG_CLASSES) do
    local r = rate
    if type(rate) == "table" then r = rate[c] == nil and M.LOG_RATE or rate[c] end
    if math.type(r) ~= "integer" or r < 1 then
      error(what .. ": rate must be a positive integer, or a table of them by class", 3)
    end
    out[c] = r
  end
  if type(rate) == "table" then
    for k in pairs(rate) do
      if out[k] == nil then error(what .. ": unknown class " .. tostring(k), 3) end
    end
  end
  return out
end

--- Bounds what reaches `fn`: at most `rate` events of each class per sandbox per
-- one-second window; the excess reaches `fn` as one `suppressed` event per class and
-- verdict (`suppressed` = count, `bytes` summed), written by the next event, `tick` or `flush`.
-- @tparam function fn the subscriber to protect
-- @tparam[opt] integer|table rate per class (default `LOG_RATE`), or a table of them by class
-- @tparam[opt] function clock monotonic seconds (default `core.clock.monotime`)
-- @treturn function the bounded subscriber, and `flush()`
function M.limit(fn, rate, clock)
  local budget = rates(rate == nil and M.LOG_RATE or rate, "limit")
  clock = clock or core.clock.monotime
  local windows = {}
  local function summarise(w)
    for _, c in ipairs(M.LOG_CLASSES) do
      for _, v in ipairs({ "allow", "deny" }) do
        local lost = w.lost[c .. "/" .. v]
        if lost then
          w.lost[c .. "/" .. v] = nil
          fn({ time = M.now(), sandbox = w.sandbox, kind = "suppressed", class = c, verdict = v,
            suppressed = lost.n, bytes = lost.bytes,
            reason = string.format("%d more %s %s events in one second were not written (at most %d per "
              .. "second per sandbox for %s)", lost.n, c, v, budget[c], c) })
        end
      end
    end
  end
  local function due(now, all)
    for key, w in pairs(windows) do
      if all or now - w.start >= 1 then
        windows[key] = nil
        summarise(w)
      end
    end
  end
  local function sub(ev)
    local now = clock()
    local key = ev.sandbox ~= nil and ev.sandbox or false
    local w = windows[key]
    if w and now - w.start >= 1 then
      windows[key] = nil
      summarise(w)
      w = nil
    end
    if not w then
      w = { start = now, n = {}, lost = {}, sandbox = ev.sandbox }
      windows[key] = w
    end
    local c = M.class(ev)
    local n = w.n[c] or 0
    if n < budget[c] then
      w.n[c] = n + 1
      return fn(ev)
    end
    local slot = c .. "/" .. (ev.verdict == "allow" and "allow" or "deny")
    local lost = w.lost[slot]
    if not lost then
      lost = { n = 0, bytes = 0 }
      w.lost[slot] = lost
    end
    lost.n = lost.n + 1
    if math.type(ev.bytes) == "integer" then lost.bytes = lost.bytes + ev.bytes end
  end
  limiters[sub] = function() due(clock()) end
  return sub, function() due(clock(), true) end
end

--- Writes the summaries of every limiter whose window is over; the egress loop calls it
-- each turn. Never raises.
function M.tick()
  for _, due in pairs(limiters) do
    local ok, err = pcall(due)
    if not ok then
      failed = failed + 1
      last_error = tostring(err)
    end
  end
end

-- Opens a log for appending. `-` is standard output (never a file of that name). Any
-- other path is opened once, and checked on the fd it gave (core.fs.open_private: no
-- name is looked up twice, so nothing can be swapped in between): a symbolic link, a
-- FIFO (it would block the loop), a device or another user's file is refused; a regular
-- file of this user's is set to mode 0600 (what it records is the tenant's), a new one
-- is created so. Returns the file and whether it is standard output, or nil and why.
local function open_log(path)
  if path == "-" then return io.stdout, true end
  local f, err, errno = core.fs.open_private(path)
  if f then return f end
  if errno == core.errno.ELOOP then return nil, path .. ": a symbolic link (name the file itself)" end
  if errno == core.errno.ENOENT then
    local dir = path:match("^(.*)/[^/]*$")
    if dir == nil then dir = "." elseif dir == "" then dir = "/" end
    return nil, string.format("%s: the directory %s does not exist", path, dir)
  end
  return nil, err
end

--- A subscriber that appends each event to a file as one JSON object per line (`encode`),
-- flushed after each line so that a reader (`tail -f`, `jq`) sees it at once. At most
-- `opts.rate` events of each class per sandbox per second are written (default
-- `LOG_RATE`; a table sets each class; `rate = false` writes all), with `suppressed` lines
-- for the rest (see `limit`). The file is mode 0600, a regular file of this user's (see
-- above); `-` is standard output.
-- @tparam string path
-- @tparam[opt] table opts `{rate = integer|table|false}`
-- @treturn function the subscriber, and a function closing the file; or nil and the error
function M.json_lines_writer(path, opts)
  opts = opts or {}
  local rate = opts.rate
  if rate == nil then rate = M.LOG_RATE end
  if rate ~= false then rates(rate, "json_lines_writer") end
  local f, err = open_log(path)
  if not f then return nil, err end
  local stdout = err == true
  local function write(event)
    if not f then error("json_lines_writer: " .. path .. " is closed") end
    assert(f:write(M.encode(event), "\n"))
    assert(f:flush())
  end
  local sub, flush = write, nil
  if rate then sub, flush = M.limit(write, rate) end
  local function close()
    if flush and f then pcall(flush) end
    if sub ~= write then limiters[sub] = nil end
    if f and not stdout then f:close() end
    f = nil
  end
  return sub, close
end

-- the limiters' summaries are written at the end of each turn of the egress loop
require("corral.egress.turns").subscribe(M.tick)

return M
