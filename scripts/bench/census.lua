-- A census of what sandboxes can leave behind on the host, taken in a world of the
-- bench's own so that it counts one run alone on a machine other processes share.
-- Used by scripts/bench/cycles.lua and scripts/bench/scale.lua (and through them by
-- tests/cycles_spec.lua).
--
-- `run_private(script, args)` (root) moves the driver into a cgroup of its own beneath
-- each of its cgroups (corral makes a sandbox's cgroup beneath its caller's), runs
-- `corral script --inside args…` in new pid, mount and network namespaces with /tmp,
-- /dev/shm and /run/corral on tmpfs of their own, and returns the JSON it printed: every process,
-- orphan (pid 1 there inherits them), network namespace, mount, nft table in the
-- caller's netns, temporary directory and control socket the census sees is that run's.
-- Afterwards it moves back and removes its cgroups; a sandbox cgroup left beneath them
-- is reported (`cgroups_left`), then removed.
--
-- Counted by `census()`:
--   processes     every process in the pid namespace but the driver
--   netns         network namespaces referenced by any process, thread or fd, or by a mount
--   nsfs mounts   namespaces bound to a file in the mount namespace
--   mounts        lines of /proc/self/mountinfo
--   cgroups       directories beneath the driver's own cgroups, in every hierarchy
--   nft tables    `nft list tables` in the caller's netns
--   driver fds    the driver's own open fds
--   temp dirs     /tmp/corral-* and /dev/shm/corral-*
--   registrations control sockets in corral's runtime directory (/run/corral/UID)
-- Each comes with the list of what it counted, so a leak is an object that was not there
-- before (`new_items`): counts alone would not do, as an object can also go meanwhile (a
-- mount whose mount point another process removed on the host is detached here too).
local core = require "corral.core"
local shell = require "corral.shell"

local M = {}

M.HOST = core.proc.host_executable()
M.ROOT = M.HOST:match("^(.*)/build/") or "." -- build/corral, or build/asan/corral

M.COUNTERS = { "processes", "netns", "nsfs mounts", "mounts", "cgroups", "nft tables", "driver fds",
  "temp dirs", "registrations" }

function M.slurp(path)
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

--- The driver's own cgroups, one path per hierarchy.
function M.own_cgroups()
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

