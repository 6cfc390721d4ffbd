--- The SNI/Host hold of an outbound connection (`network.sni`, default "match"): an
-- allowed connection to a name's synthetic address is held, unrelayed, until its first
-- flight shows which host it is for; the acceptor (`corral.egress.acceptor`) hands it
-- here and relays it when the hold passes it.
--
-- The first flight is the TLS ClientHello's server_name, or an HTTP request's Host (and an
-- absolute or CONNECT target) — read with MSG_PEEK (`core.sni`), never consumed, never
-- decrypted, at most one TLS record. A name other than the connection's is reset and
-- logged ("SNI evil.test on a connection to api.test": a client naming another tenant
-- of a shared CDN address); so is a first flight against its grammar (a ClientHello
-- split across records, two Host headers). No name (TLS without SNI, a protocol that is
-- neither) passes under "match" and is refused under "require"; "off" relays at once.
-- Only then is the upstream connected, and the relay splices the untouched bytes.
--
-- A client silent for `SNI_WAIT` seconds (a protocol whose server speaks first: SMTP,
-- FTP, some databases) is refused under "require"; under "match" its upstream is
-- connected and the server's bytes reach it, but nothing it sends is relayed until its
-- first flight has been checked the same way (core.relay's hold): waiting is never a way
-- past the check.
--
-- What it cannot see, by design (nothing is terminated or reassembled): the requests
-- after the first on a kept-alive HTTP/1.1 connection (the relay splices them unread, so
-- a second request may name another Host; the server's own virtual-host routing decides
-- it), and anything inside TLS — an allowed SNI with another Host in the encrypted
-- request (domain fronting through a CDN that routes by that inner Host) passes. The
-- check binds the name a client announces in the clear to the address it connected to;
-- it does not close domain fronting (a host a secret is bound to is terminated instead:
-- `corral.egress.terminated` checks every request's Host).
--
-- With a secret bound (`corral.egress.secrets`), a first flight that carries a stand-in in
-- the clear (plain HTTP to any host, the bound one too) is refused, a visible HTTP request
-- with a 403 saying why. Inside TLS to a host that is not terminated a stand-in is
-- invisible here, and worthless: only the terminator puts a value in its place.
-- @module corral.egress.sni_hold
local core = require "corral.core"
local loop = require "corral.egress.loop"
local refusal = require "corral.egress.refusal"
local relays = require "corral.egress.relays"
local secrets = require "corral.egress.secrets"

local M = {}

--- How long (seconds) a connection may stay silent before its upstream is connected with
-- the client's bytes held until checked (under `network.sni = "match"`: a protocol whose
-- server speaks first) or it is refused (under "require").
M.SNI_WAIT = 0.5

--- The modes of `network.sni`, and the default.
M.SNI_MODES = { off = true, match = true, require = true }
M.SNI_DEFAULT = "match"

--- Holds an allowed connection until its first flight names its host (see the module's
-- comment); one that spoke at once is judged here, the others when the loop wakes them.
-- @tparam table acceptor the acceptor that took it (its `held` table, `n_held`)
-- @tparam userdata client
-- @tparam table h `{ctx =, name =, ip =, port =, port_key =, verdict =, policy =, env =}`
function M.hold(acceptor, client, h)
  h.deadline, h.seen = core.clock.monotime() + M.SNI_WAIT, 0
  acceptor.held[client] = h
  acceptor.n_held = acceptor.n_held + 1
  -- a client that spoke at once (TLS, HTTP) is usually read already: no loop turn
  M.check(acceptor, client)
  if acceptor.held[client] then
    -- the loop polls it from now on
    h.polled = true
    loop.changed()
  end
end

-- Whether text is an IP address equal to ip (both parsed: a literal may be written
-- uncompressed or in capitals).
local function same_address(text, ip)
  local _, a = core.inet.parse(text)
  local _, b = core.inet.parse(ip)
  return a ~= nil and a == b
end

--- What the first flight `data` says of the connection held for `name`: nil to keep
-- waiting, true to relay it, or a string: why it is refused.
-- @tparam string data what the client sent so far (peeked)
-- @tparam string name the name the connection's address was given to
-- @tparam string mode "match" or "require"
-- @tparam boolean final no more will be waited for (silence, or the peek bound)
-- @tparam[opt] string dialed the address the client connected to: a Host that is this
--   address (`curl http://198.18.0.7/`, `http://[64:ff9b:1::…]/`) names the same destination
-- @treturn nil|true|string
function M.sni_verdict(data, name, mode, final, dialed)
  local kind, seen, extra = core.sni.parse(data)
  if not kind and seen == "more" and not final then return nil end
  if not kind and seen == "more" then
    if #data == 0 then
      return mode == "require" and ("nothing sent within " .. M.SNI_WAIT .. " s: no name to check "
        .. "(network.sni = \"require\")") or true
    end
    return string.format("%s first flight incomplete after %d bytes", "TLS or HTTP", #data)
  end
  if not kind then
    return string.format("%s on a connection to %s does not follow its grammar", extra == "tls" and
      "TLS ClientHello" or "HTTP request", name)
  end
  local what = kind == "tls" and "SNI" or "Host"
  if seen then
    if seen == name or (dialed and same_address(seen, dialed)) then return true end
    return string.format("%s %s on a connection to %s", what, seen, name)
  end
  if mode == "require" then
    return string.format("%s on a connection to %s names no host (network.sni = \"require\")",
      kind == "other" and "a protocol that is neither TLS nor HTTP" or (kind == "tls" and "TLS without SNI"
        or "HTTP without Host"), name)
  end
  return true
end

--- A held connection's socket has more to read, or its wait is over: decide it, relay it
-- (`acceptor:relay`) or reset it. Whatever goes wrong is that connection's RST and deny
-- event.
-- @tparam table acceptor
-- @tparam userdata client
-- @tparam[opt] boolean timed_out its wait is over
function M.check(acceptor, client, timed_out)
  local h = acceptor.held[client]
  if not h then return end
  local data, _, errno = core.sni.peek(client)
  local again = not data and errno == core.errno.EAGAIN
  data = data or ""
  -- woken with nothing new (not EAGAIN): the client's end, which keeps it readable, so
  -- decide now on what there is
  local stalled = not again and h.last ~= nil and #data <= #h.last
  local final = timed_out or stalled or #data >= core.sni.PEEK_MAX
  local ok, v = pcall(M.sni_verdict, data, h.name, acceptor.sni, final, h.ip)
  if not ok then v = "first flight unreadable: " .. tostring(v):sub(1, 200) end
  if v == nil then
    -- wake again only once more than this has arrived
    h.last = data
    if #data > 0 then
      core.sni.lowat(client, #data + 1)
      h.lowat = true
    end
    return
  end
  acceptor.held[client] = nil
  acceptor.n_held = acceptor.n_held - 1
  if h.polled then loop.changed() end
  if v ~= true then return refusal.deny(client, h.ctx, v) end
  local leak = acceptor.secrets and secrets.clear_leak(acceptor.secrets, data, h.name .. ":" .. h.port)
  if leak then
    if core.sni.parse(data) == "http" then return refusal.forbidden(client, h.ctx, leak) end
    h.ctx.leak = true
    return refusal.deny(client, h.ctx, leak)
  end
  if h.lowat then core.sni.lowat(client, 1) end
  -- Nothing seen yet (only silence ends the wait with no bytes): the client's first
  -- bytes, whenever they come, are still checked before any is relayed.
  local guard = #data == 0 and h or nil
  local rok, err = pcall(acceptor.relay, acceptor, client, h.ctx, h.name, h.ip, h.port, h.port_key, h.verdict,
    h.policy, h.env, guard)
  if not rok then refusal.after_error(client, h.ctx, err) end
end

--- A connection relayed with its client held (see the module's comment) has sent more:
-- release it once its first flight passes, cut it (logged with the reason) when not.
-- @tparam table acceptor
-- @tparam integer id the relay's connection id
-- @tparam table h the connection's held state
function M.check_held(acceptor, id, h)
  local data, ended, errno = relays.peek(id)
  if not data then
    if errno == core.errno.EAGAIN then return end
    error(ended)
  end
  local final = ended or #data >= core.sni.PEEK_MAX
  local v = M.sni_verdict(data, h.name, acceptor.sni, final, h.ip)
  if v == nil then return end
  local leak = v == true and acceptor.secrets and secrets.clear_leak(acceptor.secrets, data, h.name .. ":" .. h.port)
  if leak then return relays.cut(id, leak) end
  if v == true then return relays.release(id) end
  relays.cut(id, v)
end

return M
