--- Conformance checks: a sandbox with an allowlist reaches what it lists and nothing else,
-- and cannot widen its own list.
--
-- The allowlist names `allowed.test` on port P, resolved to a server of the check's own
-- on the host's loopback. Every attempt sends a fresh token; a breach is that token
-- arriving at one of the check's servers (or the kernel reporting a changed ruleset or
-- mark). The control is the allowed destination reached from the same script.
-- @module corral.conformance.egress
local core = require "corral.core"

local EG = { "network_restriction", "nftables" }

-- The sandbox, the host's servers and the control; or nil and the observation.
local function setup(w)
  local e = { asked = {}, host_ip = w.host_ipv4() }
  e.p = w:tcp_server("127.0.0.1", w:token() .. "\n")
  e.q = w:tcp_server("127.0.0.1", w:token() .. "\n")
  e.udp = w:udp_server("127.0.0.1")
  if not (e.p and e.q and e.udp) then return nil, { unavailable = "cannot listen on the host's loopback" } end
  if e.host_ip then
    e.ip_srv = w:tcp_server(e.host_ip, w:token() .. "\n")
    e.ip_udp = w:udp_server(e.host_ip)
  end
  local asked = e.asked
  local a, err = w:sandbox({ network = { allow = { "allowed.test:" .. e.p.port }, internal = { "127.0.0.0/8" },
    resolve = function(name)
      asked[#asked + 1] = name
      return { "127.0.0.1" }
    end } })
  if not a then return nil, { refused = err } end
  e.a = a
  e.dial = w:dialer(a)
  e.ctl = w:token()
  return e
end

-- Runs the attempt, then the control (the allowed destination), then A's own storage.
local function attempt(w, e, script)
  local out, ok, detail = w:attempt(e.a, script .. "\n" .. e.dial .. " tcp allowed.test " .. e.p.port .. " " .. e.ctl)
  w:pump(0.1)
  local reached = e.p.got:find(e.ctl, 1, true) ~= nil
  local det = reached and ("the allowed destination was reached; " .. detail) or
    ("the allowed destination was not reached; " .. detail)
  return out, ok and reached, det
end

-- Which of the check's servers a token reached, or nil.
local function arrived(e, token)
  for name, s in pairs({ ["127.0.0.1:P"] = e.p, ["127.0.0.1:Q"] = e.q, ["udp 127.0.0.1"] = e.udp,
                         ["the host's address"] = e.ip_srv, ["udp on the host's address"] = e.ip_udp }) do
    if s and s.got:find(token, 1, true) then return name end
  end
  return nil
end

local function seen(e, token, out, ok, detail, extra)
  local where = arrived(e, token)
  return { evidence = (where and ("the attempt's token arrived at " .. where)) or extra, control_ok = ok,
           control_detail = detail, output = out }
end

local ICMP = [[
import socket, sys, struct
host, token = sys.argv[1], sys.argv[2].encode()
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b + b"\0" * (len(b) % 2)))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
    try:
        s = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
    except OSError as e:
        print("icmp-socket", kind, e.errno); continue
    s.settimeout(1)
    pkt = struct.pack("!BBHHH", 8, 0, 0, 0x77, 1) + token
    pkt = pkt[:2] + struct.pack("!H", csum(pkt)) + pkt[4:]
    try:
        s.sendto(pkt, (host, 0))
        data, _ = s.recvfrom(2048)
        if token in data: print("PONG:" + token.decode())
    except OSError as e:
        print("icmp", e.errno)
    break
]]

local MARK = [[
import socket, sys
host, port, token, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.setsockopt(socket.SOL_SOCKET, 36, mark)  # SO_MARK: the plane's own exemption
    print("MARK:%d" % s.getsockopt(socket.SOL_SOCKET, 36))
except OSError as e:
    print("mark", e.errno)
s.settimeout(2)
try:
    s.connect((host, port)); s.sendall(token + b"\n"); print("marked-connect-ok")
except OSError as e:
    print("connect", e.errno)
]]

-- A script that tries every route to the policy: each unix socket the kernel lists
-- (paths and abstract names) is sent an allow line, and every corral-named file the
-- tenant can reach is appended one.
local WIDEN = [[
import os, socket, sys
line = ("allow %s\n" % sys.argv[1]).encode()
for l in open("/proc/net/unix").read().splitlines()[1:]:
    parts = l.split()
    if len(parts) < 8: continue
    name = parts[7]
    addr = "\0" + name[1:] if name.startswith("@") else name
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(0.2); s.connect(addr); s.sendall(line)
        print("sent to", name)
    except OSError:
        pass
for root in ("/run", "/var/lib/corral", "/tmp", "/etc/corral"):
    for d, _, files in os.walk(root):
        for f in files:
            if "corral" in (d + f):
                try: open(os.path.join(d, f), "a").write(line.decode()); print("wrote", d, f)
                except OSError: pass
]]

