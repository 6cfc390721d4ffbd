-- Host memory of N concurrent relayed connections (default 2,000) through one corral
-- relay loop, each having moved a few bytes both ways and now idle (as held connections
-- are): the process's RSS and the kernel's TCP memory (/proc/net/sockstat) before and
-- after. Peer in the same run: the same N connections held without a relay (the sockets
-- alone), so the difference is what the relay adds.
--   build/corral scripts/bench/egress-conns.lua [N]
local core = require "corral.core"

local N = tonumber(arg and arg[1]) or 2000

local function rss_kib()
  for line in io.lines("/proc/self/status") do
    local v = line:match("^VmRSS:%s+(%d+)")
    if v then return tonumber(v) end
  end
end

local function tcp_pages()
  for line in io.lines("/proc/net/sockstat") do
    local v = line:match("^TCP:.* mem (%d+)")
    if v then return tonumber(v) end
  end
end

local function pair(l, port)
  local x = assert(core.sock.connect("127.0.0.1", port, 1))
  local y = assert(core.sock.accept(l, 1))
  return x, y
end

local function held(with_relay)
  local l, port = assert(core.sock.listen("127.0.0.1", 0))
  local loop = with_relay and assert(core.relay.new())
  collectgarbage()
  local r0, k0 = rss_kib(), tcp_pages()
  local keep = {}
  for _ = 1, N do
    local c, a = pair(l, port)
    local b, s = pair(l, port)
    if loop then
      assert(loop:add_pair(a, b, { key = "bench" }))
      keep[#keep + 1] = { c, s }
    else
      keep[#keep + 1] = { c, a, b, s }
    end
  end
  for _, k in ipairs(keep) do core.sock.send(k[1], "ping") end
  if loop then for _ = 1, 20 do loop:run(0.01) end end
  for _, k in ipairs(keep) do core.sock.send(k[#k], "pong") end
  if loop then for _ = 1, 20 do loop:run(0.01) end end
  collectgarbage()
  local r1, k1 = rss_kib(), tcp_pages()
  for _, k in ipairs(keep) do for _, fd in ipairs(k) do fd:close() end end
  if loop then loop:close() end
  l:close()
  return r1 - r0, (k1 - k0) * 4
end

local pr, pk = held(false)
local rr, rk = held(true)
print(string.format("%d connections: sockets alone: RSS +%d KiB, kernel TCP +%d KiB", N, pr, pk))
print(string.format("%d connections: relayed:       RSS +%d KiB, kernel TCP +%d KiB", N, rr, rk))
print(string.format("relay's own cost: %.2f KiB RSS per connection (ratio relayed/alone %.2f)",
  (rr - pr) / N, pr > 0 and rr / pr or 0))
