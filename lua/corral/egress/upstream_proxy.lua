--- `--upstream-proxy http://HOST:PORT`: every relayed TCP connection leaves through an
-- HTTP proxy's CONNECT tunnel, for operators whose network reaches the internet only
-- that way.
--
-- The connection is decided exactly as without a proxy first: the allowlist, the hook,
-- the host's resolution of the name and the range check of every address it gave. The
-- proxy is then asked for **the address corral resolved and checked** (`CONNECT
-- 203.0.113.7:443`), never for the name: were it asked for the name it would resolve it
-- again, and could reach an address corral never checked (a private range, the metadata
-- service, a name that rebinds between the two lookups). The cost: a proxy that admits
-- by name sees only addresses, and the name's other addresses are not raced (the first
-- in happy-eyeballs order is asked). TLS inside the tunnel still names the host (SNI),
-- and a terminated connection's certificate is still verified for the name.
--
-- The proxy's own address is the operator's: it is not range-checked. Its answer must be
-- a 2xx within the connect timeout; anything else refuses the connection (core.relay's
-- `preface`). UDP (`udp:` entries) cannot go through it: refused with the flag.
-- @module corral.egress.upstream_proxy
local core = require "corral.core"

local M = {}

--- "http://HOST:PORT" → `{ip =, port =, text =}` (a name resolved now, by the host), or
-- nil and why.
-- @tparam string text
function M.parse(text)
  local host, port = text:match("^[hH][tT][tT][pP]://([^/@]+):(%d+)/?$")
  if not host then return nil, string.format("%q: expected http://HOST:PORT (e.g. http://10.0.0.1:3128)", text) end
  port = tonumber(port)
  if port < 1 or port > 65535 then return nil, text .. ": a port is 1-65535" end
  host = host:match("^%[(.*)%]$") or host
  local ip = core.inet.parse(host) and host
  if not ip then
    local addrs, err = core.lookup.host(host)
    if not addrs or not addrs[1] then
      return nil, string.format("%s: cannot resolve %s on the host: %s", text, host, tostring(err))
    end
    ip = addrs[1]
  end
  return { ip = ip, port = port, text = text }
end

--- Where a connection decided for `upstream` (an address, or the list of them in the
-- order they would be raced) and port goes through proxy: the proxy's address and port,
-- and the relay's preface (the CONNECT request).
-- @tparam table proxy from `parse`
-- @tparam string|{string,...} upstream
-- @tparam integer port
-- @treturn string ip
-- @treturn integer port
-- @treturn string preface
function M.route(proxy, upstream, port)
  local addr = type(upstream) == "table" and upstream[1] or upstream
  local target = string.format(addr:find(":", 1, true) and "[%s]:%d" or "%s:%d", addr, port)
  return proxy.ip, proxy.port, string.format("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
end

return M
