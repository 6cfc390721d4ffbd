--- The keeper of one container's egress plane, as conmon keeps a container: a process of
-- its own (started by `corral-runtime create` through `setsid -f`, so it survives the
-- runtime's exit and is no child of the engine's), which makes and programs the plane
-- before the container's first process exists, serves its responder, acceptor and
-- relay on the egress loop, logs every decision, registers with corral.control (so
-- `corral ls`/`attach` see it), and ends at `delete` (SIGTERM) with a summary, written into
-- its directory and, as it outlives that, to `CORRAL_RUNTIME_LOG_DIR/<id>.summary.json`.
--
-- A keeper that dies leaves the container with no network: the netns holds only lo and
-- the ruleset, whose redirects lead to sockets that closed with the keeper. It ends by
-- itself when the delegate has forgotten the container (deleted behind corral-runtime's
-- back, or a `run` that ended) and when no container appeared within `CREATE_WAIT`.
-- @module corral.runtime.keeper
local core = require "corral.core"
local json = require "corral.json"
local events = require "corral.egress.events"
local loop = require "corral.egress.loop"
local plane_mod = require "corral.egress.plane"
local summary = require "corral.egress.summary"
local state = require "corral.runtime.state"

local M = {}

--- Seconds a keeper waits for its container to appear at the delegate.
M.CREATE_WAIT = 60

--- The keeper's request, written by `corral-runtime create` into `<dir>/keeper.json`.
M.REQUEST = "keeper.json"

-- Every decision of this container to the engine's log, in its format.
local function engine_log(req)
  if not req.log then return nil end
  local g = { log = req.log, log_format = req.log_format }
  return function(ev)
    if ev.sandbox ~= req.id then return end
    local ok, line = pcall(summary.line, ev)
    state.log(g, ev.verdict == "deny" and "warning" or "info", "corral egress: " .. (ok and line or ev.kind),
      { corral = ev })
  end
end

-- Plain tables: the egress checks refuse a table that carries a metatable (dkjson's marks).
local function plain(v)
  if type(v) ~= "table" then return v end
  local t = {}
  for k, x in pairs(v) do t[k] = plain(x) end
  return t
end

-- The to-be-closed pieces, released in reverse order at the end.
local function closer()
  local list = {}
  return list, setmetatable({}, { __close = function()
    for i = #list, 1, -1 do pcall(list[i]) end
  end })
end

local function say(line)
  io.stdout:write(line, "\n")
  io.stdout:flush()
end

-- stdout was the runtime's pipe: once it has read "ready", it is closed (end of file
-- for the runtime) and fd 1 is /dev/null from then on.
local function detach_stdout()
  io.stdout:close()
  local null = io.open("/dev/null", "w")
  io.output(null)
end

local function counts_of(id)
  local c = { allowed = 0, denied = 0 }
  return c, function(ev)
    if ev.sandbox ~= id then return end
    if ev.verdict == "allow" then c.allowed = c.allowed + 1 elseif ev.verdict == "deny" then
      c.denied = c.denied + (ev.count or 1) end
  end
end

--- Runs the keeper of `<root>/<id>` until SIGTERM (or its container is gone).
-- @treturn integer exit status
function M.main(root, id)
  local dir = state.dir(root, id)
  local text = core.fs.read(dir .. "/" .. M.REQUEST)
  local req = text and plain(json.decode(text))
  if type(req) ~= "table" then say("error no request in " .. dir) return 1 end
  local releases, _ <close> = closer()
  local signals = core.signal.fd({ "TERM", "INT", "HUP" })
  local log_sub = assert(events.json_lines_writer(dir .. "/decisions.jsonl", { rate = false }))
  events.subscribe(log_sub)
  releases[#releases + 1] = function() events.unsubscribe(log_sub) end
  if req.log_json then
    core.fs.mkdir(req.log_json:match("^(.*)/"), tonumber("700", 8))
    local sub, close = events.json_lines_writer(req.log_json)
    if not sub then say("error corral.dev/log-json: " .. tostring(close)) return 1 end
    events.subscribe(sub)
    releases[#releases + 1] = function() events.unsubscribe(sub) close() end
  end
  local to_engine = engine_log(req)
  if to_engine then events.subscribe(to_engine) end
  local counts, count = counts_of(id)
  events.subscribe(count)
  local collector = summary.start({ sandbox = id, out = io.open("/dev/null", "w") })
  local learner = req.learn and require("corral.egress.learn").start(req.learn, { sandbox = id })
  local plane, err = plane_mod.new(id, req.network)
  if not plane then say("error " .. tostring(err)) return 1 end
  plane.port_key = dir
  loop.add(plane)
  releases[#releases + 1] = function() loop.remove(plane) plane:close() end
  local control = require "corral.control"
  local reg = control.serve(control.run_ops({ name = "corral-runtime" }, { id = id },
    { argv = { "corral-runtime", "container", id } }))
  if reg then releases[#releases + 1] = function() reg:close() end end
  local f = assert(io.open(dir .. "/keeper", "w"))
  f:write(core.proc.getpid(), " ", plane.netns:fileno(), "\n")
  f:close()
  say("ready " .. core.proc.getpid() .. " " .. plane.netns:fileno())
  detach_stdout()
  local started, seen = core.clock.monotime(), false
  local why = "deleted"
  while true do
    local hit = loop.step(1, { signals })
    if hit[1] and core.signal.read(signals) then break end
    local known = core.fs.lstat(req.delegate_dir .. "/" .. id) ~= nil
    if known then seen = true end
    if seen and not known then why = "the delegate no longer knows the container" break end
    if not seen and core.clock.monotime() - started > M.CREATE_WAIT then
      why = "no container appeared within " .. M.CREATE_WAIT .. " s" break
    end
  end
  loop.remove(plane)
  plane:close() -- reads the ruleset's last refusals into the log
  if learner then learner.finish() end
  local lines = collector.finish()
  local result = { id = id, ended = why, allowed = counts.allowed, denied = counts.denied, decisions = lines }
  local encoded = json.encode(result) .. "\n"
  local out = io.open(dir .. "/summary.json", "w")
  if out then out:write(encoded) out:close() end
  -- the engine may have named no --log (podman): the summary outlives the state directory
  if req.summary then state.keep_summary(req.summary, encoded) end
  state.log({ log = req.log, log_format = req.log_format }, "info", string.format(
    "corral egress summary: %d allowed, %d denied (%s)", counts.allowed, counts.denied, why), { corral = result })
  -- a container the delegate forgot gets no `delete` (`run` ended): its directory goes now
  if why ~= "deleted" then core.fs.remove_tree(dir) end
  return 0
end

return M
