--- Conformance checks: a sandbox without an allowlist has no network.
--
-- The targets are a TCP server on the host's loopback and another sandbox's published
-- service. A refusal counts only when the target answers the host after the attempt;
-- when nothing answers, the check is unavailable, never held.
-- @module corral.conformance.network
local NET = { "network_restriction" }

local M = {}

--- B's service: listens on PORT in B's network, answers every connection with TOKEN,
-- and writes /storage/ready once listening.
M.SERVICE = [[
import socket, sys
port, token = int(sys.argv[1]), sys.argv[2].encode()
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(16)
open("/storage/ready", "w").write("ready")
while True:
    c, _ = s.accept()
    try: c.sendall(token + b"\n")
    except OSError: pass
    c.close()
]]

M.SERVICE_PORT = 8000

--- Starts B with a service answering B's own token; returns B, or nil and the observation.
function M.service_box(w)
  local b, err = w:sandbox({ service_port = M.SERVICE_PORT })
  if not b then return nil, { refused = err } end
  w:write(b, "service.py", M.SERVICE)
  local ok, serr = w:start(b, "exec python3 /storage/service.py " .. M.SERVICE_PORT .. " " .. b.own)
  if not ok then return nil, { unavailable = "the service sandbox did not start: " .. tostring(serr) } end
  -- B's own word that it listens (its storage), never a probe of the published address
  w:wait_for(function() return w:read(b, "ready") ~= nil end, 5)
  return b
end

--- The published address of a box as host, port; or nil and why.
function M.address_of(w, box)
  local _, addr = require("corral").address(w.mech, box.sb)
  if type(addr) ~= "string" then return nil, "the mechanism publishes no address for the service sandbox" end
  local host, port = addr:match("^%[?([^%]]+)%]?:(%d+)$")
  if not host then return nil, "the published address " .. addr .. " is not host:port" end
  return host, tonumber(port)
end

--- The observation after an attempt at B's service: B's token is the evidence, the host's
-- own connect the liveness control.
function M.judge_service(w, b, out, ok, detail, host, port)
  if out:find(b.own, 1, true) then
    return { evidence = "A read B's service token through " .. host .. ":" .. port }
  end
  local got = w:host_dial(host, port, nil, 2, b.own) or ""
  if not got:find(b.own, 1, true) then
    return { unavailable = "nothing answers at the published address " .. host .. ":" .. port ..
      " (a refusal there distinguishes nothing)" }
  end
  return { control_ok = ok, control_detail = ok and ("B's service answered the host; " .. detail) or detail }
end

M.checks = {
  {
    id = "net.connect_out", needs = NET, tools = { "python3" },
    guarantee = "a sandbox without an allowlist cannot connect out: not to the host's loopback, not by any route",
    attempt = "connect to a server of the check's own on every host address, by 127.0.0.1, the tenant's default " ..
      "gateway and the host's own address, and read its token",
    control = "the host's own connect to the same server gets the token; A's own storage",
    run = function(w)
      -- a sandbox with a network namespace of its own has a 127.0.0.1 of its own: only a
      -- routed address (its gateway, the host's) shows whether a way out exists, so the
      -- server listens on all of the host's addresses
      local reply = w:token()
      local srv, serr = w:tcp_server("0.0.0.0", reply .. "\n")
      if not srv then return { unavailable = "cannot listen on the host: " .. tostring(serr) } end
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local nonce, dial, script = w:token(), w:dialer(a), {}
      for _, addr in ipairs({ "127.0.0.1", "gateway", w.host_ipv4() }) do
        script[#script + 1] = dial .. " tcp " .. addr .. " " .. srv.port .. " " .. nonce
      end
      local out, ok, detail = w:attempt(a, table.concat(script, "; "))
      w:pump(0.05)
      if out:find(reply, 1, true) or srv.got:find(nonce, 1, true) then
        return { evidence = "the tenant's connection reached the host's server (token exchanged): " ..
          (out:match("DIAL:([^\n]*:ok:)") or "seen by the host") }
      end
      local got = w:host_dial("127.0.0.1", srv.port, nil, 2, reply) or ""
      if not got:find(reply, 1, true) then return { unavailable = "the host's own server did not answer the host" } end
      return { control_ok = ok, control_detail = ok and ("the host's connect got the token; " .. detail) or detail }
    end,
  },
  {
    id = "net.sibling_service", needs = NET, tools = { "python3" },
    guarantee = "a sandbox without an allowlist cannot reach another sandbox's published service",
    attempt = "connect from A to B's published address (and B's port on A's loopback) and read B's token",
    control = "B's service answers the host at that address; A's own storage",
    run = function(w)
      local b, why = M.service_box(w)
      if not b then return why end
      local a, err = w:sandbox()
      if not a then return { refused = err } end
      local host, port = M.address_of(w, b)
      if not host then return { unavailable = port } end
      -- the published address, and B's port on the loopback A sees (B's own, if shared)
      local dial = w:dialer(a)
      local out, ok, detail = w:attempt(a, dial .. " tcp " .. host .. " " .. port .. " x; " ..
        dial .. " tcp 127.0.0.1 " .. M.SERVICE_PORT .. " x")
      return M.judge_service(w, b, out, ok, detail, host, port)
    end,
  },
}

return setmetatable(M.checks, { __index = M })
