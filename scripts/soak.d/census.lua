-- One census of the soak's world, printed as JSON: scripts/bench/census.lua's counters (in
-- the soak's own pid, mount and network namespaces and cgroup, so every object is the
-- soak's) and the rest issue 24 asks for: keepers, loop devices, containers (with podman),
-- what a run left in the full tmpfs given as TMPDIR, and corral's processes, their fds and
-- their largest RSS.
-- Usage: corral scripts/soak.d/census.lua TINY_DIR [containers]
local root = arg[0]:match("^(.*)/scripts/soak%.d/") or "."
package.path = root .. "/scripts/bench/?.lua;" .. package.path
local census = require "census"
local core = require "corral.core"

local tiny, with_containers = arg[1], arg[2] == "containers"

local function lines_of(cmd, pattern)
  local out = {}
  local p = io.popen(cmd .. " 2>/dev/null")
  for line in p:lines() do
    if line:match(pattern) then out[#out + 1] = line end
  end
  p:close()
  table.sort(out)
  return out
end

local c, items = census.census()
c["driver RSS KiB"], c["driver Lua KiB"] = nil, nil

local keepers, procs, fds, rss = {}, 0, 0, 0
for _, pid in ipairs(census.numeric_entries("/proc")) do
  local comm = census.slurp("/proc/" .. pid .. "/comm") or ""
  -- the front (corral exec) or the host it hands every other command to
  if (comm == "corral\n" or comm == "corral-host\n") and pid ~= tostring(core.proc.getpid()) then
    procs = procs + 1
    local cmdline = (census.slurp("/proc/" .. pid .. "/cmdline") or ""):gsub("%z", " ")
    -- a keeper titles itself `corral-keeper ID`
    if cmdline:match("^corral%-keeper ") then keepers[#keepers + 1] = pid .. " " .. cmdline end
    fds = fds + #(core.fs.listdir("/proc/" .. pid .. "/fd") or {})
    rss = math.max(rss, census.kib(census.slurp("/proc/" .. pid .. "/status"), "VmRSS"))
  end
end
c.keepers, items.keepers = #keepers, keepers
items["loop devices"] = lines_of("losetup -a", ".")
c["loop devices"] = #items["loop devices"]
if with_containers then
  items.containers = lines_of("timeout 20 podman ps -a --format '{{.ID}} {{.Names}}'", ".")
  c.containers = #items.containers
  -- corral-runtime's state of each container (the host's: the engine's state is too)
  local states = {}
  for _, n in ipairs(core.fs.listdir("/run/corral-runtime") or {}) do
    if not n:match("^%.") then states[#states + 1] = "/run/corral-runtime/" .. n end
  end
  c["runtime states"], items["runtime states"] = #states, states
end
local left = {}
for _, n in ipairs(core.fs.listdir(tiny) or {}) do
  if n ~= "fill" then left[#left + 1] = tiny .. "/" .. n end
end
c["full TMPDIR"], items["full TMPDIR"] = #left, left
-- not counters: they move with the load, shown during the run
c["corral processes"], c["corral fds"], c["corral max RSS KiB"] = procs, fds, rss

print(require("dkjson").encode({ counts = c, items = items }))
