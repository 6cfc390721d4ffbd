--- The DNS responder of one sandbox: UDP and TCP port 53 inside its network namespace,
-- answering from the sandbox's policy and never forwarding anything.
--
-- Names on the allowlist are answered with a synthetic address (stable per name per
-- sandbox); every other name is NXDOMAIN. Any other query type (TXT, SRV, HTTPS, CNAME,
-- MX, …) for an allowed name is NODATA (NOERROR, no answer): the name exists and has
-- no such record here, which is what a program falling back from HTTPS/SRV lookups to
-- A/AAAA expects (REFUSED made some treat the name as unresolvable); for any other name
-- it stays REFUSED. The sandbox's own hostname (`hostname`) resolves to its loopback
-- (127.0.0.1, ::1), as /etc/hosts would make it on a host. Nothing the tenant
-- asks is ever forwarded, and no upstream DNS response is ever parsed. When the sandbox's
-- synthetic table is full (`corral.egress.synthetic`, `limit`), a new allowed name is
-- answered SERVFAIL and logged as a deny naming the exhaustion: SERVFAIL says "this server
-- cannot answer now", which is true, where NXDOMAIN would deny that an allowed name exists
-- (and be cached as such) and REFUSED is this responder's answer to a policy refusal.
-- A query the codec refuses is answered as its contract says (FORMERR, NOTIMP or
-- dropped) and logged with the rule the codec says it broke.
--
-- Every query is handled under `pcall`: an error in one is that query's SERVFAIL and a
-- deny event, never the host's end.
-- @module corral.egress.responder
local core = require "corral.core"
local allowlist = require "corral.egress.allowlist"
local address = require "corral.egress.address"
local decision = require "corral.egress.decision"
local events = require "corral.egress.events"
local loop = require "corral.egress.loop"
local secrets = require "corral.egress.secrets"

local M = {}
local Responder = {}
Responder.__index = Responder

