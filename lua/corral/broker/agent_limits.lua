--- What a confined agent may use, as the kernel holds it: its resource limits
-- (/proc/PID/limits, soft values) and the limits of the cgroups it runs in (v1 or v2,
-- the smallest along the path to each hierarchy's root). The broker compares a
-- request's --memory, --pids, --cpu, --nofile, --fsize and --disk with these.
-- @module corral.broker.agent_limits
local file = require "corral.file"

local M = {}

local HUGE = math.huge

-- /proc/PID/limits rows by the soft value's name here.
local RLIMITS = { ["Max open files"] = "nofile", ["Max file size"] = "fsize", ["Max processes"] = "nproc",
                  ["Max address space"] = "as" }

local function rlimits(pid)
  local text = file.read("/proc/" .. pid .. "/limits")
  if not text then return nil end
  local out = {}
  for line in text:gmatch("[^\n]+") do
    for label, key in pairs(RLIMITS) do
      if line:sub(1, #label) == label then
        local soft = line:sub(#label + 1):match("^%s*(%S+)")
        out[key] = soft == "unlimited" and HUGE or math.tointeger(tonumber(soft))
      end
    end
  end
  return out
end

-- The mount point of each cgroup v1 controller (and "" for the v2 hierarchy).
local function cgroup_mounts()
  local text = file.read("/proc/self/mountinfo") or ""
  local mounts = {}
  for line in text:gmatch("[^\n]+") do
    local point, fstype, opts = line:match("^%S+ %S+ %S+ %S+ (%S+) .- %- (%S+) %S+ (%S+)")
    if fstype == "cgroup2" then mounts[""] = mounts[""] or point end
    if fstype == "cgroup" then
      for o in opts:gmatch("[^,]+") do mounts[o] = mounts[o] or point end
    end
  end
  return mounts
end

-- A cgroup file's value as a number, math.huge for "max" or v1's "no limit".
local function value(path)
  local text = file.read(path)
  if not text then return nil end
  text = text:match("^%s*(.-)%s*$")
  if text == "max" or text == "-1" then return HUGE end
  local n = tonumber(text:match("^(%S+)"))
  -- v1's memory limit without one is a page-rounded LONG_MAX
  if n and n >= 2 ^ 62 then return HUGE end
  return n
end

-- The smallest of `read(dir)` from the cgroup's directory up to the hierarchy's root.
local function smallest(root, path, read)
  local least = HUGE
  local dir = path
  while true do
    local v = read(root .. (dir == "/" and "" or dir))
    if v and v < least then least = v end
    if dir == "/" or dir == "" then break end
    dir = dir:match("^(.*)/[^/]*$")
    if dir == "" then dir = "/" end
  end
  return least
end

local function cpu_v1(dir)
  local quota, period = value(dir .. "/cpu.cfs_quota_us"), value(dir .. "/cpu.cfs_period_us")
  if not quota or quota == HUGE or not period or period <= 0 then return nil end
  return quota / period
end

local function cpu_v2(dir)
  local text = file.read(dir .. "/cpu.max")
  local quota, period = (text or ""):match("^(%d+)%s+(%d+)")
  if not quota then return nil end
  return tonumber(quota) / tonumber(period)
end

local function online_cpus()
  local text = file.read("/sys/devices/system/cpu/online") or ""
  local n = 0
  for range in text:gmatch("[^,%s]+") do
    local a, b = range:match("^(%d+)%-(%d+)$")
    n = n + (a and (tonumber(b) - tonumber(a) + 1) or 1)
  end
  return n > 0 and n or HUGE
end

-- memory (bytes), pids and cpu (cores) of the cgroups pid runs in; math.huge where none.
local function cgroup_limits(pid)
  local text = file.read("/proc/" .. pid .. "/cgroup") or ""
  local mounts = cgroup_mounts()
  local out = { memory = HUGE, pids = HUGE, cpu = online_cpus() }
  local function take(key, v)
    if v < out[key] then out[key] = v end
  end
  for line in text:gmatch("[^\n]+") do
    local controllers, path = line:match("^%d+:([^:]*):(.*)$")
    if controllers == "" and mounts[""] then
      local root = mounts[""]
      take("memory", smallest(root, path, function(d) return value(d .. "/memory.max") end))
      take("pids", smallest(root, path, function(d) return value(d .. "/pids.max") end))
      take("cpu", smallest(root, path, cpu_v2))
    end
    for c in (controllers or ""):gmatch("[^,]+") do
      local root = mounts[c]
      if root and c == "memory" then
        take("memory", smallest(root, path, function(d) return value(d .. "/memory.limit_in_bytes") end))
      elseif root and c == "pids" then
        take("pids", smallest(root, path, function(d) return value(d .. "/pids.max") end))
      elseif root and c == "cpu" then
        take("cpu", smallest(root, path, cpu_v1))
      end
    end
  end
  return out
end

--- The limits process `pid` runs under.
-- @tparam integer pid
-- @treturn[1] table `nofile`, `fsize`, `nproc`, `as` (soft rlimits), `memory` (bytes),
--   `pids`, `cpu` (cores: the cgroup quota, else the online CPUs); math.huge for none
-- @return[2] nil when the process is gone
function M.of(pid)
  local r = rlimits(pid)
  if not r then return nil end
  for k, v in pairs(cgroup_limits(pid)) do r[k] = v end
  return r
end

return M
