--- A process and everything beneath it, as /proc shows them: the one walk of /proc for
-- the tree a watched run kills (corral.mechanism.watch), the command bwrap hands a
-- signal to, an oci exec's processes and a dead corral's engine clients
-- (corral.mechanism.oci.run, corral.mechanism.oci.marks), and the usage the REPL
-- reports for a run that has no cgroup to read it from (corral.control).
-- @module corral.proctree
local core = require "corral.core"
local file = require "corral.file"

local M = {}

-- The text of /proc/PID/NAME, or nil once the process is gone.
local function proc_file(pid, name)
  return (file.read("/proc/" .. pid .. "/" .. name))
end

-- /proc/PID/stat's fields after the command name (which may hold spaces and parens).
local function stat_fields(pid)
  local s = proc_file(pid, "stat")
  local rest = s and s:match("%) (.*)$")
  if not rest then return nil end
  local out = {}
  for w in rest:gmatch("%S+") do out[#out + 1] = w end
  return out -- out[1] is the state (field 3), out[2] the ppid (field 4), …
end

--- Every live process's pid, as /proc lists them now.
-- @treturn {integer,...}
function M.pids()
  local out = {}
  for _, name in ipairs(core.fs.listdir("/proc") or {}) do
    if name:match("^%d+$") then out[#out + 1] = tonumber(name) end
  end
  return out
end

--- The parent of process `pid`, or nil once it is gone.
-- @tparam integer pid
-- @treturn integer|nil
function M.parent(pid)
  local st = stat_fields(pid)
  return st and tonumber(st[2])
end

--- Process `pid`'s pid namespace (`pid:[INODE]`), or nil once it is gone.
-- @tparam integer pid
-- @treturn string|nil
function M.pid_ns(pid) return core.fs.readlink("/proc/" .. pid .. "/ns/pid") end

--- Process `pid`'s command name (/proc/PID/comm, its newline dropped), or nil.
-- @tparam integer pid
-- @treturn string|nil
function M.comm(pid)
  local c = proc_file(pid, "comm")
  return c and (c:gsub("\n$", ""))
end

--- Process `pid`'s argv (/proc/PID/cmdline's words), empty once it is gone.
-- @tparam integer pid
-- @treturn {string,...}
function M.argv(pid)
  local out = {}
  for word in (proc_file(pid, "cmdline") or ""):gmatch("[^%z]+") do out[#out + 1] = word end
  return out
end

--- The live processes `keep(pid)` accepts (every one without it), each with its parent:
-- `{[pid] = ppid}`.
-- @tparam[opt] function keep
-- @treturn table
function M.parents(keep)
  local parent = {}
  for _, pid in ipairs(M.pids()) do
    if not keep or keep(pid) then parent[pid] = M.parent(pid) end
  end
  return parent
end

--- The processes `roots` and everything beneath them in `parent` (as `parents` returns
-- it), parents before their children; the roots themselves only with `with_roots`.
-- @tparam table parent `{[pid] = ppid}`
-- @tparam {integer,...} roots
-- @tparam[opt] boolean with_roots
-- @treturn {integer,...}
function M.beneath(parent, roots, with_roots)
  local children = {}
  for pid, pp in pairs(parent) do
    children[pp] = children[pp] or {}
    table.insert(children[pp], pid)
  end
  -- siblings in pid order, as /proc lists them
  for _, list in pairs(children) do table.sort(list) end
  local out, queue, seen = {}, {}, {}
  for _, r in ipairs(roots) do
    seen[r] = true
    queue[#queue + 1] = r
    if with_roots then out[#out + 1] = r end
  end
  while #queue > 0 do
    for _, c in ipairs(children[table.remove(queue, 1)] or {}) do
      if not seen[c] then
        seen[c] = true
        out[#out + 1] = c
        queue[#queue + 1] = c
      end
    end
  end
  return out
end

--- Every process beneath `pid` (its descendants, found from each /proc/*/stat's ppid),
-- `pid` itself excluded, parents before their children.
-- @tparam integer pid
-- @treturn {integer,...}
function M.descendants(pid)
  return M.beneath(M.parents(), { pid })
end

--- Every process beneath `pid`, found from the kernel's own lists of each task's
-- children (/proc/PID/task/TID/children): the cost of the tree, not of a walk of every
-- /proc/*/stat (a keeper answering `info` for `corral ls` over 100 sandboxes).
-- @tparam integer pid
-- @treturn {integer,...} parents before their children, `pid` excluded
function M.subtree(pid)
  local parent, queue, i = {}, { pid }, 1
  while queue[i] do
    local p = queue[i]
    i = i + 1
    for _, tid in ipairs(core.fs.listdir("/proc/" .. p .. "/task") or {}) do
      for c in (proc_file(p, "task/" .. tid .. "/children") or ""):gmatch("%d+") do
        c = tonumber(c)
        if c ~= pid and not parent[c] then parent[c], queue[#queue + 1] = p, c end
      end
    end
  end
  return M.beneath(parent, { pid })
end

-- /proc reports CPU time in USER_HZ ticks, 100 a second on every Linux architecture
-- corral builds for (the kernel's ABI value, whatever its own HZ).
local USER_HZ = 100

local function rss_bytes(pid)
  local s = proc_file(pid, "status")
  local kb = s and s:match("\nVmRSS:%s*(%d+) kB")
  return kb and tonumber(kb) * 1024
end

--- What the processes `pids` and everything beneath them use now, from /proc: how many
-- there are, their resident memory summed (shared pages counted in each), and their
-- CPU time with that of the children they have reaped.
-- @tparam {integer,...} pids
-- @treturn table `{pids =, memory_rss =, cpu_usec =, from = "/proc"}`
function M.usage(pids)
  local all, seen = {}, {}
  for _, p in ipairs(pids or {}) do
    for _, q in ipairs({ p, table.unpack(M.subtree(p)) }) do
      if not seen[q] then
        seen[q] = true
        all[#all + 1] = q
      end
    end
  end
  local u = { pids = 0, memory_rss = 0, cpu_usec = 0, from = "/proc" }
  for _, pid in ipairs(all) do
    local st = stat_fields(pid)
    if st then
      u.pids = u.pids + 1
      u.memory_rss = u.memory_rss + (rss_bytes(pid) or 0)
      -- fields 14-17: utime, stime, cutime, cstime
      local ticks = 0
      for i = 12, 15 do ticks = ticks + (tonumber(st[i]) or 0) end
      u.cpu_usec = u.cpu_usec + ticks * (1000000 // USER_HZ)
    end
  end
  return u
end

--- `usage` without the CPU time: how many processes and their resident memory (what
-- `corral ls` shows of 100 sandboxes at once). One walk that reads each process's
-- status once: its VmRSS, and its Threads, so that a process of one thread has its one
-- children list read without listing its tasks.
-- @tparam {integer,...} pids
-- @treturn table `{pids =, memory_rss =, from = "/proc"}`
function M.footprint(pids)
  local u = { pids = 0, memory_rss = 0, from = "/proc" }
  local queue, seen, i = {}, {}, 1
  local function add(pid)
    if not seen[pid] then seen[pid], queue[#queue + 1] = true, pid end
  end
  for _, p in ipairs(pids or {}) do add(p) end
  while queue[i] do
    local pid = queue[i]
    i = i + 1
    local status = proc_file(pid, "status")
    if status then
      u.pids = u.pids + 1
      u.memory_rss = u.memory_rss + (tonumber(status:match("\nVmRSS:%s*(%d+) kB")) or 0) * 1024
      local tids = status:match("\nThreads:%s*1\n") and { pid } or core.fs.listdir("/proc/" .. pid .. "/task") or {}
      for _, tid in ipairs(tids) do
        for c in (proc_file(pid, "task/" .. tid .. "/children") or ""):gmatch("%d+") do add(tonumber(c)) end
      end
    end
  end
  return u
end

--- Whether every process beneath `pid` ignores signal `sig` (SIG_IGN, /proc's SigIgn),
-- so that forwarding it does nothing at all: false when there is none, or when any
-- of them would take it (its default action, or a handler). bubblewrap's own processes
-- (its init forwards signals) are not the tenant's and are not asked.
-- @tparam integer pid
-- @tparam integer sig
-- @treturn boolean
function M.all_ignore(pid, sig)
  local asked = 0
  for _, p in ipairs(M.descendants(pid)) do
    local status = proc_file(p, "status")
    if status and M.comm(p) ~= "bwrap" then
      local mask = tonumber(status:match("\nSigIgn:%s*(%x+)") or "0", 16) or 0
      if mask & (1 << (sig - 1)) == 0 then return false end
      asked = asked + 1
    end
  end
  return asked > 0
end

return M