return {
  {
    id = "egress.denied_name", needs = EG, tools = { "python3" },
    guarantee = "a name not on the allowlist is not reached",
    attempt = "connect to denied.test on the allowed port (resolved by the host to the same server)",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local out, ok, detail = attempt(w, e, e.dial .. " tcp denied.test " .. e.p.port .. " " .. n)
      return seen(e, n, out, ok, detail)
    end,
  },
  {
    id = "egress.denied_ip", needs = EG, tools = { "python3" },
    guarantee = "an IP literal not on the allowlist is not reached (loopback or the host's own address)",
    attempt = "connect to 127.0.0.1:P and to the host's own address by IP literal",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local script = e.dial .. " tcp 127.0.0.1 " .. e.p.port .. " " .. n
      if e.ip_srv then script = script .. "; " .. e.dial .. " tcp " .. e.host_ip .. " " .. e.ip_srv.port .. " " .. n end
      local out, ok, detail = attempt(w, e, script)
      return seen(e, n, out, ok, detail)
    end,
  },
  {
    id = "egress.denied_port", needs = EG, tools = { "python3" },
    guarantee = "an allowed name on a port the allowlist does not name is not reached",
    attempt = "connect to allowed.test on port Q (another server of the check's)",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local out, ok, detail = attempt(w, e, e.dial .. " tcp allowed.test " .. e.q.port .. " " .. n)
      return seen(e, n, out, ok, detail)
    end,
  },
  {
    id = "egress.udp_out", needs = EG, tools = { "python3" },
    guarantee = "UDP that no udp: entry grants does not leave the sandbox: not to a name only a TCP entry "
      .. "names, not to loopback or the host's address (DNS goes to the sandbox's own responder)",
    attempt = "send a datagram to allowed.test, 127.0.0.1 and the host's address on the check's UDP ports",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local script = e.dial .. " udp allowed.test " .. e.udp.port .. " " .. n .. "; " ..
        e.dial .. " udp 127.0.0.1 " .. e.udp.port .. " " .. n
      if e.ip_udp then script = script .. "; " .. e.dial .. " udp " .. e.host_ip .. " " .. e.ip_udp.port .. " " .. n end
      local out, ok, detail = attempt(w, e, script)
      return seen(e, n, out, ok, detail)
    end,
  },
  {
    id = "egress.icmp_out", needs = EG, tools = { "python3" },
    guarantee = "ICMP does not leave the sandbox",
    attempt = "an ICMP echo carrying a fresh token to the host's own address",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      if not e.host_ip then return { unavailable = "the host has no address but loopback to aim ICMP at" } end
      local n = w:token()
      w:write(e.a, "icmp.py", ICMP)
      local out, ok, detail = attempt(w, e, "python3 /storage/icmp.py " .. e.host_ip .. " " .. n)
      return seen(e, n, out, ok, detail,
        out:find("PONG:" .. n, 1, true) and "the host's address echoed the tenant's token" or nil)
    end,
  },
  {
    id = "egress.so_mark", needs = EG, tools = { "python3" },
    guarantee = "the tenant cannot set the mark that exempts the plane's own sockets from the redirect",
    attempt = "setsockopt SO_MARK " .. core.nft.DEFAULT_MARK ..
      ", read it back, and connect marked to the host's address",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      w:write(e.a, "mark.py", MARK)
      local target = e.ip_srv and (e.host_ip .. " " .. e.ip_srv.port) or ("127.0.0.1 " .. e.q.port)
      local mark = core.nft.DEFAULT_MARK
      local out, ok, detail = attempt(w, e, "python3 /storage/mark.py " .. target .. " " .. n .. " " .. mark)
      local marked = out:find("MARK:" .. mark, 1, true) and
        ("the kernel kept mark " .. mark .. " on the tenant's socket") or nil
      return seen(e, n, out, ok, detail, marked)
    end,
  },
  {
    id = "egress.nft_flush", needs = EG, tools = { "python3", "nft", "grep" },
    guarantee = "the tenant cannot change its sandbox's nftables ruleset",
    attempt = "nft flush ruleset, then list what is left, then connect to denied.test",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local out, ok, detail = attempt(w, e, "nft flush ruleset && echo FLUSH-RC:0; " ..
        "echo TABLES:$(nft list ruleset 2>/dev/null | grep -c '^table'); " ..
        e.dial .. " tcp denied.test " .. e.p.port .. " " .. n)
      return seen(e, n, out, ok, detail, (out:find("FLUSH-RC:0", 1, true) and out:find("TABLES:0", 1, true))
        and "nft flushed the sandbox's ruleset" or nil)
    end,
  },
  {
    id = "egress.policy_store", needs = EG, tools = { "python3" },
    guarantee = "the tenant has no path to the policy store: it cannot widen its own allowlist",
    attempt = "send an allow line to every unix socket and corral file it can reach, then connect to denied.test",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      w:write(e.a, "widen.py", WIDEN)
      local out, ok, detail = attempt(w, e, "python3 /storage/widen.py denied.test:" .. e.p.port .. "; " ..
        e.dial .. " tcp denied.test " .. e.p.port .. " " .. n)
      local policy = require("corral").egress.policy(e.a.sb)
      local widened
      if policy and policy.allowlist and policy.allowlist.match and policy.allowlist:match({ name = "denied.test",
        port = e.p.port }) then
        widened = "the sandbox's policy now allows denied.test"
      end
      return seen(e, n, out, ok, detail, widened)
    end,
  },
  {
    id = "egress.dns_exfil", needs = EG, tools = { "python3", "getent" },
    guarantee = "a name the allowlist does not list never leaves the host (no DNS exfiltration)",
    attempt = "resolve and connect to <token>.exfil.invalid",
    control = "allowed.test on port P reached after it; A's own storage",
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local name = n .. ".exfil.invalid"
      local out, ok, detail = attempt(w, e, "getent hosts " .. name .. "; " .. e.dial .. " tcp " .. name .. " " ..
        e.p.port .. " " .. n)
      local leaked
      for _, asked in ipairs(e.asked) do
        if asked:find(n, 1, true) then leaked = "the host was asked to resolve " .. asked end
      end
      return seen(e, n, out, ok, detail, leaked)
    end,
  },
}
