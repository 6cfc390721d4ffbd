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
      events.emit({ sandbox = ctx.sandbox, kind = ev.kind, name = ctx.name, ip = ctx.ip, port = ctx.port,
        upstream = ctx.upstream, verdict = ev.kind, reason = (ev.err ~= 0) and ev.err or nil,
        bytes_up = ev.up, bytes_down = ev.down })
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

return M
