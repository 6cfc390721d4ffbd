--- The one event loop per host process that drives every sandbox's egress plane: the
-- relay's epoll fd, each plane's responder and acceptor, and whatever the caller waits
-- on (a tenant's pidfd), polled together. Lua decisions run here, on this loop.
-- @module corral.egress.loop
local core = require "corral.core"
local events = require "corral.egress.events"

local M = {}

local state

--- The process-wide loop (created on first use).
function M.get()
  if not state then
    state = { relay = assert(core.relay.new()), planes = {}, pending = {} }
  end
  return state
end

function M.add(plane)
  M.get().planes[plane] = true
end

function M.remove(plane)
  if state then state.planes[plane] = nil end
end

--- The planes currently served, for the REPL.
function M.planes()
  local out = {}
  for p in pairs(M.get().planes) do out[#out + 1] = p end
  return out
end

local function relay_events(loop)
  for _, ev in ipairs(loop.relay:run(0) or {}) do
    local ctx = loop.pending[ev.id]
    if ctx and (ev.kind == "closed" or ev.kind == "failed") then
      loop.pending[ev.id] = nil
      -- The end of an allowed connection: the same decision, now with its byte counts
      -- (bytes = up + down), and why it failed when it did.
      events.emit({ sandbox = ctx.sandbox, kind = ev.kind, name = ctx.name, ip = ctx.ip, port = ctx.port,
        upstream = ctx.upstream, verdict = "allow",
        reason = ev.kind == "failed" and ("upstream: " .. tostring(ev.msg or ev.err)) or ctx.reason,
        bytes_up = ev.up, bytes_down = ev.down, bytes = (ev.up or 0) + (ev.down or 0) })
    end
  end
end

--- Waits up to timeout seconds for work, handles it, and returns which of `extra` (a list
-- of fds or objects with :fileno()) became readable, as a set of indices.
function M.step(timeout, extra)
  local loop = M.get()
  local fds, handlers = { loop.relay }, { function() relay_events(loop) end }
  for plane in pairs(loop.planes) do
    for _, w in ipairs(plane:watch()) do
      fds[#fds + 1] = w.fd
      handlers[#handlers + 1] = w.on
    end
  end
  local first_extra = #fds + 1
  for _, e in ipairs(extra or {}) do fds[#fds + 1] = e end
  local ready = core.poll(fds, timeout) or {}
  local hit = {}
  for _, i in ipairs(ready) do
    if i >= first_extra then
      hit[i - first_extra + 1] = true
    else
      handlers[i](loop)
    end
  end
  return hit
end

--- Serves the loop for `seconds` (for hosts that run a sandbox started with `start`
-- and want its connections relayed while they wait).
function M.serve(seconds)
  local deadline = core.monotime() + (seconds or 0)
  repeat M.step(math.max(0, math.min(1, deadline - core.monotime()))) until core.monotime() >= deadline
end

--- Waits for a sandbox process: serving the loop meanwhile (opts.serve), up to
-- opts.wall seconds, forwarding the signals that arrive on opts.signals (a
-- core.signal_fd) to it. Returns its code and how it ended, or nil, "timeout".
-- @tparam userdata proc a corral.process
-- @tparam[opt] table opts `{serve =, wall =, signals =}`
function M.wait(proc, opts)
  opts = opts or {}
  if not opts.serve and not opts.signals then return proc:wait(opts.wall) end
  local deadline = opts.wall and core.monotime() + opts.wall
  local extra = { proc, opts.signals }
  while true do
    local left = deadline and deadline - core.monotime()
    if left and left <= 0 then return nil, "timeout" end
    local timeout = left and math.min(left, 1) or 1
    local hit
    if opts.serve then
      hit = M.step(timeout, extra)
    else
      hit = {}
      for _, i in ipairs(core.poll(extra, timeout) or {}) do hit[i] = true end
    end
    if hit[2] then
      local sig = core.signal_read(opts.signals)
      if sig then proc:kill(sig) end
    end
    if hit[1] or not proc:running() then return proc:wait() end
  end
end

return M
