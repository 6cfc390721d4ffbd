-- Round trips of one UDP flow through a sandbox's UDP relay (the ruleset's mark, the
-- route to lo, TPROXY, core.udprelay, an upstream socket on the host) against the same
-- round trips sent straight to the echo socket on the host's loopback: the p50 and p99
-- of each, and the ratio. One process drives both (the echo, the relay and the client
-- take turns), so the figures are the relay's added work, not scheduling. Needs root.
--   build/corral scripts/bench/udp-relay.lua [ROUND_TRIPS] [SIZE]
local core = require "corral.core"

local N = tonumber(arg and arg[1]) or 5000
local SIZE = tonumber(arg and arg[2]) or 1200

local host_ns = assert(core.rtnl.netns_open("/proc/self/ns/net"))
local echo, echo_port = assert(core.listen.in_netns(host_ns, "udp", "127.0.0.1", 0))

local ns = assert(core.ns.new_net())
assert(core.rtnl.lo_default_routes(ns))
assert(core.rtnl.mark_local(ns, 43, 43))
local relay, port = assert(core.udprelay.new(ns, { mark = 42 }))
assert(core.nft.apply(ns, { dns_port = 53, acceptor_port = 4000, udp_port = port, udp_mark = 43,
  udp_ports = { 9 } }))

local function serve_echo()
  local data, addr, p = core.udp.recv(echo)
  if data then core.udp.send(echo, data, addr, p) end
  return data ~= nil
end

local function serve_relay()
  for _, ev in ipairs(relay:run()) do
    if ev.kind == "new" then assert(relay:allow(ev.id, { "127.0.0.1" }, echo_port, 60)) end
  end
end

-- One round trip from client c to ip:p; seconds.
local payload = string.rep("q", SIZE)
local function round_trip(c, ip, p, through_relay)
  local t0 = core.clock.monotime()
  assert(core.udp.send(c, payload, ip, p))
  while true do
    if through_relay then serve_relay() end
    serve_echo()
    if through_relay then serve_relay() end
    local back = core.udp.recv(c)
    if back then
      assert(#back == SIZE)
      return core.clock.monotime() - t0
    end
  end
end

local function run(c, ip, p, through_relay)
  for _ = 1, 200 do round_trip(c, ip, p, through_relay) end -- warm-up (and the flow's decision)
  local t = {}
  for i = 1, N do t[i] = round_trip(c, ip, p, through_relay) end
  table.sort(t)
  return t[N // 2 + 1], t[math.floor(N * 0.99)]
end

local direct = assert(core.listen.in_netns(host_ns, "udp", "127.0.0.1", 0))
local d50, d99 = run(direct, "127.0.0.1", echo_port, false)
-- the tenant's socket, inside the sandbox's netns, to a synthetic address on port 9
local tenant = assert(core.listen.in_netns(ns, "udp", "127.0.0.1", 0))
local r50, r99 = run(tenant, "198.18.1.2", 9, true)

print(string.format("UDP round trip, %d bytes, %d trips: direct p50 %.1f us p99 %.1f us; relayed p50 %.1f us "
  .. "p99 %.1f us; relayed/direct p50 %.2f, added p50 %.1f us", SIZE, N, d50 * 1e6, d99 * 1e6, r50 * 1e6,
  r99 * 1e6, r50 / d50, (r50 - d50) * 1e6))

relay:shutdown()
relay:run()
relay:close()
for _, fd in ipairs({ tenant, direct, echo, ns, host_ns }) do fd:close() end