--- Runs `corral script --inside args…` in the bench's own cgroup and namespaces.
-- @treturn table what it printed as JSON, with `cgroups_left`; exits on failure
function M.run_private(script, args)
  local function die(status, why)
    io.stderr:write(script:match("[^/]+$") .. ": " .. why .. "\n")
    os.exit(status)
  end
  if core.proc.geteuid() ~= 0 then die(3, "needs root (a cgroup and namespaces of its own, to count one run alone)") end
  local pid = core.proc.getpid()
  local name = "corral-bench-" .. pid
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
  for _, parent in ipairs(M.own_cgroups()) do
    local dir = parent .. "/" .. name
    local ok, err = core.fs.mkdir(dir, tonumber("755", 8))
    if not ok then
      leave()
      die(1, tostring(err))
    end
    made[#made + 1] = parent
    local wok, werr = write(dir .. "/cgroup.procs", tostring(pid))
    if not wok then
      leave()
      die(1, "moving into " .. dir .. ": " .. tostring(werr))
    end
  end
  os.execute("mkdir -p /run/corral")
  -- The host and its tree, held open before the tmpfs mounts and bound back over their
  -- own paths when those lie under /tmp or /run/corral (a checkout in /tmp), so the
  -- private /tmp hides the host's scratch files, not corral itself.
  local inner = { "unshare", "--pid", "--fork", "--mount-proc", "--net", "--propagation", "private",
    "sh", "-c", "exec 9<\"$1\" && ip link set lo up && " ..
    "mount -t tmpfs -o mode=1777 corral-bench-tmp /tmp && " ..
    "mount -t tmpfs -o mode=0755 corral-bench-run /run/corral && " ..
    "mount -t tmpfs -o mode=1777 corral-bench-shm /dev/shm && " ..
    "case \"$1\" in /tmp/*|/run/corral/*) " ..
    "mkdir -p \"$1\" && mount --no-canonicalize --bind /proc/self/fd/9 \"$1\";; esac && " ..
    "shift && exec \"$@\" 9<&-", "sh", M.ROOT,
    M.HOST, M.ROOT .. "/" .. script, "--inside" }
  for _, a in ipairs(args) do inner[#inner + 1] = a end
  local p = assert(io.popen(shell.join(inner), "r"))
  local out = p:read("a")
  local ok, how, code = p:close()
  local leaked = leave()
  local result = require("dkjson").decode(out)
  if type(result) ~= "table" then
    die(1, "the run inside its namespaces failed (" .. tostring(how) .. " " .. tostring(code) .. "):\n" .. out)
  end
  result.cgroups_left = leaked
  result.ok = ok and result.ok and #leaked == 0
  return result
end

local function numeric_entries(dir)
  local out = {}
  for _, n in ipairs(core.fs.listdir(dir) or {}) do
    if n:match("^%d+$") then out[#out + 1] = n end
  end
  return out
end
M.numeric_entries = numeric_entries

local function mountinfo()
  local lines, nsfs = {}, {}
  for line in (M.slurp("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
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

--- A field of /proc/PID/status or /proc/meminfo-like text, in KiB.
function M.kib(text, field)
  return tonumber((text or ""):match(field .. ":%s+(%d+)")) or 0
end

--- What could be left behind, counted.
-- @treturn table counter → count (and `driver RSS KiB`, `driver Lua KiB`, not counters)
-- @treturn table counter → sorted list of what was counted
function M.census()
  collectgarbage()
  local me = tostring(core.proc.getpid())
  local c, items = {}, {}
  -- processes first: the census itself spawns `nft` last
  local procs = {}
  for _, pid in ipairs(numeric_entries("/proc")) do
    if pid ~= me then
      local comm = (M.slurp("/proc/" .. pid .. "/comm") or "?"):gsub("\n", "")
      procs[#procs + 1] = pid .. ":" .. comm
    end
  end
  c.processes, items.processes = #procs, procs
  local fd_links = {}
  for _, fd in ipairs(core.fs.listdir("/proc/self/fd") or {}) do
    local link = core.fs.readlink("/proc/self/fd/" .. fd)
    -- less the listing's own
    if link and not link:match("^/proc/%d+/fd$") then fd_links[#fd_links + 1] = fd .. " " .. link end
  end
  c["driver fds"], items["driver fds"] = #fd_links, fd_links
  local netns, n_netns = {}, 0
  local function note(link, where)
    if link and link:match("^net:%[") and not netns[link] then
      netns[link] = where
      n_netns = n_netns + 1
    end
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
  c.netns = n_netns
  c["nsfs mounts"], items["nsfs mounts"] = #nsfs, nsfs
  c.mounts, items.mounts = #mounts, mounts
  local cg = {}
  for _, own in ipairs(M.own_cgroups()) do cgroup_dirs(cg, own, 0) end
  c.cgroups, items.cgroups = #cg, cg
  local tmp = {}
  -- a run's name files are made on /dev/shm (corral.name_files), its storage on /tmp
  for _, dir in ipairs({ "/tmp", "/dev/shm" }) do
    for _, n in ipairs(core.fs.listdir(dir) or {}) do
      if n:match("^corral%-") then tmp[#tmp + 1] = dir .. "/" .. n end
    end
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
  c["driver RSS KiB"] = M.kib(M.slurp("/proc/self/status"), "VmRSS")
  c["driver Lua KiB"] = math.floor(collectgarbage("count"))
  for _, list in pairs(items) do table.sort(list) end
  return c, items
end

--- What is in `now` and in none of the `earlier` lists.
function M.new_items(now, ...)
  local seen, out = {}, {}
  for _, list in ipairs({ ... }) do for _, v in ipairs(list) do seen[v] = true end end
  for _, v in ipairs(now) do if not seen[v] then out[#out + 1] = v end end
  return out
end

--- Counters with an object in `after` that is not in `before` (or a higher count).
-- @treturn table counter → list of the new objects
function M.grew(before, before_items, after, after_items)
  local grew = {}
  for _, k in ipairs(M.COUNTERS) do
    local n = M.new_items(after_items[k], before_items[k])
    if #n > 0 or after[k] > before[k] then grew[k] = n end
  end
  return grew
end

return M
