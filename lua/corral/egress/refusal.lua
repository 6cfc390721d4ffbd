--- A connection refused: reset (RST) and logged as a deny event. The acceptor, its SNI
-- hold and the inbound service refuse the same way.
-- @module corral.egress.refusal
local core = require "corral.core"
local events = require "corral.egress.events"

local M = {}

--- Resets client and logs ctx as a deny. `by` names what refused (docs/boundary.md,
-- "Egress events"): the decision's own (`allowlist`, `hook`, `policy`), else the host's
-- checks after it, `policy`.
-- @tparam userdata client
-- @tparam table ctx the connection's event
-- @tparam string reason
-- @tparam[opt="policy"] string by
function M.deny(client, ctx, reason, by)
  core.sock.reset(client)
  ctx.verdict, ctx.reason, ctx.bytes, ctx.by = "deny", reason, 0, by or "policy"
  events.emit(ctx)
end

--- A refused HTTP request on a connection seen in the clear: the client reads a 403
-- saying why (and the flag that would admit it) before the connection ends; logged
-- as a deny.
-- @tparam userdata client
-- @tparam table ctx the connection's event
-- @tparam string reason
function M.forbidden(client, ctx, reason)
  local body = "corral: request refused: " .. reason .. "\n"
  pcall(core.sock.send, client, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
    .. "Content-Length: " .. #body .. "\r\nConnection: close\r\n\r\n" .. body)
  pcall(core.sock.shutdown, client, "w")
  pcall(function() client:close() end)
  ctx.verdict, ctx.reason, ctx.bytes, ctx.by, ctx.leak = "deny", reason, 0, "policy", true
  events.emit(ctx)
end

--- After an error: the connection is reset and closed however far it got, and the deny
-- is logged even if the reset itself fails.
-- @tparam userdata client
-- @tparam table ctx the connection's event
-- @param err the error
function M.after_error(client, ctx, err)
  pcall(core.sock.reset, client)
  pcall(function() client:close() end)
  ctx.verdict, ctx.reason, ctx.bytes, ctx.by = "deny", "internal error: " .. tostring(err):sub(1, 200), 0, "policy"
  pcall(events.emit, ctx)
end

return M
