-- Host memory of N concurrent connections (default 2,000) through one real sandbox: a
-- `corral run --allow` whose tenant (python3) opens N connections to an echo server of
-- this script's own on the host's loopback, has each echo once, and holds them all open.
-- Measured between the tenant's "ready" (sandbox up, nothing connected) and its
-- "holding" (all N open, each having moved bytes both ways):
--   - the corral process's RSS (VmRSS of the `corral run` process: the Lua state, the
--     relay's tables, the acceptor's);
--   - the kernel's TCP sockets (/proc/net/sockstat "alloc", every netns) and slab memory
--     (/proc/meminfo "Slab": socket structures, their inodes and dentries).
-- Peer in the same run: the same client and server with no sandbox (the client on the
-- host, connected directly), so the kernel figures compare relayed (four sockets a
-- connection: tenant, acceptor side, upstream, server) against direct (two).
--   build/corral scripts/bench/egress-conns.lua [N]    (root: the sandbox needs nftables)
local core = require "corral.core"
local shell = require "corral.shell"

local N = tonumber(arg and arg[1]) or 2000
local here = (arg and arg[0] or ""):match("^(.*)/scripts/bench/") or "."
local host = here .. "/build/corral"
local dir = assert(core.fs.mkdtemp("/tmp/corral-bench-conns-"))

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function read(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

local function field(path, pattern)
  return tonumber(read(path):match(pattern))
end

local function sample(pid)
  return { rss = pid and field("/proc/" .. pid .. "/status", "VmRSS:%s+(%d+)"),
    sockets = field("/proc/net/sockstat", "TCP: inuse %d+ orphan %d+ tw %d+ alloc (%d+)"),
    slab = field("/proc/meminfo", "Slab:%s+(%d+)") }
end

write(dir .. "/server.py", [[
import asyncio, sys
async def serve(r, w):
    try:
        while d := await r.read(4096):
            w.write(d); await w.drain()
    except OSError: pass
    w.close()
async def main():
    srv = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=4096)
    open(sys.argv[1], "w").write(str(srv.sockets[0].getsockname()[1]))
    async with srv: await srv.serve_forever()
asyncio.run(main())
]])
-- ready; (go) open N, echo each; holding; (end) exit
write(dir .. "/client.py", [[
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True); sys.stdin.readline()
socks, echoed = [], 0
for i in range(n):
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"x%d;" % i)
    echoed += s.recv(64) == b"x%d;" % i
    socks.append(s)
print("holding", len(socks), "echoed", echoed, flush=True); sys.stdin.readline()
]])
os.execute(string.format("(ulimit -n %d; exec /usr/bin/python3 %s/server.py %s/port) >/dev/null 2>&1 & " ..
  "echo $! > %s/server.pid", N * 2 + 64, dir, dir, dir))
local port
for _ = 1, 100 do
  port = tonumber(read(dir .. "/port"))
  if port then break end
  os.execute("sleep 0.05")
end
assert(port, "the echo server did not start")

-- Runs the client under `prefix` (a shell line that ends by exec-ing the client with the
-- arguments that follow it): samples at ready and at holding, then lets it end.
local function measure(label, prefix, pidfile)
  local out = dir .. "/" .. label .. ".out"
  local w = assert(io.popen(prefix .. " >" .. out .. " 2>&1", "w"))
  local function wait_for(word)
    for _ = 1, 1200 do
      local text = read(out)
      if text:find(word, 1, true) then return text end
      os.execute("sleep 0.05")
    end
    error(label .. ": no " .. word .. ": " .. read(out))
  end
  wait_for("ready")
  local pid = pidfile and read(pidfile):match("%d+")
  collectgarbage()
  local before = sample(pid)
  local t0 = core.clock.monotime()
  w:write("go\n")
  w:flush()
  local text = wait_for("holding")
  local took = core.clock.monotime() - t0
  os.execute("sleep 0.5") -- the loop's last turns, the slab settling
  local after = sample(pid)
  w:write("end\n")
  w:close()
  local held, echoed = text:match("holding (%d+) echoed (%d+)")
  return { rss = pid and (after.rss - before.rss), sockets = after.sockets - before.sockets,
    slab = after.slab - before.slab, held = tonumber(held), echoed = tonumber(echoed), took = took }
end

local ok, err = pcall(function()
  local direct = measure("direct", string.format("exec /usr/bin/python3 %s/client.py 127.0.0.1 %d %d", dir, port, N))
  local program = shell.quote(read(dir .. "/client.py"))
  local relayed = measure("relayed", string.format("echo $$ > %s/corral.pid; exec %s run --nofile %d " ..
    "--allow echo.test:%d --resolve echo.test=127.0.0.1 --internal 127.0.0.0/8 -- /usr/bin/python3 -c %s " ..
    "echo.test %d %d", dir, host, N + 64, port, program, port, N), dir .. "/corral.pid")
  print(string.format("%d connections held open, each echoed once (kernel %s):", N, select(2, core.proc.uname())))
  for _, r in ipairs({ { "direct", direct }, { "relayed", relayed } }) do
    local m = r[2]
    print(string.format("  %-8s %d held, %d echoed in %.1f s; kernel TCP sockets +%d, slab +%.1f MiB%s", r[1],
      m.held or 0, m.echoed or 0, m.took, m.sockets, m.slab / 1024,
      m.rss and string.format("; corral RSS +%.1f MiB (%.2f KiB a connection)", m.rss / 1024, m.rss / N) or ""))
  end
  print(string.format("relayed / direct: kernel slab %.2f, TCP sockets %.2f; host memory the sandbox adds for %d: " ..
    "%.1f MiB (corral RSS + slab over direct)", relayed.slab / math.max(1, direct.slab),
    relayed.sockets / math.max(1, direct.sockets), N, (relayed.rss + relayed.slab - direct.slab) / 1024))
end)
os.execute("kill $(cat " .. dir .. "/server.pid) 2>/dev/null")
core.fs.remove_tree(dir)
assert(ok, err)
