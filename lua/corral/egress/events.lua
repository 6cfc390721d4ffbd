--- Egress events: every decision, delivered to subscribers and kept in a ring.
--
-- An event is a flat table of scalars (`time`, `sandbox`, `kind`, `name`, `ip`, `port`,
-- `verdict`, `reason`, `bytes`, plus what the emitter adds); kinds: `dns`, `connect`,
-- `inbound`, `closed`, `failed`, `cut` (reset by a revoke), `error`, `suppressed`.
-- Subscribers are called in order, each protected: one that raises is counted, never
-- stops the others, and never reaches the caller of `emit`, whose decision stands.
--
-- A tenant decides how many events there are. Subscribers and the ring see every one
-- (a bound there would hide what a policy hook must see); a *file* gets at most
-- `LOG_RATE` per class per sandbox per second, each class its own budget so a DNS flood
-- cannot push a connection out of the log, the rest summed into `suppressed` lines.
-- Lines are 210-340 bytes (`encode` of a DNS deny, a closing record), so a file takes
-- about 0.2 MB/s per sandbox at the full budget. The file is mode 0600: it records what
-- a tenant did.
-- @module corral.egress.events
local json = require "dkjson"
local core = require "corral.core"
local allowlist = require "corral.egress.allowlist"

local M = {}

--- Default number of events the ring keeps.
M.RING_SIZE = 256

--- Events per sandbox per second, of each class, that `json_lines_writer` writes by default.
M.LOG_RATE = 200

--- The classes a file's budget is kept for, each its own (see `class`).
M.LOG_CLASSES = { "dns", "relayed", "refused" }

--- Fields every JSON line carries (null when the event has none).
M.LOG_FIELDS = { "sandbox", "name", "ip", "port", "verdict", "reason", "bytes" }

local subscribers = {}
local ring, ring_size, ring_next, ring_count = {}, M.RING_SIZE, 1, 0
local failed, last_error = 0, nil

local FIELD_ORDER = { "time", "sandbox", "kind", "name", "ip", "port", "verdict", "reason", "bytes", "entry",
  "by", "answer", "qtype", "upstream", "bytes_up", "bytes_down", "class", "suppressed" }

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

local function scalar(v)
  local t = type(v)
  return t == "string" or t == "number" or t == "boolean"
end

local function normalize(event)
  local ev = {}
  for k, v in pairs(event) do
    if type(k) == "string" and scalar(v) then ev[k] = v end
  end
  local sb = event.sandbox
  if type(sb) == "table" then ev.sandbox = sb.id end
  for _, k in ipairs({ "ip", "upstream" }) do
    if type(ev[k]) == "string" then
      ev[k] = allowlist.address_text(ev[k]) or string.format("%q", ev[k])
    end
  end
  ev.time = ev.time or os.time()
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
    if ev[k] == nil then ev[k] = json.null end
  end
  return json.encode(ev, { keyorder = FIELD_ORDER })
end

--- The budget class of an event: `dns`, `relayed` (an allowed connection's records) or `refused`.
-- @tparam table ev
-- @treturn string
function M.class(ev)
  local kind = ev.kind
  if kind == "dns" then return "dns" end
  if ev.verdict == "allow" or kind == "closed" or kind == "failed" or kind == "cut" then return "relayed" end
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
-- @tparam[opt] integer|table rate per class (default `LOG_RATE`), or `{dns =, relayed =, refused =}`
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
          fn({ time = os.time(), sandbox = w.sandbox, kind = "suppressed", class = c, verdict = v,
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

-- Opens a log for appending: an existing file (or /dev/stdout, a FIFO) as it is; a new
-- one made mode 0600 inside a fresh 0700 directory and renamed into place, so it never
-- exists with a wider mode whatever the umask (a rename replaces a racing file, never
-- writes into it).
local function open_log(path)
  if core.fs.lstat(path) then return io.open(path, "a") end
  local dir = path:match("^(.*)/[^/]*$")
  if dir == nil then dir = "." elseif dir == "" then dir = "/" end
  local tmp, err = core.fs.mkdtemp(dir .. "/.corral-log-")
  if not tmp then return nil, path .. ": " .. tostring(err) end
  local inner = tmp .. "/log"
  local f, ferr = io.open(inner, "a")
  if f then
    local ok, cerr = core.fs.chmod(inner, tonumber("600", 8))
    if ok then ok, cerr = os.rename(inner, path) end
    if not ok then
      f:close()
      f, ferr = nil, cerr
      os.remove(inner)
    end
  end
  os.remove(tmp)
  if not f then return nil, path .. ": " .. tostring(ferr) end
  return f
end

--- A subscriber appending each event as one JSON line (`encode`), flushed so that `tail -f`
-- sees it at once; bounded as `limit` (`rate = false` writes all). A new file is mode 0600.
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
    if f then f:close(); f = nil end
  end
  return sub, close
end

return M
