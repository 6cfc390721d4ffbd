-- The SNI check's added latency, two ways, N connections each (default 2,000):
--  1. inside the acceptor: the time from the peek of a connection's first flight to the
--     check's verdict (core.sni.peek and sni_hold.sni_verdict timed where the acceptor
--     calls them), summed per connection — the check's own cost on the connection's path,
--     against the goal p50 <= 20 us. Beside it, the whole acceptor handler (accept,
--     decision, check, resolve, the relay's connect) for scale.
--  2. end to end, in this one process (no wake-ups between processes): a tenant's
--     connect() to the moment the upstream server (this script's, on the host loopback)
--     holds the ClientHello, with `network.sni = "off"` and "match" interleaved one for
--     one; the p50 of the per-pair differences with its quartiles, since the two
--     distributions' own spread (scheduling on a shared machine) is larger than what
--     is measured.
-- The ClientHello is a real one (openssl s_client -servername api.test), sent at once.
--   build/corral scripts/bench/sni-latency.lua [N]    (root: the plane needs nftables)
local core = require "corral.core"
local plane = require "corral.egress.plane"
local loop = require "corral.egress.loop"
local sni_hold = require "corral.egress.sni_hold"
local egress = require "corral.egress"

local N = tonumber(arg and arg[1]) or 2000
local here = (arg and arg[0] or ""):match("^(.*)/scripts/bench/") or "."
local hello = assert(io.open(here .. "/tests/fuzz/corpus/sni/tls-openssl-sni", "rb")):read("a")
local clock = core.clock.monotime

-- 1. timestamps where the acceptor peeks and judges
local check_us, handler_us = {}, {}
local started, spent
local peek, verdict = core.sni.peek, sni_hold.sni_verdict
core.sni.peek = function(...)
  started = clock()
  return peek(...)
end
sni_hold.sni_verdict = function(...)
  local a, b = verdict(...)
  spent = (spent or 0) + (clock() - started)
  return a, b
end

local srv, port = assert(core.sock.listen("127.0.0.1", 0))
local function plane_for(mode)
  local id = "sni-bench-" .. mode
  local p = assert(plane.new(id, { allow = { "api.test:" .. port }, resolve = { ["api.test"] = "127.0.0.1" },
    internal = { "127.0.0.0/8" }, sni = mode }))
  loop.add(p)
  -- the whole handler, per accepted connection (the hello is there at once here)
  local accept = p.acceptor.accept
  p.acceptor.accept = function(self, ...)
    local t0 = clock()
    spent = nil
    accept(self, ...)
    if mode == "match" and spent then
      handler_us[#handler_us + 1] = (clock() - t0) * 1e6
      check_us[#check_us + 1] = spent * 1e6
    end
  end
  return p, assert(egress.address(id, "api.test"))
end

local function once(p, addr)
  local t0 = clock()
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
  local dt = clock() - t0
  c:close()
  up:close()
  for _ = 1, 3 do loop.step(0) end
  return dt * 1e6
end

local function pct(t, q)
  local s = table.move(t, 1, #t, 1, {})
  table.sort(s)
  return s[math.max(1, math.floor(#s * q + 0.5))]
end

local off, off_addr = plane_for("off")
local match, match_addr = plane_for("match")
local times, diffs = { off = {}, match = {} }, {}
for i = 1, N + 50 do
  -- which goes first alternates, so neither always follows the other's clean-up
  local a, b
  if i % 2 == 0 then
    a, b = once(off, off_addr), once(match, match_addr)
  else
    b, a = once(match, match_addr), once(off, off_addr)
  end
  if i > 50 then -- warm-up first
    times.off[#times.off + 1], times.match[#times.match + 1] = a, b
    diffs[#diffs + 1] = b - a
  end
end
for _ = 1, 50 do table.remove(check_us, 1); table.remove(handler_us, 1) end

print(string.format("SNI check (peek + parse + verdict) inside the acceptor, %d connections:", #check_us))
print(string.format("  p50 %.1f us   p90 %.1f us   (goal p50 <= 20 us: %s)", pct(check_us, 0.5), pct(check_us, 0.9),
  pct(check_us, 0.5) <= 20 and "met" or "MISSED"))
print(string.format("  for scale, the whole acceptor handler (accept, decide, check, resolve, connect): p50 %.1f us",
  pct(handler_us, 0.5)))
print(string.format("connect to ClientHello upstream, in one process, %d interleaved pairs:", N))
print(string.format("  sni=off    p50 %7.1f us   p90 %7.1f us", pct(times.off, 0.5), pct(times.off, 0.9)))
print(string.format("  sni=match  p50 %7.1f us   p90 %7.1f us", pct(times.match, 0.5), pct(times.match, 0.9)))
print(string.format("  match - off, per pair: p50 %.1f us (p25 %.1f, p75 %.1f)", pct(diffs, 0.5), pct(diffs, 0.25),
  pct(diffs, 0.75)))
local t0, K = clock(), 100000
for _ = 1, K do core.sni.parse(hello) end
print(string.format("core.sni.parse alone on the %d-byte ClientHello: %.2f us", #hello, (clock() - t0) / K * 1e6))
core.sni.peek, sni_hold.sni_verdict = peek, verdict
loop.remove(off)
loop.remove(match)
off:close()
match:close()
srv:close()
