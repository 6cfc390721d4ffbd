--- Fuzz target: the file `corral run --learn FILE` writes, read back as `--allow-file
-- FILE` (the way it is meant to be used). Every input is a sequence of egress events,
-- one a line: "<kind><host> <port> [count]" with kind d (a name answered), c (a TCP
-- connection denied) or u (a UDP flow denied), host a name of the octets a name the
-- egress answers may hold ([A-Za-z0-9_-] labels; corral.dns refuses any other) or an IP
-- address as the relays write one. What --learn writes from any such run must be read
-- back by --allow-file, never refused, never raising, with every entry it listed.
local S = require "support"
local core = require "corral.core"
local events = require "corral.egress.events"
local learn = require "corral.egress.learn"
local run_options = require "corral.egress.run_options"

local KINDS = { d = "dns", c = "connect", u = "udp" }

-- The event a line stands for, or nil when it is not one the egress could emit.
local function event(line)
  local k, host, port, count = line:match("^(%a)(%S+) (%d+) ?(%d*)$")
  local kind = KINDS[k]
  port = math.tointeger(tonumber(port))
  if not kind or not port or port < 1 or port > 65535 or #host > 253 then return nil end
  local ev = { kind = kind, sandbox = "fuzz", port = port, verdict = "deny", count = math.tointeger(tonumber(count)),
    answer = "answered" }
  if host:match("^[%w_%-]+[%w_%-%.]*$") and not host:find("..", 1, true) and not core.inet.parse(host) then
    ev.name = host:gsub("%.$", "")
  elseif core.inet.parse(host) then
    ev.ip = host
  else
    return nil
  end
  return ev
end

return function(data)
  local path = S.scratch .. "/learned"
  os.remove(path)
  local rec = learn.start(path, { sandbox = "fuzz" })
  for _, line in ipairs(S.lines(data)) do
    local ev = event(line)
    if ev then events.emit(ev) end
  end
  local ok, n = rec.finish()
  S.check(ok, "--learn wrote its file: " .. tostring(n))
  local network, err = S.no_raise("run_options.network", run_options.network, { ["allow-file"] = path })
  S.check(err == nil, "what --learn wrote, --allow-file reads: " .. tostring(err))
  S.check(#(network and network.allow or {}) == n, "every entry --learn wrote is read back")
end
