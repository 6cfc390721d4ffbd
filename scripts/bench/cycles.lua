-- Sequential create/destroy cycles of sandboxes with an allowlist, and a census of what
-- they could leave behind on the host, taken before and after (issue 14: "checked, not
-- assumed"). Run by scripts/bench/cycles (1,000 cycles) and tests/cycles_spec.lua (fewer).
--   build/corral scripts/bench/cycles.lua [--json] [N] [api|cli|both]
--
-- Each cycle is the real path with real clients: a sandbox with an allowlist and limits
-- (`--allow bench.test:PORT --pids 64 --memory 256M`, its own cgroup, netns, ruleset,
-- DNS responder and acceptor), whose tenant looks the name up (getent) and sends a line
-- through the relay to a listener this driver holds (nc), then ends. `api` drives
-- corral.provision / exec / destroy in this one process (so this process's own fds count
-- too); `cli` runs `corral run` as a user types it.
--
-- The machine is shared with other corral processes, so the census must see this run's
-- objects alone. As root the driver moves itself into a cgroup of its own beneath each
-- of its cgroups (corral makes a sandbox's cgroup beneath its caller's), and runs the
-- cycles in new pid, mount and network namespaces with /tmp and /run/corral on tmpfs of
-- their own: every process, orphan (pid 1 here inherits them), network namespace,
-- mount, nft table in the caller's netns, temporary directory and control socket the
-- census sees is this run's. Afterwards it moves back and removes its cgroups (a leaked
-- sandbox cgroup beneath them is reported, then removed).
--
-- Counted (the census):
--   processes     every process in the pid namespace but the driver
--   netns         network namespaces referenced by any process, thread or fd, or by a mount
--   nsfs mounts   namespaces bound to a file in the mount namespace
--   mounts        lines of /proc/self/mountinfo
--   cgroups       directories beneath the driver's own cgroups, in every hierarchy
--   nft tables    `nft list tables` in the caller's netns
--   driver fds    this process's open fds
--   temp dirs     /tmp/corral-*
--   registrations control sockets in corral's runtime directory (/run/corral/0)
-- Each counter is shown to see a leak: a sandbox alive (through the API, and a `corral
-- run` holding its tenant) raises every counter it holds; a mount, an nsfs mount and an
-- nft table made by the driver raise the three a sandbox never touches.
local core = require "corral.core"
local shell = require "corral.shell"

local HOST = core.proc.host_executable()
local ROOT = HOST:match("^(.*)/build/[^/]+$") or "."

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

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, text)
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  local ok, werr = f:write(text)
  f:close()
  return ok, werr
end

-- ---------------------------------------------------------------------------------------
-- Outside: a cgroup of the driver's own, the namespaces, and the result passed through.

