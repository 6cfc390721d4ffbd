--- What the host holds for a sandbox, whatever mechanism builds it: storage, cgroup,
-- egress plane. One acquisition and one release, so a half-built provision is undone.
-- @module corral.resources
local core = require "corral.core"
local sandbox = require "corral.sandbox"
local limits = require "corral.limits"

local M = {}

--- Removes what SIGKILLed corral processes left in `dir`: entries matching `pattern`
-- (first capture: the creator's pid) whose creator is gone, when `remove` takes them.
-- @tparam string dir
-- @tparam string pattern
-- @tparam function remove `remove(path)` → truthy when removed
-- @treturn integer how many were removed
function M.sweep(dir, pattern, remove)
  local removed = 0
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local pid = name:match(pattern)
    if pid and not core.fs.lstat("/proc/" .. pid) and remove(dir .. "/" .. name) then removed = removed + 1 end
  end
  return removed
end

-- rmdir fails with EBUSY on a cgroup holding a process or a child, so a populated one
-- is never touched.
local function remove_empty_cgroup(path)
  local st = core.fs.lstat(path)
  return st and st.type == "dir" and os.remove(path)
end

--- Removes empty `corral-<pid>-<n>` cgroups beneath our own whose creator is gone.
-- @treturn integer how many were removed
function M.sweep_cgroups()
  local info = core.cgroup.info()
  local removed = 0
  for _, own in pairs(info and info.paths or {}) do
    removed = removed + M.sweep(own, "^corral%-(%d+)%-%d+$", remove_empty_cgroup)
  end
  return removed
end

--- Whether the sandbox needs an egress plane (an allowlist or a service port).
function M.needs_plane(sb)
  return sb.network ~= nil or sb.service_port ~= nil
end

--- Releases a state's plane and cgroup; idempotent, accepts a half-built state.
-- @treturn true, or nil and cannot_enforce when the cgroup cannot be removed
function M.release(st)
  if st.plane then
    require("corral.egress.loop").remove(st.plane)
    st.plane:close()
    st.plane = nil
  end
  if st.cgroup then
    local ok, err, errno = st.cgroup:destroy()
    if ok == nil and err then
      return nil, require("corral.errors").cannot_enforce("resource_limits", err, errno)
    end
    st.cgroup = nil
  end
  if st.storage_lock then
    st.storage_lock:close()
    st.storage_lock = nil
  end
  return true
end

--- Creates the storage, the cgroup and the plane a sandbox asks for.
-- @tparam table sb
-- @treturn table state `{status =, cgroup =, plane =}`, or nil and an error (nothing held)
function M.acquire(sb)
  local ok, lock = sandbox.prepare_storage(sb)
  if not ok then return nil, lock end
  local err
  local st = { status = "provisioned", storage_lock = lock }
  -- swept on every provision, so a SIGKILLed run's cgroup need not wait for one with limits
  if core.proc.geteuid() == 0 and core.cgroup then pcall(M.sweep_cgroups) end
  st.cgroup, err = limits.cgroup(sb)
  if err then
    M.release(st)
    return nil, err
  end
  if M.needs_plane(sb) then
    st.plane, err = require("corral.egress.plane").new(sb.id, sb.network)
    if not st.plane then
      M.release(st)
      return nil, err
    end
    -- source-port slices by storage path, unique per sandbox (the id is not)
    st.plane.port_key = sandbox.storage_path(sb)
    require("corral.egress.loop").add(st.plane)
    if sb.service_port then
      ok, err = st.plane:serve(sb.service_port)
      if not ok then
        M.release(st)
        return nil, err
      end
    end
  end
  return st
end

--- The cgroup.procs files a spawn writes the new process into.
function M.cgroup_procs(st)
  local procs = {}
  for _, dir in ipairs(st and st.cgroup and st.cgroup:paths() or {}) do procs[#procs + 1] = dir .. "/cgroup.procs" end
  return procs
end

--- `true, "127.0.0.1:PORT"` for a served service port, else `true, nil`.
function M.address(st)
  if st and st.plane and st.plane.service_addr then return true, st.plane.service_addr end
  return true, nil
end

return M
