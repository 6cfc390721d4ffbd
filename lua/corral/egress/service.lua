--- The inbound service relay of one sandbox (`service_port`): the host's listener on
-- its own loopback, each connection relayed to the tenant's port inside the netns.
-- @module corral.egress.service
local core = require "corral.core"
local errors = require "corral.errors"
local events = require "corral.egress.events"
local loop = require "corral.egress.loop"
local refusal = require "corral.egress.refusal"
local relays = require "corral.egress.relays"

local M = {}
local Service = {}
Service.__index = Service

--- Inbound: the host listens on 127.0.0.1 at a port the kernel chooses and relays each
-- connection to `port` on the sandbox's own loopback. Two provisions can never be handed
-- the same port: the kernel allocates it, and `addr` reads back what it allocated.
-- @tparam userdata netns the sandbox's network namespace
-- @tparam table sandbox `{id =, mark =, idle =}`
-- @tparam integer port the tenant's port
-- @treturn[1] table the service, with `addr` ("127.0.0.1:PORT")
-- @return[2] nil
-- @treturn[2] table cannot_enforce("network_restriction", …)
function M.new(netns, sandbox, port)
  local fd, bound = core.sock.listen("127.0.0.1", 0)
  if not fd then return nil, errors.cannot_enforce("network_restriction", "service listener: " .. tostring(bound)) end
  return setmetatable({ id = sandbox.id, mark = sandbox.mark, idle = sandbox.idle, netns = netns, fd = fd,
    port = port, addr = "127.0.0.1:" .. bound }, Service)
end

function Service:accept()
  local client = core.sock.accept(self.fd, 0)
  if not client then return end
  local ctx = { sandbox = self.id, kind = "inbound", port = self.port }
  local ok, err = pcall(self.relay, self, client, ctx)
  if not ok then refusal.after_error(client, ctx, err) end
end

function Service:relay(client, ctx)
  -- A socket made inside the sandbox's netns reaches its loopback; the mark exempts it
  -- from the redirect like every host-made socket there. The relay connects it without
  -- blocking: a tenant that listens and never accepts (its backlog full, the SYN dropped)
  -- would otherwise hold the host's one loop, and every other sandbox, for the timeout.
  -- A failure arrives as the connection's "failed" event.
  local id, err = relays.connect(client, "127.0.0.1", self.port, { mark = self.mark,
    netns = self.netns, timeout = 2, idle = self.idle, key = self.id .. "/inbound" }, nil, ctx)
  if not id then return refusal.deny(client, ctx, "service port: " .. tostring(err)) end
  ctx.verdict, ctx.reason, ctx.bytes = "allow", "service port " .. self.port, 0
  events.emit(ctx)
end

--- The fds the loop polls for this service, with their handlers.
function Service:watch()
  return { { fd = self.fd, on = function() self:accept() end } }
end

--- Closes the listener; idempotent.
function Service:close()
  if self.fd then self.fd:close(); self.fd = nil end
  loop.changed()
end
return M
