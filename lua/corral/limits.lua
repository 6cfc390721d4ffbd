--- Resource limits shared by the mechanisms that apply them through corral's cgroups.
--
-- One place builds a sandbox's cgroup beneath the host's own (docs/architecture.md,
-- invariant 7) and one reads back what ended a run, so every mechanism reports a
-- memory kill alike.
-- @module corral.limits
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

--- Whether the sandbox asks for limits a cgroup enforces (memory, pids, cpu).
-- @tparam table sb
-- @treturn boolean
function M.wants_cgroup(sb)
  local l = sb.limits or {}
  return l.memory ~= nil or l.pids ~= nil or l.cpu ~= nil
end

--- The sandbox's cgroup, or nil when it asks for none.
-- @tparam table sb
-- @treturn userdata|nil the cgroup, or nil and cannot_enforce("resource_limits", …)
function M.cgroup(sb)
  if not M.wants_cgroup(sb) then return nil end
  local l = sb.limits
  local cg, err, errno = core.cgroup.create({
    memory = l.memory, pids = l.pids,
    cpu_quota_us = l.cpu and math.floor(l.cpu * 100000) or nil,
    cpu_period_us = l.cpu and 100000 or nil,
  })
  if not cg then return nil, errors.cannot_enforce("resource_limits", err, errno) end
  return cg
end

--- Adds the cgroup's usage to a run's result, `oom_kills` when the OOM killer fired
-- during it, and `limit = "memory"` only when the command itself died by SIGKILL: a
-- child killed while the command exited by itself is not the cap ending the run.
-- @tparam table st the mechanism's state (`cgroup`, `oom_seen`)
-- @tparam table result `{code, how, limit?}`
-- @treturn table result
function M.observe(st, result)
  if st and st.cgroup then
    local usage = st.cgroup:usage()
    result.usage = usage
    if usage and (usage.oom_kills or 0) > (st.oom_seen or 0) then
      result.oom_kills = usage.oom_kills - (st.oom_seen or 0)
      st.oom_seen = usage.oom_kills
      if result.how == "killed" or result.code == 128 + 9 then result.limit = result.limit or "memory" end
    end
  end
  return result
end

return M
