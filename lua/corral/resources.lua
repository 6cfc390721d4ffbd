--- What the host holds for a sandbox, whatever mechanism builds it: its storage, its
-- cgroup (limits) and its egress plane (allowlist, service port). One acquisition and
-- one release, so every mechanism provisions and tears down the same way and a
-- half-built provision is undone.
-- @module corral.resources
local core = require "corral.core"
local sandbox = require "corral.sandbox"
local limits = require "corral.limits"

local M = {}

--- Removes what corral processes killed before they could clean up (SIGKILL leaves no
-- chance) left in `dir`: each entry whose name matches `pattern`, its capture the pid
-- of the process that made it, when that process is gone and `remove` takes the entry.
-- @tparam string dir
-- @tparam string pattern a Lua pattern whose first capture is the pid
-- @tparam function remove `remove(path)` → truthy when it removed the entry
-- @treturn integer how many were removed
function M.sweep(dir, pattern, remove)
  local removed = 0
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local pid = name:match(pattern)
    if pid and not core.fs.lstat("/proc/" .. pid) and remove(dir .. "/" .. name) then removed = removed + 1 end
  end
  return removed
end

-- rmdir removes a cgroup only when no process and no child cgroup is in it (EBUSY
-- otherwise), so a populated one is never touched; os.remove is rmdir for a directory.
local function remove_empty_cgroup(path)
  local st = core.fs.lstat(path)
  return st and st.type == "dir" and os.remove(path)
end

--- Removes the cgroups killed corral processes left: empty `corral-<pid>-<n>`
-- directories beneath our own cgroup whose creator is gone.
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
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table cannot_enforce when the cgroup cannot be removed
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
-- @treturn[1] table state `{status = "provisioned", cgroup =, plane =}`
-- @return[2] nil
-- @treturn[2] table error; nothing is left held
function M.acquire(sb)
  local ok, lock = sandbox.prepare_storage(sb)
  if not ok then return nil, lock end
  local err
  local st = { status = "provisioned", storage_lock = lock }
  -- Swept on every provision, with limits or without: a SIGKILLed run's cgroup must not
  -- wait for the next run that happens to set limits.
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
    -- Source ports come from a slice chosen by the storage path, unique per sandbox on
    -- the host (the id is not: every plain `corral run` is "tenant").
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