M.TTL = 60
M.TCP_DNS_MAX = 32
M.TCP_DNS_IDLE = 5
-- Queries answered on one DNS-over-TCP connection (pipelined, RFC 7766 6.2.1.1), after
-- which it is closed. Each answer is at most 301 bytes framed (the codec's largest), so
-- 16 fit in the 16 KiB a new TCP socket may send before the tenant reads (tcp_wmem's
-- default): the responder's blocking write can never wait on a tenant that only writes.
M.TCP_DNS_QUERIES = 16
-- Largest query accepted over TCP (the length prefix): the UDP size of RFC 1035; larger
-- closes the connection.
M.TCP_DNS_MSG_MAX = 512
-- Names whose verdict is cached; a full cache starts over.
M.NAME_CACHE = 4096

--- Binds the responder inside netns.
-- @tparam userdata netns the sandbox's network namespace
-- @tparam table sandbox `{id =, synth = its synthetic allocator, registry = where its
--   policy lives, ipv4_only = true when the sandbox has an IPv4 route only, hostname =
--   the sandbox's own (uts) hostname, answered with its loopback, learn = true to answer
--   every hostname (`--learn`: what was asked is recorded, every connection denied)}`
-- @treturn[1] table the responder, with `port` (53, as the kernel bound it)
-- @return[2] nil
-- @treturn[2] string what failed
-- @treturn[2] string why
function M.new(netns, sandbox)
  local self = setmetatable({ id = sandbox.id, synth = sandbox.synth, registry = sandbox.registry,
    ipv4_only = sandbox.ipv4_only, hostname = sandbox.hostname, learn = sandbox.learn, secrets = sandbox.secrets,
    tcp_dns = {}, names = {},
    names_n = 0 },
    Responder)
  -- The responder holds port 53 itself, so a resolver configured at a loopback address
  -- (127.0.0.53, 127.0.0.1) reaches it directly, and any other :53 is redirected to it.
  local err
  self.udp, self.port = core.listen.in_netns(netns, "udp", "::", 53)
  if not self.udp then return nil, "DNS responder (udp)", self.port end
  self.tcp, err = core.listen.in_netns(netns, "tcp", "::", 53)
  if not self.tcp then
    self:close()
    return nil, "DNS responder (tcp)", err
  end
  return self
end

--- A name as the tenant sent it, safe to log. The codec hands it back in presentation
-- form, every byte outside hostname characters already written \ddd (as dig does, so a
-- label "api.rt2" is api\046rt2): that is kept as it is. Anything else that could reach
-- here (a backslash not starting \ddd, a control byte) is escaped, once.
-- @tparam string name
-- @treturn string|nil
function M.printable(name)
  if type(name) ~= "string" then return nil end
  name = name:sub(1, 1024)
  if not name:find("[^%w%.%-_*]") then return name end
  local out, i = {}, 1
  while i <= #name do
    local c = name:sub(i, i)
    if c == "\\" and name:find("^%d%d%d", i + 1) then
      out[#out + 1] = name:sub(i, i + 3)
      i = i + 4
    else
      out[#out + 1] = c:find("[^%w%.%-_*]") and string.format("\\%03d", c:byte()) or c
      i = i + 1
    end
  end
  return table.concat(out)
end

--- What made a name resolvable, for the log: the allowlist entry that matches it, or
-- the decide hook (which decides each connection).
-- @tparam string name
-- @tparam table policy
-- @treturn string
function M.entry_of(name, policy)
  local al = type(policy) == "table" and policy.allowlist
  local n = address.normalize_name(name)
  if n and al and allowlist.is_allowlist(al) then
    local e = al:match({ name = n })
    if e then return e.text end
  end
  if type(policy) == "table" and policy.decide then return "the decide hook (asked at connect)" end
  return "the policy"
end

local ANSWER_OF = { [core.dns.FORMERR] = "formerr", [core.dns.NOTIMP] = "notimp" }

--- The answer to one DNS query (wire bytes in, wire bytes out, nil to drop it): synthetic
-- for allowed names, NXDOMAIN otherwise; each query logged as a `dns` event.
-- @tparam string query
-- @treturn string|nil
function Responder:answer(query)
  local q, perr, errno, why = core.dns.parse(query)
  if not q then
    local rcode = errno and core.dns.error_rcode(errno)
    events.emit({ sandbox = self.id, kind = "dns", answer = ANSWER_OF[rcode] or "dropped", verdict = "deny",
      reason = "malformed query: " .. tostring(why) .. " (" .. tostring(perr) .. ")", bytes = 0 })
    if not rcode then return nil end
    return core.dns.answer(query, rcode)
  end
  local name = q.name
  local leaked = self.secrets and secrets.stand_in_in(self.secrets, name, true)
  if leaked then
    -- a name is read by every resolver on its way: a stand-in never leaves in one
    events.emit({ sandbox = self.id, kind = "dns", name = M.printable(name), qtype = q.qtype, answer = "refused",
      verdict = "deny", leak = true, bytes = 0, reason = "the stand-in of " .. leaked .. " in a DNS name: "
        .. "it is put into request headers only, over TLS to the hosts --secret " .. leaked .. "@HOST binds" })
    return core.dns.answer(query, core.dns.REFUSED)
  end
  if q.hostname and self.hostname and q.qclass == 1 and address.normalize_name(name) == self.hostname then
    return self:answer_hostname(query, q)
  end
  local policy = self.registry:get(self.id)
  local allowed, reason_of, entry = nil, "not a hostname", nil
  if q.hostname then
    local v = self:name_verdict(name, policy)
    allowed, reason_of, entry = v.allowed, v.why, v.entry
    -- learn mode: every name is answered, so that the program goes on to connect and the
    -- acceptor learns the port it wanted (and denies it)
    if not allowed and self.learn then allowed, entry = true, "learn mode (--learn)" end
  end
  local verdict, rcode, addr, reason, ip
  if not allowed then
    rcode, verdict, reason = core.dns.NXDOMAIN, "nxdomain", reason_of
  elseif q.qclass ~= 1 or (q.qtype ~= core.dns.A and q.qtype ~= core.dns.AAAA) then
    rcode, verdict = core.dns.REFUSED, "refused"
  elseif q.qtype == core.dns.AAAA and self.ipv4_only then
    -- A link has an IPv4 route only: answer AAAA with no address (NODATA) so that
    -- clients go straight to the IPv4 synthetic address instead of an unroutable one.
    rcode, verdict = core.dns.NOERROR, "nodata"
    reason = "no IPv6 route on the sandbox's link (allowed by " .. entry .. ")"
  else
    local text, bytes = self.synth:address(name, q.qtype == core.dns.A and "inet" or "inet6")
    -- `address` answers nil and an error table on failure: only a text address and its
    -- 4 or 16 bytes are an answer.
    if type(text) == "string" and type(bytes) == "string" and (#bytes == 4 or #bytes == 16) then
      addr, rcode, verdict, ip = bytes, core.dns.NOERROR, "answered", text
      reason = "allowed by " .. entry
    else
      rcode, verdict = core.dns.SERVFAIL, "servfail"
      reason = tostring(text == nil and bytes or "no synthetic address")
    end
  end
  -- Another type for an allowed name: NODATA (the name exists, with no such record
  -- here). For any other name it is refused: the tenant learns nothing it could not
  -- learn from an A query either way.
  if q.qtype ~= core.dns.A and q.qtype ~= core.dns.AAAA then
    if allowed and q.qclass == 1 then
      rcode, verdict = core.dns.NOERROR, "nodata"
      reason = "only A and AAAA records are answered (allowed by " .. entry .. ")"
    else
      rcode, verdict, reason = core.dns.REFUSED, "refused", "only A and AAAA queries are answered"
    end
  elseif q.qclass ~= 1 and allowed then
    reason = "only class IN is answered"
  end
  -- verdict is allow/deny like every decision; `answer` says what the responder sent
  -- (an allowed name's NODATA for another type is allowed: nothing was refused).
  local allow = verdict == "answered" or (verdict == "nodata" and q.qtype ~= core.dns.AAAA)
  events.emit({ sandbox = self.id, kind = "dns", name = M.printable(name), ip = ip, qtype = q.qtype,
    answer = verdict, verdict = allow and "allow" or "deny", reason = reason, bytes = 0 })
  return core.dns.answer(query, rcode, addr, M.TTL)
end

local LOOPBACK = { [core.dns.A] = "\127\0\0\1", [core.dns.AAAA] = string.rep("\0", 15) .. "\1" }
local LOOPBACK_TEXT = { [core.dns.A] = "127.0.0.1", [core.dns.AAAA] = "::1" }

-- The sandbox's own hostname: its loopback address for A and AAAA (NODATA for AAAA
-- without an IPv6 route, and for any other type), logged as allowed.
function Responder:answer_hostname(query, q)
  local addr = LOOPBACK[q.qtype]
  if q.qtype == core.dns.AAAA and self.ipv4_only then addr = nil end
  events.emit({ sandbox = self.id, kind = "dns", name = M.printable(q.name), ip = addr and LOOPBACK_TEXT[q.qtype],
    qtype = q.qtype,
    answer = addr and "answered" or "nodata", verdict = "allow", bytes = 0,
    reason = "the sandbox's own hostname (its loopback)" })
  return core.dns.answer(query, core.dns.NOERROR, addr, M.TTL)
end

--- What the policy says of a name for DNS — `{allowed =, why =, entry =}` — cached until
-- the policy changes through the registry (`forget`): deciding and finding the entry
-- again cost ~6 of the ~14 µs an answer took (measured with a loop over
-- Responder:answer). At most `NAME_CACHE` names are kept; a full cache starts over. A
-- policy table changed behind the registry's back (`registry:get(id).decide = …`) may then
-- be answered from the cache, but every connection is still decided live by the acceptor.
function Responder:name_verdict(name, policy)
  local v = self.names[name]
  if v then return v end
  local allowed, why = decision.resolvable(name, policy)
  v = { allowed = allowed, why = why, entry = allowed and M.entry_of(name, policy) or nil }
  if self.names_n >= M.NAME_CACHE then self.names, self.names_n = {}, 0 end
  self.names[name] = v
  self.names_n = self.names_n + 1
  return v
end

--- Drops the cached verdicts: the policy changed.
function Responder:forget()
  self.names, self.names_n = {}, 0
end

-- One query, protected: an error answers SERVFAIL (when the query can be answered at
-- all) and is logged as a deny, never raised into the loop.
function Responder:answer_safely(query)
  local ok, reply = pcall(self.answer, self, query)
  if ok then return reply end
  local q = select(2, pcall(core.dns.parse, query))
  events.emit({ sandbox = self.id, kind = "dns", name = type(q) == "table" and M.printable(q.name) or nil,
    answer = "servfail", verdict = "deny", reason = "responder error: " .. tostring(reply):sub(1, 200), bytes = 0 })
  local ok2, fallback = pcall(core.dns.answer, query, core.dns.SERVFAIL)
  return ok2 and fallback or nil
end

function Responder:udp_ready()
  for _ = 1, 64 do
    local msg, addr, port, localaddr = core.udp.recv(self.udp)
    if not msg then return end
    local reply = self:answer_safely(msg)
    if reply then core.udp.send(self.udp, reply, addr, port, localaddr) end
  end
end

function Responder:tcp_drop(conn)
  if self.tcp_dns[conn] then
    self.tcp_dns[conn] = nil
    conn:close()
    loop.changed()
  end
end

-- Closes the DNS-over-TCP connections silent for TCP_DNS_IDLE seconds (since the accept
-- or the last answer); answers how many remain.
function Responder:tcp_reap(now)
  local n = 0
  for conn, st in pairs(self.tcp_dns) do
    if now - st.last > M.TCP_DNS_IDLE then self:tcp_drop(conn) else n = n + 1 end
  end
  return n
end

function Responder:tcp_accept()
  local c = core.sock.accept(self.tcp, 0)
  if not c then return end
  -- Bounded: a tenant holding connections open must not exhaust the host's fds, so past
  -- the cap, and past a few seconds of silence, DNS over TCP is closed.
  local now = core.clock.monotime()
  if self:tcp_reap(now) >= M.TCP_DNS_MAX then c:close() return end
  self.tcp_dns[c] = { buf = "", last = now, served = 0 }
  loop.changed()
end

-- DNS over TCP: each message a 2-byte length, then the message. Queries pipelined on one
-- connection are answered in order (RFC 7766 6.2.1.1), up to TCP_DNS_QUERIES; then, or
-- on a query longer than TCP_DNS_MSG_MAX, at the client's end, or after TCP_DNS_IDLE
-- seconds of silence, the connection is closed.
function Responder:tcp_read(conn)
  local st = self.tcp_dns[conn]
  if not st then return end
  local chunk, _, errno = core.io.read(conn, 4096)
  if not chunk and errno == core.errno.EAGAIN then return end
  if not chunk or chunk == "" then return self:tcp_drop(conn) end
  local buf = st.buf .. chunk
  while #buf >= 2 do
    local len = buf:byte(1) * 256 + buf:byte(2)
    if len > M.TCP_DNS_MSG_MAX then return self:tcp_drop(conn) end
    if #buf < 2 + len then break end
    local reply = self:answer_safely(buf:sub(3, 2 + len))
    buf = buf:sub(3 + len)
    st.served, st.last = st.served + 1, core.clock.monotime()
    if reply then
      local framed = string.char(#reply // 256, #reply % 256) .. reply
      if core.io.write(conn, framed) ~= #framed then return self:tcp_drop(conn) end
    end
    if st.served >= M.TCP_DNS_QUERIES then return self:tcp_drop(conn) end
  end
  st.buf = buf
end

--- The DNS-over-TCP connections open now.
-- @treturn integer
function Responder:tcp_count()
  local n = 0
  for _ in pairs(self.tcp_dns) do n = n + 1 end
  return n
end

--- When the first DNS-over-TCP connection falls silent for too long (monotonic seconds),
-- or nil: the loop looks at `watch` again then, which closes it.
function Responder:deadline()
  local d
  for _, st in pairs(self.tcp_dns) do
    local at = st.last + M.TCP_DNS_IDLE
    if not d or at < d then d = at end
  end
  return d
end

--- The fds the loop polls for this responder, with their handlers (a connection's
-- entry is marked `conn`, so the loop polls the listeners first). It changes only with
-- `corral.egress.loop.changed`, or at `deadline`.
function Responder:watch()
  local w = {
    { fd = self.udp, on = function() self:udp_ready() end },
    { fd = self.tcp, on = function() self:tcp_accept() end },
  }
  self:tcp_reap(core.clock.monotime())
  for conn in pairs(self.tcp_dns) do
    w[#w + 1] = { fd = conn, conn = true, owner = self.id, on = function() self:tcp_read(conn) end }
  end
  return w
end

--- Closes the listeners and every DNS-over-TCP connection; idempotent.
function Responder:close()
  for conn in pairs(self.tcp_dns) do conn:close() end
  self.tcp_dns = {}
  for _, k in ipairs({ "tcp", "udp" }) do
    if self[k] then self[k]:close(); self[k] = nil end
  end
  loop.changed()
end

return M
