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
-- This is the only egress module that does I/O (`json_lines_writer`).
-- @module corral.egress.events
local json = require "dkjson"
local allowlist = require "corral.egress.allowlist"

local M = {}

--- Default number of events the ring keeps.
M.RING_SIZE = 256

local subscribers = {}
local ring, ring_size, ring_next, ring_count = {}, M.RING_SIZE, 1, 0
local failed, last_error = 0, nil

local FIELD_ORDER = { "time", "sandbox", "kind", "name", "ip", "port", "verdict", "reason", "entry", "by",
  "upstream", "bytes_up", "bytes_down" }

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

--- A subscriber that appends each event to a file as one JSON object per line, flushed
-- after each line so that a reader (`tail -f`, `jq`) sees it at once.
-- @tparam string path
-- @treturn[1] function the subscriber
-- @treturn[1] function closes the file; the subscriber raises afterwards
-- @return[2] nil
-- @treturn[2] string the error opening the file
function M.json_lines_writer(path)
  local f, err = io.open(path, "a")
  if not f then return nil, err end
  local function write(event)
    if not f then error("json_lines_writer: " .. path .. " is closed") end
    assert(f:write(M.encode(event), "\n"))
    assert(f:flush())
  end
  local function close()
    if f then f:close(); f = nil end
  end
  return write, close
end

return M
