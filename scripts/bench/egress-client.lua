-- The relay under real clients, through a real sandbox (issue 14), ratios against the
-- same client direct, measured in one run:
--  1. iperf3 through `corral run --resolve bench.test=127.0.0.1 --internal 127.0.0.0/8
--     --allow bench.test:5201 -- iperf3 -c bench.test -p 5201 -t T -J` against
--     `iperf3 -c 127.0.0.1` from the host, to one `iperf3 -s` this driver starts on
--     127.0.0.1: one stream and -P 8, each way (-R: the server sends), ROUNDS interleaved
--     rounds (the order alternating), medians and their ratio (goal >= 0.90).
--  2. CONNS connections opened and closed one after another through one sandbox (curl,
--     HTTP/1.0 to python3's http.server, which closes each), the corral process's fds
--     and RSS before (after a first connection) and after, and how many it logged.
--   build/corral scripts/bench/egress-client.lua [T] [ROUNDS] [CONNS]
-- scripts/bench/egress runs it in a network namespace of its own (lo only), with
-- /run/corral on a tmpfs of its own, as root.
local core = require "corral.core"
local shell = require "corral.shell"
local json = require "dkjson"
package.path = (core.proc.host_executable():match("^(.*)/build/[^/]+$") or ".") .. "/scripts/bench/?.lua;" ..
  package.path
local census = require "census"

local T, ROUNDS, CONNS = tonumber(arg[1]) or 3, tonumber(arg[2]) or 3, tonumber(arg[3]) or 10000
local HOST, slurp = census.HOST, census.slurp
local IPERF_PORT, HTTP_PORT = 5201, 8080

local function wait_for(path, seconds)
  local deadline = core.clock.monotime() + seconds
  while not core.fs.lstat(path) do
    if core.clock.monotime() > deadline then return false end
    os.execute("sleep 0.05")
  end
  return true
end

local function wait_listening(port)
  for _ = 1, 200 do
    local c = core.sock.connect("127.0.0.1", port, 1)
    if c then
      c:close()
      return true
    end
    os.execute("sleep 0.05")
  end
  return false
end

-- A server this driver started (its pid, so it can be ended), output to a file.
local function start(argv, port)
  local p = assert(io.popen("echo $$; exec " .. shell.join(argv) .. " >/dev/null 2>&1", "r"))
  local pid = tonumber(p:read("l"))
  assert(wait_listening(port), argv[1] .. " never listened on " .. port)
  return { p = p, pid = pid }
end

local function stop(server)
  core.proc.kill(server.pid, 15)
  server.p:close()
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  if #s == 0 then return 0 end
  if #s % 2 == 1 then return s[(#s + 1) // 2] end
  return (s[#s // 2] + s[#s // 2 + 1]) / 2
end

local RUN = { HOST, "run", "--resolve", "bench.test=127.0.0.1", "--internal", "127.0.0.0/8" }
local function run_argv(extra, tenant)
  local argv = {}
  for _, a in ipairs(RUN) do argv[#argv + 1] = a end
  for _, a in ipairs(extra) do argv[#argv + 1] = a end
  argv[#argv + 1] = "--"
  for _, a in ipairs(tenant) do argv[#argv + 1] = a end
  return argv
end

local TICKS = 100 -- USER_HZ: /proc/PID/stat's clock ticks a second on Linux

-- One iperf3 client run: Gbit/s at the receiver, and CPU seconds per GiB moved of the
-- client and server together (iperf3's own figures) and of the relaying corral process
-- (its utime + stime, read from /proc once it has exited and before it is reaped).
local function iperf(through_sandbox, flags)
  local client = { "iperf3", "-c", through_sandbox and "bench.test" or "127.0.0.1", "-p", tostring(IPERF_PORT),
    "-t", tostring(T), "-J" }
  for _, f in ipairs(flags) do client[#client + 1] = f end
  local argv = through_sandbox and run_argv({ "--allow", "bench.test:" .. IPERF_PORT }, client) or client
  local out_file = os.tmpname()
  -- fd 3 keeps the pipe open until the command is gone: its EOF says it has exited
  local p = assert(io.popen("echo $$; exec 3>&1 " .. shell.join(argv) .. " >" .. out_file .. " 2>/dev/null", "r"))
  local pid = p:read("l")
  p:read("a")
  local stat = slurp("/proc/" .. pid .. "/stat") or ""
  p:close()
  local out = slurp(out_file) or ""
  os.remove(out_file)
  local r = json.decode(out)
  if type(r) ~= "table" or not r["end"] or not r["end"].sum_received then
    return nil, (type(r) == "table" and r.error) or out:sub(1, 200)
  end
  local e = r["end"]
  local gib = e.sum_received.bytes / 2 ^ 30
  local seconds = e.sum_received.seconds or T
  local cpu = e.cpu_utilization_percent or {}
  local ends = ((cpu.host_total or 0) + (cpu.remote_total or 0)) / 100 * seconds / gib
  local relay
  if through_sandbox then
    -- fields after the command's name: state is 1st, utime 12th, stime 13th
    local rest = stat:match("%) (.*)$") or ""
    local f = {}
    for w in rest:gmatch("%S+") do f[#f + 1] = w end
    relay = ((tonumber(f[12]) or 0) + (tonumber(f[13]) or 0)) / TICKS / gib
  end
  return e.sum_received.bits_per_second / 1e9, ends, relay
end

local iperf_server = start({ "iperf3", "-s", "-B", "127.0.0.1", "-p", tostring(IPERF_PORT) }, IPERF_PORT)
os.execute(shell.join({ HOST, "probe" }) .. " >/dev/null 2>&1")
local CONFIGS = {
  { name = "1 stream, client sends", flags = {} },
  { name = "1 stream, server sends (-R)", flags = { "-R" } },
  { name = "-P 8, client sends", flags = { "-P", "8" } },
  { name = "-P 8, server sends (-R)", flags = { "-P", "8", "-R" } },
}
for _, c in ipairs(CONFIGS) do
  c.direct, c.sandbox, c.ratios, c.cpu = {}, {}, {}, { direct = {}, ends = {}, relay = {} }
end
print(string.format("iperf3 through a sandbox against direct: %d s each, %d interleaved rounds; " ..
  "load average %s", T, ROUNDS, (slurp("/proc/loadavg") or ""):match("^(%S+ %S+ %S+)")))
for round = 1, ROUNDS do
  for _, c in ipairs(CONFIGS) do
    local order = round % 2 == 1 and { false, true } or { true, false }
    local got = {}
    for _, through in ipairs(order) do
      local gbps, ends, relay = iperf(through, c.flags)
      if not gbps then
        print(string.format("  %s, %s: failed: %s", c.name, through and "sandbox" or "direct", tostring(ends)))
      elseif through then
        c.cpu.ends[#c.cpu.ends + 1], c.cpu.relay[#c.cpu.relay + 1] = ends, relay
      else
        c.cpu.direct[#c.cpu.direct + 1] = ends
      end
      got[through] = gbps
    end
    if got[false] and got[true] then
      c.direct[#c.direct + 1], c.sandbox[#c.sandbox + 1] = got[false], got[true]
      c.ratios[#c.ratios + 1] = got[true] / got[false]
    end
  end
end
stop(iperf_server)
print(string.format("%-30s %8s %8s %6s  %-16s %s", "Gbit/s (median of rounds)", "direct", "sandbox", "ratio",
  "each round", "CPU-s/GiB: direct; sandbox (ends + corral)"))
for _, c in ipairs(CONFIGS) do
  local d, s = median(c.direct), median(c.sandbox)
  local each = {}
  for _, r in ipairs(c.ratios) do each[#each + 1] = string.format("%.2f", r) end
  local ends, relay = median(c.cpu.ends), median(c.cpu.relay)
  print(string.format("%-30s %8.2f %8.2f %6.2f  %-16s %.2f; %.2f (%.2f + %.2f)  goal >= 0.90: %s", c.name, d, s,
    d > 0 and s / d or 0, table.concat(each, " "), median(c.cpu.direct), ends + relay, ends, relay,
    d > 0 and s / d >= 0.90 and "met" or "NOT met"))
end
local nproc = io.popen("nproc")
print(string.format("(%s CPUs: a relayed byte crosses loopback TCP twice, so the path's CPU per GiB, " ..
  "not the relay's speed alone, bounds the ratio once the CPUs are busy)", nproc:read("l")))
nproc:close()

-- CONNS connections through one sandbox.
if CONNS > 0 then
  local dir = assert(core.fs.mkdtemp("/tmp/corral-bench-conns-"))
  core.fs.chmod(dir, tonumber("711", 8))
  local docroot = dir .. "/www"
  os.execute("mkdir -p " .. docroot .. " && echo ok > " .. docroot .. "/index.html")
  local http = start({ "/usr/bin/python3", "-m", "http.server", "-b", "127.0.0.1", "-d", docroot,
    tostring(HTTP_PORT) }, HTTP_PORT)
  local storage, log = dir .. "/storage", dir .. "/log.jsonl"
  local url = "http://bench.test:" .. HTTP_PORT .. "/index.html"
  -- In two halves, sampled after each: what the first half adds and the second does not
  -- is warm-up (the allocator, the log's buffers), not growth per connection.
  local half = CONNS // 2
  local function batch(from, to, mark)
    return "curl -sS -o /dev/null -w '%{http_code} %{num_connects}\\n' '" .. url .. "?[" .. from .. "-" .. to ..
      "]' >> /storage/codes; touch /storage/" .. mark .. "; sleep 1"
  end
  local tenant = table.concat({
    "curl -sS -o /dev/null " .. url .. " && touch /storage/one && sleep 1",
    batch(1, half, "half"), batch(half + 1, CONNS, "done"), "sleep 2" }, "; ")
  local argv = run_argv({ "--allow", "bench.test:" .. HTTP_PORT, "--storage", storage, "--log-json", log },
    { "sh", "-c", tenant })
  local p = assert(io.popen("echo $$; exec " .. shell.join(argv) .. " >/dev/null 2>&1", "r"))
  local pid = tonumber(p:read("l"))
  local function sample()
    local fds = #(core.fs.listdir("/proc/" .. pid .. "/fd") or {})
    local rss = tonumber((slurp("/proc/" .. pid .. "/status") or ""):match("VmRSS:%s+(%d+)"))
    return { fds = fds, rss = rss }
  end
  local samples, seconds = {}, nil
  if wait_for(storage .. "/one", 30) then
    samples[1] = sample()
    local t0 = core.clock.monotime()
    if wait_for(storage .. "/half", 600) then
      os.execute("sleep 0.5")
      samples[2] = sample()
      if wait_for(storage .. "/done", 600) then
        seconds = core.clock.monotime() - t0 - 1.5
        os.execute("sleep 0.5")
        samples[3] = sample()
      end
    end
  end
  p:close()
  stop(http)
  local codes = {}
  for line in (slurp(storage .. "/codes") or ""):gmatch("[^\n]+") do codes[line] = (codes[line] or 0) + 1 end
  local answers = {}
  for line, n in pairs(codes) do answers[#answers + 1] = n .. "x \"" .. line .. "\"" end
  local closed = 0
  for line in (slurp(log) or ""):gmatch("[^\n]+") do
    local e = json.decode(line)
    if e and e.kind == "closed" and e.port == HTTP_PORT then closed = closed + 1 end
    -- the log writes at most so many events a second, and says how many it left out
    if e and e.kind == "suppressed" and e.class == "closed" then closed = closed + e.suppressed end
  end
  os.execute("rm -rf " .. shell.quote(dir))
  print()
  if not samples[3] then
    print(string.format("%d connections through one sandbox: did not finish (answers: %s)", CONNS,
      table.concat(answers, ", ")))
  else
    local a, b, c = samples[1], samples[2], samples[3]
    print(string.format("%d connections opened and closed through one sandbox (curl to http.server, " ..
      "\"code connects\" each) in %.1f s: %s; the log counts %d closed (with a first one)", CONNS, seconds,
      table.concat(answers, ", "), closed))
    print(string.format("  corral process fds: %d after the first, %d after %d, %d after %d (%s)", a.fds, b.fds,
      half, c.fds, CONNS, c.fds <= a.fds and "no growth" or "GREW"))
    print(string.format("  corral process RSS: %d KiB after the first, %d after %d (%+d), %d after %d (%+d)", a.rss,
      b.rss, half, b.rss - a.rss, c.rss, CONNS, c.rss - b.rss))
  end
end
