-- N sandboxes with allowlists alive at once (issue 14: 100 on this machine), as a user
-- starts them: one `corral run` each, in the background, one after another, each
-- tenant announcing itself with a line through its relay and then sleeping. Printed:
-- the set-up time of each (from `corral run` to its tenant's line at the server: the
-- probe-cache read, storage, netns, ruleset, responder, acceptor, spawn, a DNS answer
-- and a relayed connection) — goal: the 100th within 2x the first; host memory per
-- sandbox; and the clean-up once every run was sent SIGTERM, checked by the census
-- of scripts/bench/census.lua, in whose private world (own cgroup, pid, mount and network
-- namespaces) the run happens.
--   build/corral scripts/bench/scale.lua [--json] [N]
--
-- Memory per sandbox, three ways: the corral processes' own (RSS, and PSS, which
-- shares the pages every corral process maps between them) and their tenants'; the
-- growth of the run's memory cgroup (user and kernel memory charged to it: every corral
-- process, tenant, netns object, socket and tmpfs file of the run), and of its kernel
-- part alone; and the growth of the machine's slab (/proc/meminfo), which other
-- processes on the machine move too.
local core = require "corral.core"
local shell = require "corral.shell"
package.path = (core.proc.host_executable():match("^(.*)/build/[^/]+$") or ".") .. "/scripts/bench/?.lua;" ..
  package.path
local census = require "census"

local HOST, slurp = census.HOST, census.slurp

local args = { n = 100 }
for _, a in ipairs(arg) do
  if a == "--json" then args.json = true
  elseif a == "--inside" then args.inside = true
  elseif a:match("^%d+$") then args.n = tonumber(a)
  else
    io.stderr:write("usage: corral scripts/bench/scale.lua [--json] [N]\n")
    os.exit(2)
  end
end

local WORK = "/tmp/scale-work"
local PORT = 5201

-- The run's memory cgroup: charged bytes, and the kernel's part of them.
local function cgroup_memory()
  local info = core.cgroup.info() or { paths = {} }
  local v1 = info.paths.memory
  if v1 and slurp(v1 .. "/memory.usage_in_bytes") then
    return tonumber(slurp(v1 .. "/memory.usage_in_bytes")), tonumber(slurp(v1 .. "/memory.kmem.usage_in_bytes") or "")
  end
  local v2 = info.paths.unified
  if v2 and slurp(v2 .. "/memory.current") then
    local stat = slurp(v2 .. "/memory.stat") or ""
    return tonumber(slurp(v2 .. "/memory.current")), tonumber(stat:match("\nkernel (%d+)") or "")
  end
  return nil
end

local function memory()
  local m = {}
  m.cgroup, m.cgroup_kernel = cgroup_memory()
  local meminfo = slurp("/proc/meminfo")
  m.slab_kib = census.kib(meminfo, "Slab")
  m.available_kib = census.kib(meminfo, "MemAvailable")
  return m
end

-- RSS and PSS (KiB) of the processes named `comm` but the driver, and how many.
local function processes_memory(comm)
  local n, rss, pss = 0, 0, 0
  local me = tostring(core.proc.getpid())
  for _, pid in ipairs(census.numeric_entries("/proc")) do
    if pid ~= me and (slurp("/proc/" .. pid .. "/comm") or ""):gsub("\n", "") == comm then
      n = n + 1
      local rollup = slurp("/proc/" .. pid .. "/smaps_rollup")
      rss = rss + census.kib(rollup, "Rss")
      pss = pss + census.kib(rollup, "Pss")
    end
  end
  return { n = n, rss_kib = rss, pss_kib = pss }
end