local function own_cgroups()
  local info = core.cgroup.info()
  local seen, list = {}, {}
  for _, p in pairs(info and info.paths or {}) do
    local real = core.path.resolve(p) or p
    if not seen[real] then
      seen[real] = true
      list[#list + 1] = real
    end
  end
  table.sort(list)
  return list
end

local function rmdir_tree(dir)
  local removed = {}
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local st = core.fs.lstat(dir .. "/" .. name)
    if st and st.type == "dir" then
      for _, r in ipairs(rmdir_tree(dir .. "/" .. name)) do removed[#removed + 1] = r end
      if os.remove(dir .. "/" .. name) then removed[#removed + 1] = dir .. "/" .. name end
    end
  end
  return removed
end

local function outside()
  if core.proc.geteuid() ~= 0 then
    io.stderr:write("cycles: needs root (its own cgroup and namespaces, so the census sees this run alone)\n")
    os.exit(3)
  end
  local pid = core.proc.getpid()
  local name = "corral-cycles-" .. pid
  local made = {}
  local function leave()
    local leaked = {}
    for _, parent in ipairs(made) do
      write(parent .. "/cgroup.procs", tostring(pid))
      local dir = parent .. "/" .. name
      if not os.remove(dir) then
        for _, r in ipairs(rmdir_tree(dir)) do leaked[#leaked + 1] = r end
        os.remove(dir)
      end
    end
    return leaked
  end
  for _, parent in ipairs(own_cgroups()) do
    local dir = parent .. "/" .. name
    local ok, err = core.fs.mkdir(dir, tonumber("755", 8))
    if not ok then
      leave()
      io.stderr:write("cycles: " .. tostring(err) .. "\n")
      os.exit(1)
    end
    made[#made + 1] = parent
    local wok, werr = write(dir .. "/cgroup.procs", tostring(pid))
    if not wok then
      leave()
      io.stderr:write("cycles: moving into " .. dir .. ": " .. tostring(werr) .. "\n")
      os.exit(1)
    end
  end
  os.execute("mkdir -p /run/corral")
  local inner = { "unshare", "--pid", "--fork", "--mount-proc", "--net", "--propagation", "private",
    "sh", "-c", "ip link set lo up && mount -t tmpfs -o mode=1777 corral-cycles-tmp /tmp && " ..
    "mount -t tmpfs -o mode=0755 corral-cycles-run /run/corral && exec \"$@\"", "sh",
    HOST, ROOT .. "/scripts/bench/cycles.lua", "--inside", "--json", tostring(args.n), args.mode }
  local p = assert(io.popen(shell.join(inner), "r"))
  local out = p:read("a")
  local ok, how, code = p:close()
  local leaked = leave()
  local json = require "dkjson"
  local result = json.decode(out)
  if not result then
    io.stderr:write("cycles: the run inside its namespaces failed (" .. tostring(how) .. " " .. tostring(code) ..
      "):\n" .. out .. "\n")
    os.exit(1)
  end
  result.cgroups_left = leaked
  result.ok = ok and result.ok and #leaked == 0
  return result
end

-- ---------------------------------------------------------------------------------------
-- Inside: the census and the cycles.

local function numeric_entries(dir)
  local out = {}
  for _, n in ipairs(core.fs.listdir(dir) or {}) do
    if n:match("^%d+$") then out[#out + 1] = n end
  end
  return out
end

local function count_table(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

local function mountinfo()
  local lines, nsfs = {}, {}
  for line in (slurp("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
    lines[#lines + 1] = line
    local root, fstype = line:match("^%S+ %S+ %S+ (%S+) .- %- (%S+)")
    if fstype == "nsfs" then nsfs[#nsfs + 1] = root end
  end
  return lines, nsfs
end

local function cgroup_dirs(list, dir, depth)
  if depth > 8 then return end
  for _, n in ipairs(core.fs.listdir(dir) or {}) do
    local p = dir .. "/" .. n
    local st = core.fs.lstat(p)
    if st and st.type == "dir" then
      list[#list + 1] = p
      cgroup_dirs(list, p, depth + 1)
    end
  end
end

local function rss_kib()
  return tonumber((slurp("/proc/self/status") or ""):match("VmRSS:%s+(%d+)")) or 0
end

--- What could be left behind, counted; `items` keeps what each count is of.
local function census()
  collectgarbage()
  local me = tostring(core.proc.getpid())
  local c, items = {}, {}
  -- processes first: the census itself spawns `nft` last
  local procs = {}
  for _, pid in ipairs(numeric_entries("/proc")) do
    if pid ~= me then
      local comm = (slurp("/proc/" .. pid .. "/comm") or "?"):gsub("\n", "")
      procs[#procs + 1] = pid .. ":" .. comm
    end
  end
  c.processes, items.processes = #procs, procs
  local fds = core.fs.listdir("/proc/self/fd") or {}
  local fd_links = {}
  for _, fd in ipairs(fds) do
    local link = core.fs.readlink("/proc/self/fd/" .. fd)
    -- less the listing's own
    if link and not link:match("^/proc/%d+/fd$") then fd_links[#fd_links + 1] = fd .. " " .. link end
  end
  c["driver fds"], items["driver fds"] = #fd_links, fd_links
  local netns = {}
  local function note(link, where)
    if link and link:match("^net:%[") then netns[link] = netns[link] or where end
  end
  for _, pid in ipairs(numeric_entries("/proc")) do
    for _, tid in ipairs(numeric_entries("/proc/" .. pid .. "/task")) do
      note(core.fs.readlink("/proc/" .. pid .. "/task/" .. tid .. "/ns/net"), "task " .. tid)
    end
    for _, fd in ipairs(numeric_entries("/proc/" .. pid .. "/fd")) do
      note(core.fs.readlink("/proc/" .. pid .. "/fd/" .. fd), "fd " .. pid .. "/" .. fd)
    end
  end
  local mounts, nsfs = mountinfo()
  for _, root in ipairs(nsfs) do note(root, "nsfs mount") end
  items.netns = {}
  for link, where in pairs(netns) do items.netns[#items.netns + 1] = link .. " (" .. where .. ")" end
  c.netns = count_table(netns)
  c["nsfs mounts"], items["nsfs mounts"] = #nsfs, nsfs
  c.mounts, items.mounts = #mounts, mounts
  local cg = {}
  for _, own in ipairs(own_cgroups()) do cgroup_dirs(cg, own, 0) end
  c.cgroups, items.cgroups = #cg, cg
  local tmp = {}
  for _, n in ipairs(core.fs.listdir("/tmp") or {}) do
    if n:match("^corral%-") then tmp[#tmp + 1] = "/tmp/" .. n end
  end
  c["temp dirs"], items["temp dirs"] = #tmp, tmp
  local socks = {}
  local rdir = "/run/corral/" .. core.proc.geteuid()
  for _, n in ipairs(core.fs.listdir(rdir) or {}) do
    if n:match("%.sock$") then socks[#socks + 1] = rdir .. "/" .. n end
  end
  c.registrations, items.registrations = #socks, socks
  local tables = {}
  local p = io.popen("nft list tables 2>&1")
  for line in p:lines() do if line:match("^table ") then tables[#tables + 1] = line end end
  p:close()
  c["nft tables"], items["nft tables"] = #tables, tables
  c["driver RSS KiB"] = rss_kib()
  c["driver Lua KiB"] = math.floor(collectgarbage("count"))
  for _, list in pairs(items) do table.sort(list) end
  return c, items
end

local COUNTERS = { "processes", "netns", "nsfs mounts", "mounts", "cgroups", "nft tables", "driver fds",
  "temp dirs", "registrations" }

-- What is in `now` and in none of the `earlier` lists.
local function new_items(now, ...)
  local seen, out = {}, {}
  for _, list in ipairs({ ... }) do for _, v in ipairs(list) do seen[v] = true end end
  for _, v in ipairs(now) do if not seen[v] then out[#out + 1] = v end end
  return out
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

  local before, before_items = census()
  local t0 = core.clock.monotime()
  local seconds = {}
  for _, m in ipairs(modes) do
    local s = core.clock.monotime()
    for i = 1, args.n do m.cycle(i) end
    seconds[m.name] = core.clock.monotime() - s
  end
  local elapsed = core.clock.monotime() - t0
  local after, after_items = census()
  -- A leak is an object that was not there before. Counts alone would not do: an object
  -- can also go while the cycles run (a mount whose mount point another process removed
  -- on the host is detached here too), and hide one that came.
  local grew, gone = {}, {}
  for _, k in ipairs(COUNTERS) do
    local n = new_items(after_items[k], before_items[k])
    if #n > 0 or after[k] > before[k] then grew[k] = n end
    local g = new_items(before_items[k], after_items[k])
    if #g > 0 then gone[k] = g end
  end

  -- Controls: each counter sees an object while it exists.
  local alive_items = {}
  if args.mode ~= "cli" then
    local sb = api_sandbox("control")
    assert(corral.provision("native", sb))
    alive_items.api = select(2, census())
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
    alive_items.cli = select(2, census())
    p:write("end\n")
    p:close()
    os.execute("rm -rf " .. WORK .. "/control")
  end
  local mnt, nsfile = WORK .. "/mnt", WORK .. "/netns"
  os.execute("mkdir -p " .. mnt .. " && mount -t tmpfs corral-cycles-control " .. mnt ..
    " && touch " .. nsfile .. " && mount --bind /proc/self/ns/net " .. nsfile ..
    " && nft add table inet corral_cycles_control")
  alive_items.made = select(2, census())
  os.execute("umount " .. mnt .. "; umount " .. nsfile .. "; nft delete table inet corral_cycles_control")
  local final, final_items = census()
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

local r = outside()
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
print(r.ok and "no growth: every counter is back where it was" or "LEAK or failure: see above")
os.exit(r.ok and 0 or 1)
