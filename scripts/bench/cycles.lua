-- Sequential create/destroy cycles of sandboxes with an allowlist, and a census of what
-- they could leave behind on the host, taken before and after (issue 14: "checked, not
-- assumed"). Run by scripts/bench/cycles (1,000 cycles) and tests/cycles_spec.lua (fewer).
--   build/corral scripts/bench/cycles.lua [--json] [N] [api|cli|both]
--
-- Each cycle is the real path with real clients: a sandbox with an allowlist and limits
-- (`--allow bench.test:5201 --pids 64 --memory 256M`: its own cgroup, netns, ruleset,
-- DNS responder and acceptor), whose tenant looks the name up (getent) and sends a line
-- through the relay to a server the driver started (nc to socat), then ends. `api`
-- drives corral.provision / exec / destroy in this one process (so the driver's own fds
-- count too); `cli` runs `corral run` as a user types it.
--
-- The census and the private world it is taken in (a cgroup and pid, mount and network
-- namespaces of the run's own, /tmp and /run/corral on tmpfs) are scripts/bench/census.lua's.
-- Each counter is shown to see a leak: a sandbox alive (through the API, and a `corral
-- run` holding its tenant) raises every counter it holds; a mount, an nsfs mount and an
-- nft table made by the driver raise the three a sandbox never touches.
local core = require "corral.core"
local shell = require "corral.shell"
package.path = (core.proc.host_executable():match("^(.*)/build/[^/]+$") or ".") .. "/scripts/bench/?.lua;" ..
  package.path
local census = require "census"

local HOST = census.HOST
local slurp, COUNTERS = census.slurp, census.COUNTERS
local new_items = census.new_items

local args = { n = 1000, mode = "both" }
local rest = {}
for _, a in ipairs(arg) do
  if a == "--json" then args.json = true
  elseif a == "--inside" then args.inside = true
  elseif a:match("^%d+$") then args.n = tonumber(a)
  elseif a == "api" or a == "cli" or a == "both" then args.mode = a
  else rest[#rest + 1] = a end
end
if #rest > 0 then
  io.stderr:write("usage: corral scripts/bench/cycles.lua [--json] [N] [api|cli|both]\n")
  os.exit(2)
end

local WORK = "/tmp/cycles-work"

local function inside()
  local corral = require "corral"
  os.execute("mkdir -p " .. WORK .. " && chmod 0711 " .. WORK)
  -- The server: socat, a child of this driver for the whole run, appending what each
  -- connection sends to a file and closing it at the client's EOF.
  local port, received_file = 5201, WORK .. "/received"
  local server = assert(io.popen("echo $$; exec socat -u TCP-LISTEN:" .. port ..
    ",bind=127.0.0.1,fork,reuseaddr OPEN:" .. received_file .. ",creat,append", "r"))
  local server_pid = tonumber(server:read("l"))
  for _ = 1, 250 do
    local c = core.sock.connect("127.0.0.1", port, 1)
    if c then c:close() break end
    os.execute("sleep 0.02")
  end
  local allow = "bench.test:" .. port
  local TENANT = { "sh", "-c", "getent hosts bench.test >/dev/null && echo cycle | nc -N -w 5 bench.test " .. port }
  local failures = {}
  local function received()
    local n = 0
    for _ in (slurp(received_file) or ""):gmatch("cycle\n") do n = n + 1 end
    return n
  end
  local function fail(what)
    if #failures < 10 then failures[#failures + 1] = what end
  end

  local function api_sandbox(id)
    return assert(corral.sandbox({ id = id, storage_root = WORK,
      limits = { pids = 64, memory = "256M" },
      network = { allow = { allow }, internal = { "127.0.0.0/8" }, resolve = { ["bench.test"] = "127.0.0.1" } } }))
  end

  local function api_cycle(i)
    local sb = api_sandbox("cycle")
    local ok, err = corral.provision("native", sb)
    if not ok then return fail("api " .. i .. " provision: " .. tostring(err)) end
    local r, xerr = corral.exec("native", sb, TENANT, { output = WORK .. "/api.out" })
    if not r or r.code ~= 0 then fail("api " .. i .. " exec: " .. tostring(r and r.code or xerr) .. " " ..
      tostring(slurp(WORK .. "/api.out"))) end
    local dok, derr = corral.destroy("native", sb)
    if not dok then fail("api " .. i .. " destroy: " .. tostring(derr)) end
  end

  local RUN = { HOST, "run", "--allow", allow, "--internal", "127.0.0.0/8", "--resolve", "bench.test=127.0.0.1",
    "--pids", "64", "--memory", "256M", "--" }
  local function cli_argv(tenant)
    local argv = {}
    for _, a in ipairs(RUN) do argv[#argv + 1] = a end
    for _, a in ipairs(tenant) do argv[#argv + 1] = a end
    return argv
  end
  local CLI = shell.join(cli_argv(TENANT)) .. " >" .. WORK .. "/cli.out 2>&1"

  local function cli_cycle(i)
    local ok, _, code = os.execute(CLI)
    if not ok then fail("cli " .. i .. ": exit " .. tostring(code) .. " " .. tostring(slurp(WORK .. "/cli.out"))) end
  end

  local modes = {}
  if args.mode ~= "cli" then modes[#modes + 1] = { name = "api", cycle = api_cycle } end
  if args.mode ~= "api" then modes[#modes + 1] = { name = "cli", cycle = cli_cycle } end

  -- Warm-up: the probe cache, this process's modules, the egress loop's own fds.
  os.execute(shell.join({ HOST, "probe" }) .. " >/dev/null 2>&1")
  for _, m in ipairs(modes) do m.cycle(0) end
  local received_before = received()

  local before, before_items = census.census()
  local t0 = core.clock.monotime()
  local seconds = {}
  for _, m in ipairs(modes) do
    local s = core.clock.monotime()
    for i = 1, args.n do m.cycle(i) end
    seconds[m.name] = core.clock.monotime() - s
  end
  local elapsed = core.clock.monotime() - t0
  local after, after_items = census.census()
  -- a leak is an object that was not there before (census.lua says why not counts alone)
  local grew, gone = census.grew(before, before_items, after, after_items), {}
  for _, k in ipairs(COUNTERS) do
    local g = new_items(before_items[k], after_items[k])
    if #g > 0 then gone[k] = g end
  end

  -- Controls: each counter sees an object while it exists.
  local alive_items = {}
  if args.mode ~= "cli" then
    local sb = api_sandbox("control")
    assert(corral.provision("native", sb))
    alive_items.api = select(2, census.census())
    assert(corral.destroy("native", sb))
  end
  if args.mode ~= "api" then
    os.execute("rm -rf " .. WORK .. "/control")
    local argv = cli_argv({ "sh", "-c", "touch /storage/up; read line" })
    table.insert(argv, 2 + 1, "--storage") -- after "run"
    table.insert(argv, 3 + 1, WORK .. "/control")
    local p = assert(io.popen(shell.join(argv) .. " >" .. WORK .. "/control.out 2>&1", "w"))
    local deadline = core.clock.monotime() + 30
    while not core.fs.lstat(WORK .. "/control/up") and core.clock.monotime() < deadline do
      os.execute("sleep 0.02")
    end
    alive_items.cli = select(2, census.census())
    p:write("end\n")
    p:close()
    os.execute("rm -rf " .. WORK .. "/control")
  end
  local mnt, nsfile = WORK .. "/mnt", WORK .. "/netns"
  os.execute("mkdir -p " .. mnt .. " && mount -t tmpfs corral-cycles-control " .. mnt ..
    " && touch " .. nsfile .. " && mount --bind /proc/self/ns/net " .. nsfile ..
    " && nft add table inet corral_cycles_control")
  alive_items.made = select(2, census.census())
  os.execute("umount " .. mnt .. "; umount " .. nsfile .. "; nft delete table inet corral_cycles_control")
  local final, final_items = census.census()
  -- what each control's object added (there while it existed, neither before nor after)
  -- and what the controls left
  local seen, left = {}, {}
  for control, items in pairs(alive_items) do
    seen[control] = {}
    for _, k in ipairs(COUNTERS) do
      seen[control][k] = #new_items(items[k], before_items[k], final_items[k])
    end
  end
  for _, k in ipairs(COUNTERS) do
    local n = new_items(final_items[k], before_items[k])
    if #n > 0 then left[k] = n end
  end

  core.proc.kill(server_pid, 15)
  server:close()
  local lines = received() - received_before
  local ok = #failures == 0 and lines == args.n * #modes and next(grew) == nil and next(left) == nil
  local json = require "dkjson"
  io.write(json.encode({ ok = ok, n = args.n, modes = args.mode, counters = COUNTERS, before = before,
    after = after, final = final, seen = seen, left = left, grew = grew, gone = gone, failures = failures,
    received = lines, expected = args.n * #modes, seconds = seconds, elapsed = elapsed,
    load = slurp("/proc/loadavg") }), "\n")
end

if args.inside then
  inside()
  os.exit(0)
end

local r = census.run_private("scripts/bench/cycles.lua", { "--json", tostring(args.n), args.mode })
if args.json then
  io.write(require("dkjson").encode(r), "\n")
  os.exit(r.ok and 0 or 1)
end

print(string.format("%d create/destroy cycles of a sandbox with an allowlist and limits, per variant (%s); " ..
  "load average %s", r.n, r.modes == "both" and "api and cli" or r.modes, (r.load or ""):match("^(%S+ %S+ %S+)")))
for _, name in ipairs({ "api", "cli" }) do
  local s = r.seconds[name]
  if s then print(string.format("  %s: %.1f s, %.1f ms a cycle", name, s, s * 1000 / r.n)) end
end
print(string.format("  tenants' lines received through the relay: %d of %d", r.received, r.expected))
print()
local cols = { "before", "after", "api alive", "cli alive", "made" }
print("(\"alive\" and \"made\": the objects each counter saw only while a control's object existed)")
print(string.format("%-16s %8s %8s %10s %10s %8s", "counter", table.unpack(cols)))
local function cell(t, k) return t and t[k] and tostring(t[k]) or "-" end
local function plus(t, k) return t and t[k] and "+" .. t[k] or "-" end
for _, k in ipairs(r.counters) do
  print(string.format("%-16s %8s %8s %10s %10s %8s", k, cell(r.before, k), cell(r.after, k),
    plus(r.seen.api, k), plus(r.seen.cli, k), plus(r.seen.made, k)))
end
for _, k in ipairs({ "driver RSS KiB", "driver Lua KiB" }) do
  print(string.format("%-16s %8s %8s   (not a counter: the allocator keeps what it freed)", k, cell(r.before, k),
    cell(r.after, k)))
end
print()
for k, list in pairs(r.grew) do
  print("GREW " .. k .. ": " .. table.concat(list, ", "))
end
for k, list in pairs(r.left) do
  print("LEFT by a control " .. k .. ": " .. table.concat(list, ", "))
end
for k, list in pairs(r.gone) do
  print(string.format("(gone meanwhile, not this run's: %d %s)", #list, k))
end
for _, f in ipairs(r.failures) do print("FAILED " .. f) end
for _, c in ipairs(r.cgroups_left) do print("LEFT a cgroup: " .. c) end
print(r.ok and "no growth: nothing was there after that was not there before" or "LEAK or failure: see above")
os.exit(r.ok and 0 or 1)