local function inside()
  os.execute("mkdir -p " .. WORK .. " && chmod 0711 " .. WORK)
  local listener = assert(core.sock.listen("127.0.0.1", PORT))
  local function argv(i, tenant)
    return { HOST, "run", "--allow", "bench.test:" .. PORT, "--internal", "127.0.0.0/8",
      "--resolve", "bench.test=127.0.0.1", "--storage", WORK .. "/s" .. i, "--", "sh", "-c", tenant }
  end
  local ANNOUNCE = "echo up | nc -N -w 10 bench.test " .. PORT
  -- the tenant's line, read at the server (the listener), which then closes
  local function announced()
    local c = core.sock.accept(listener, 60)
    if not c then return false end
    local line = core.sock.recv(c, 16, 10)
    c:close()
    return line == "up\n"
  end
  local failures = {}
  local function fail(what) if #failures < 10 then failures[#failures + 1] = what end end

  -- Warm-up: the probe cache, and one sandbox started and ended.
  os.execute(shell.join({ HOST, "probe" }) .. " >/dev/null 2>&1")
  local warm = assert(io.popen(shell.join(argv("warm", ANNOUNCE)) .. " >/dev/null 2>&1", "r"))
  if not announced() then fail("warm-up: no line") end
  warm:close()
  os.execute("rm -rf " .. WORK .. "/swarm")

  local before, before_items = census.census()
  local mem0 = memory()
  local runs, setup = {}, {}
  local t_all = core.clock.monotime()
  for i = 1, args.n do
    local t0 = core.clock.monotime()
    local p = assert(io.popen("echo $$; exec " .. shell.join(argv(i, ANNOUNCE .. "; exec sleep 3600")) ..
      " >" .. WORK .. "/s" .. i .. ".out 2>&1", "r"))
    runs[i] = { p = p, pid = tonumber(p:read("l")) }
    if announced() then
      setup[i] = (core.clock.monotime() - t0) * 1000
    else
      setup[i] = -1
      fail("sandbox " .. i .. ": no line: " .. tostring(slurp(WORK .. "/s" .. i .. ".out")))
    end
  end
  local all_ms = (core.clock.monotime() - t_all) * 1000
  local alive, alive_items = census.census()
  local mem1 = memory()
  local corral_mem, tenant_mem = processes_memory("corral"), processes_memory("sleep")

  -- Clean-up: SIGTERM to every run, as an operator stopping them would.
  local t_down = core.clock.monotime()
  for _, r in ipairs(runs) do if r.pid then core.proc.kill(r.pid, 15) end end
  local statuses = {}
  for _, r in ipairs(runs) do
    local _, how, code = r.p:close()
    local key = tostring(how) .. " " .. tostring(code)
    statuses[key] = (statuses[key] or 0) + 1
  end
  local down_ms = (core.clock.monotime() - t_down) * 1000
  os.execute("rm -rf " .. WORK .. "/s*")
  local after, after_items = census.census()
  local mem2 = memory()
  listener:close()

  local held = {}
  for _, k in ipairs(census.COUNTERS) do held[k] = #census.new_items(alive_items[k], before_items[k]) end
  local grew = census.grew(before, before_items, after, after_items)
  io.write(require("dkjson").encode({
    ok = #failures == 0 and next(grew) == nil, n = args.n, setup_ms = setup, all_ms = all_ms, down_ms = down_ms,
    statuses = statuses, counters = census.COUNTERS, before = before, alive = alive, after = after, held = held,
    grew = grew, failures = failures, memory = { before = mem0, alive = mem1, after = mem2 },
    corral = corral_mem, tenants = tenant_mem, load = slurp("/proc/loadavg") }), "\n")
end

if args.inside then
  inside()
  os.exit(0)
end

local r = census.run_private("scripts/bench/scale.lua", { "--json", tostring(args.n) })
if args.json then
  io.write(require("dkjson").encode(r), "\n")
  os.exit(r.ok and 0 or 1)
end

local n = r.n
local function median(list, from, to)
  local t = {}
  for i = from, to do t[#t + 1] = list[i] end
  table.sort(t)
  return t[(#t + 1) // 2]
end
local s = r.setup_ms
print(string.format("%d sandboxes with an allowlist alive at once, each its own `corral run` in the background, " ..
  "started one after another; load average %s", n, (r.load or ""):match("^(%S+ %S+ %S+)")))
print(string.format("set-up (corral run to its tenant's first line through the relay), ms:"))
print(string.format("  1st %.1f   %dth %.1f   ratio %.2f   (goal <= 2.0: %s)", s[1], n, s[n], s[n] / s[1],
  s[n] / s[1] <= 2 and "met" or "NOT met"))
local k = math.max(1, n // 10)
print(string.format("  median of the first %d %.1f   of the last %d %.1f   ratio %.2f", k, median(s, 1, k), k,
  median(s, n - k + 1, n), median(s, n - k + 1, n) / median(s, 1, k)))
print(string.format("  all %d up in %.1f s; all ended %.2f s after SIGTERM (exits: %s)", n, r.all_ms / 1000,
  r.down_ms / 1000, (function()
    local parts = {}
    for st, c in pairs(r.statuses) do parts[#parts + 1] = c .. "x " .. st end
    return table.concat(parts, ", ")
  end)()))
print()
local m0, m1 = r.memory.before, r.memory.alive
print("host memory per sandbox (alive, less before, / " .. n .. "):")
print(string.format("  corral process: RSS %.0f KiB, PSS %.0f KiB (%d processes)", r.corral.rss_kib / r.corral.n,
  r.corral.pss_kib / r.corral.n, r.corral.n))
local tn = math.max(1, r.tenants.n)
print(string.format("  tenant (sleep): RSS %.0f KiB, PSS %.0f KiB (%d processes)", r.tenants.rss_kib / tn,
  r.tenants.pss_kib / tn, r.tenants.n))
if m0.cgroup and m1.cgroup then
  local kernel = (m0.cgroup_kernel and m1.cgroup_kernel) and
    string.format("%.0f KiB", (m1.cgroup_kernel - m0.cgroup_kernel) / 1024 / n) or "not readable"
  print(string.format("  the run's memory cgroup: %.0f KiB, of which kernel %s", (m1.cgroup - m0.cgroup) / 1024 / n,
    kernel))
end
print(string.format("  the machine's slab (others move it too): %.0f KiB; MemAvailable fell %.0f KiB",
  (m1.slab_kib - m0.slab_kib) / n, (m0.available_kib - m1.available_kib) / n))
print()
print(string.format("%-16s %8s %8s %8s", "counter", "before", "alive", "after"))
for _, c in ipairs(r.counters) do
  print(string.format("%-16s %8d %8s %8d", c, r.before[c], "+" .. r.held[c], r.after[c]))
end
for c, list in pairs(r.grew) do print("GREW " .. c .. ": " .. table.concat(list, ", ")) end
for _, f in ipairs(r.failures) do print("FAILED " .. f) end
for _, c in ipairs(r.cgroups_left) do print("LEFT a cgroup: " .. c) end
print(r.ok and "clean-up verified: nothing after that was not there before" or "LEAK or failure: see above")
os.exit(r.ok and 0 or 1)
