--- Egress events: every decision, delivered to subscribers and kept in a ring.
--
-- An event is a flat table: `{time =, sandbox =, name =, ip =, port =, verdict =,
-- reason =, bytes_up =, bytes_down =}` plus any other scalar fields the emitter adds
-- (`kind`, `entry`, `upstream`, …). `emit` copies it: scalar fields only, `sandbox`
-- as its id when given a sandbox table, `ip` (and `upstream`) as address text when
-- given bytes, `time` defaulting to now (seconds since the epoch). Subscribers are called
-- in order, each protected: a subscriber that raises is counted (`failures`), never
-- stops the others, and never reaches the caller of `emit`, whose decision stands.
--
-- The state (subscribers, ring, counters) is process-wide, as the event loop is.
--
-- Volume: a tenant decides how many events there are (one per DNS query, one per
-- connection attempt: a red-team run had 70,000 queries write 8.9 MB of JSON in 6 s;
-- measured here with the bound, 20,000 queries in 2.1 s write 603 lines, 113 kB).
-- Subscribers and the ring see every event — they are the operator's own code
-- and memory, and a bound there would hide what a policy hook must see. What reaches a
-- *file* is bounded: `json_lines_writer` passes at most `LOG_RATE` (200) events per
-- sandbox per second (`limit`), counts the rest, and writes one `suppressed` line per
-- sandbox, per verdict, for each second that dropped any, with the count. The log file
-- is created mode 0600: it records what a tenant did.
-- @module corral.egress.events
local json = require "dkjson"
local core = require "corral.core"
local allowlist = require "corral.egress.allowlist"

local M = {}

--- Default number of events the ring keeps.
M.RING_SIZE = 256

--- Events per sandbox per second that `json_lines_writer` writes by default.
M.LOG_RATE = 200

local subscribers = {}
local ring, ring_size, ring_next, ring_count = {}, M.RING_SIZE, 1, 0
local failed, last_error = 0, nil

local FIELD_ORDER = { "time", "sandbox", "kind", "name", "ip", "port", "verdict", "reason", "entry", "by",
  "upstream", "bytes_up", "bytes_down", "suppressed" }

-- Live limiters (`limit`), each with its function that writes the summaries that are due;
-- weak, so a limiter nobody holds any more goes with its subscriber.
local limiters = setmetatable({}, { __mode = "k" })

local function callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and type(mt.__call) == "function"
end

--- Adds a subscriber, called with each event (a copy) after those already subscribed.
-- Subscribing the same function twice has no effect.
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

--- Encodes an event as one line of JSON (no trailing newline).
-- @tparam table event as given to subscribers
-- @treturn string
function M.encode(event)
  return json.encode(event, { keyorder = FIELD_ORDER })
end

--- Bounds what reaches `fn`: at most `rate` events per sandbox per second (a window
-- opens with a sandbox's first event and lasts one second). The excess is counted, and
-- when the window is over `fn` receives, per verdict that lost any, one summary event
-- `{time =, sandbox =, kind = "suppressed", verdict =, suppressed = count, reason =}`.
-- Summaries are written by the sandbox's next event, by `tick` (the egress loop calls it
-- on every turn), or by `flush`.
-- @tparam function fn the subscriber to protect
-- @tparam[opt] integer rate events per sandbox per second (default `LOG_RATE`)
-- @tparam[opt] function clock seconds, monotonic (default `core.monotime`)
-- @treturn function the bounded subscriber
-- @treturn function `flush()`: writes every pending summary now
function M.limit(fn, rate, clock)
  rate = rate or M.LOG_RATE
  if math.type(rate) ~= "integer" or rate < 1 then error("limit: rate must be a positive integer", 2) end
  clock = clock or core.monotime
  local windows = {}
  local function summarise(w)
    for _, v in ipairs({ "allow", "deny" }) do
      if w[v] > 0 then
        local n = w[v]
        w[v] = 0
        fn({ time = os.time(), sandbox = w.sandbox, kind = "suppressed", verdict = v, suppressed = n,
          reason = string.format("%d more %s events in one second were not written (at most %d per second "
            .. "per sandbox)", n, v, rate) })
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
      w = { start = now, n = 0, allow = 0, deny = 0, sandbox = ev.sandbox }
      windows[key] = w
    end
    if w.n < rate then
      w.n = w.n + 1
      return fn(ev)
    end
    local v = ev.verdict == "allow" and "allow" or "deny"
    w[v] = w[v] + 1
  end
  limiters[sub] = function() due(clock()) end
  return sub, function() due(clock(), true) end
end

--- Writes the summaries of every limiter whose window is over (see `limit`; each reads
-- its own clock); the egress loop calls it on each turn. Never raises: a failing writer
-- is counted as in `emit`.
function M.tick()
  for _, due in pairs(limiters) do
    local ok, err = pcall(due)
    if not ok then
      failed = failed + 1
      last_error = tostring(err)
    end
  end
end

-- Opens a log for appending. An existing file (or /dev/stdout, a FIFO) is used as it is,
-- its mode the operator's; a new one is created mode 0600 whatever the umask, and never
-- exists with a wider mode: it is made inside a fresh 0700 directory next to `path`,
-- restricted, then renamed into place. (Between the check and the rename another process
-- could create `path`; the rename then replaces that file, never writes into it.)
local function open_log(path)
  if core.lstat(path) then return io.open(path, "a") end
  local dir = path:match("^(.*)/[^/]*$")
  if dir == nil then dir = "." elseif dir == "" then dir = "/" end
  local tmp, err = core.mkdtemp(dir .. "/.corral-log-")
  if not tmp then return nil, path .. ": " .. tostring(err) end
  local inner = tmp .. "/log"
  local f, ferr = io.open(inner, "a")
  if f then
    local ok, cerr = core.chmod(inner, tonumber("600", 8))
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

--- A subscriber that appends each event to a file as one JSON object per line, flushed
-- after each line so that a reader (`tail -f`, `jq`) sees it at once. At most
-- `opts.rate` events per sandbox per second are written (default `LOG_RATE`; `rate =
-- false` writes all), with `suppressed` lines for the rest (see `limit`). A new file is
-- created mode 0600.
-- @tparam string path
-- @tparam[opt] table opts `{rate = integer|false}`
-- @treturn[1] function the subscriber
-- @treturn[1] function closes the file (writing pending summaries first); the subscriber
--   raises afterwards
-- @return[2] nil
-- @treturn[2] string the error opening the file
function M.json_lines_writer(path, opts)
  opts = opts or {}
  local rate = opts.rate
  if rate == nil then rate = M.LOG_RATE end
  if rate ~= false and (math.type(rate) ~= "integer" or rate < 1) then
    error("json_lines_writer: rate must be a positive integer or false", 2)
  end
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
