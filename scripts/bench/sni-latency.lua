-- The SNI check's added connect latency: N connections through one sandbox's plane, each
-- a real ClientHello (captured from openssl s_client, SNI api.test) sent at once after
-- the connect, timed from the tenant's connect() to the moment the upstream server (on
-- the host's loopback) has the ClientHello — with `network.sni = "off"` and "match",
-- alternating, so both see the same machine. Prints p50 and p90 of each and the
-- difference, and the parser alone (core.sni.parse on the same bytes).
--   build/corral scripts/bench/sni-latency.lua [N]    (root: the plane needs nftables)
local core = require "corral.core"
local plane = require "corral.egress.plane"
local loop = require "corral.egress.loop"
local egress = require "corral.egress"

local N = tonumber(arg and arg[1]) or 400
local here = (arg and arg[0] or ""):match("^(.*)/scripts/bench/") or "."
local hello = assert(io.open(here .. "/tests/fuzz/corpus/sni/tls-openssl-sni", "rb")):read("a")

local srv, port = assert(core.sock.listen("127.0.0.1", 0))
local function plane_for(mode)
  local id = "sni-bench-" .. mode
  local p = assert(plane.new(id, { allow = { "api.test:" .. port }, resolve = { ["api.test"] = "127.0.0.1" },
    internal = { "127.0.0.0/8" }, sni = mode }))
  loop.add(p)
  return p, assert(egress.address(id, "api.test"))
end

local function once(p, addr)
  local t0 = core.clock.monotime()
  local c = assert(core.sock.connect_marked(addr, port, 0, 2, p.netns))
  assert(core.sock.send(c, hello) == #hello)
  local up
  while not up do
    loop.step(0)
    up = core.sock.accept(srv, 0)
  end
  local got = ""
  while #got < #hello do
    loop.step(0)
    got = got .. (core.sock.recv(up, 65536, 0) or "")
  end
  local dt = core.clock.monotime() - t0
  c:close()
  up:close()
  for _ = 1, 3 do loop.step(0) end
  return dt
end

local function pct(t, q)
  table.sort(t)
  return t[math.max(1, math.floor(#t * q + 0.5))] * 1e6
end

local off, off_addr = plane_for("off")
local match, match_addr = plane_for("match")
local times = { off = {}, match = {} }
for i = 1, N + 20 do
  local a, b = once(off, off_addr), once(match, match_addr)
  if i > 20 then -- warm-up first
    times.off[#times.off + 1], times.match[#times.match + 1] = a, b
  end
end
local p50o, p50m = pct(times.off, 0.5), pct(times.match, 0.5)
print(string.format("connect to first byte upstream, %d connections each:", N))
print(string.format("  sni=off    p50 %7.1f us   p90 %7.1f us", p50o, pct(times.off, 0.9)))
print(string.format("  sni=match  p50 %7.1f us   p90 %7.1f us", p50m, pct(times.match, 0.9)))
print(string.format("  added by the check (p50): %.1f us", p50m - p50o))
local t0, K = core.clock.monotime(), 100000
for _ = 1, K do core.sni.parse(hello) end
print(string.format("core.sni.parse on a %d-byte ClientHello: %.2f us", #hello, (core.clock.monotime() - t0) / K * 1e6))
loop.remove(off)
loop.remove(match)
off:close()
match:close()
