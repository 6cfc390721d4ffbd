--- The TLS connections one sandbox has terminated: those to a host a secret is bound to
-- (`corral.egress.secrets`). The acceptor hands such a connection here once it is
-- decided and its SNI checked (`terminate`); the terminator (`corral.tls`, a thread per
-- connection) speaks TLS to the tenant under the run's CA and to the real server, checks
-- and rewrites every request, and reports each one, which `drain` logs as an event:
--
-- - `request`: a request answered; verdict allow, method, name, path (no query), status,
--   bytes (its body up and the response's down), `secret_used`.
-- - `request` with verdict deny: refused (the tenant got a 403 saying why); `leak` when a
--   stand-in was where no secret may go.
-- - `tls`: a terminated connection that ended before any request (a handshake failed, the
--   server's certificate did not verify); verdict deny, reason.
--
-- With request rules (`corral.egress.request_rules`), each request is asked of `drain`,
-- which answers it at once.
-- @module corral.egress.terminated
local events = require "corral.egress.events"
local request_rules = require "corral.egress.request_rules"
local secrets = require "corral.egress.secrets"

local M = {}
local Terminated = {}
Terminated.__index = Terminated

--- The terminator of sandbox id's bound secrets.
-- @tparam string id
-- @tparam {table,...} list `network.secrets`
-- @tparam[opt] string ca_file `network.ca_file`
-- @tparam[opt] table requests `{rules =, methods =, hook =, budget =}` (see `corral.egress.request_rules`)
-- @treturn[1] table
-- @return[2] nil
-- @treturn[2] string why
function M.new(id, list, ca_file, requests)
  requests = requests or {}
  local ask = request_rules.any(requests)
  local tls, err = secrets.terminator(list, ca_file, ask)
  if not tls then return nil, err end
  return setmetatable({ id = id, list = list, tls = tls, requests = ask and requests or nil }, Terminated)
end

--- Whether connections to name:port are terminated.
function Terminated:bound(name, port)
  return name ~= nil and secrets.bound(self.list, name, port)
end

--- Terminates client (taken) for name:port; returns the socket to relay upstream, or
-- nil and why.
function Terminated:terminate(client, name, port)
  return self.tls:terminate(client, name, port)
end

--- The run CA's certificate (PEM).
function Terminated:ca_pem()
  return self.tls:ca_pem()
end

--- Logs what the terminator reported.
function Terminated:drain()
  for _, ev in ipairs(self.tls:events()) do
    if ev.kind == "ask" then
      self.tls:answer(ev.ticket, request_rules.judge(self.requests, ev))
      goto next
    end
    local request = ev.kind ~= "failed"
    events.emit({ sandbox = self.id, kind = request and "request" or "tls", name = ev.host, method = ev.method,
      path = ev.path, status = ev.status, verdict = ev.kind == "request" and "allow" or "deny",
      reason = ev.reason, bytes = (ev.bytes_up or 0) + (ev.bytes_down or 0), bytes_up = ev.bytes_up,
      bytes_down = ev.bytes_down, secret_used = request and ev.secret_used or nil,
      leak = ev.leak or nil, connection = ev.conn })
    ::next::
  end
end

--- The fd the loop polls, with its handler.
function Terminated:watch()
  return { { fd = self.tls:fileno(), on = function() self:drain() end } }
end

--- Ends every terminated connection; idempotent.
function Terminated:close()
  if self.tls then
    pcall(self.drain, self)
    self.tls:close()
    self.tls = nil
  end
end

return M
