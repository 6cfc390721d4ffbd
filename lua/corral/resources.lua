--- What the host holds for a sandbox, whatever mechanism builds it: storage, cgroup,
-- its own name files (corral.name_files), egress plane. One acquisition and one release,
-- so a half-built provision is undone.
-- @module corral.resources
local core = require "corral.core"
local sandbox = require "corral.sandbox"
local storage = require "corral.storage"
local leftovers = require "corral.leftovers"
local limits = require "corral.limits"
local name_files = require "corral.name_files"

local M = {}

--- Removes what SIGKILLed corral processes left in `dir` (corral.leftovers).
M.sweep = require("corral.leftovers").sweep

--- Removes empty `corral-<pid>-<n>` cgroups beneath our own whose creator is gone (corral.leftovers).
M.sweep_cgroups = leftovers.sweep_cgroups

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
  if st.names then
    name_files.remove(st.names)
    st.names = nil
  end
  if st.cgroup then
    local ok, err, errno = st.cgroup:destroy()
    if ok == nil and err then
      return nil, require("corral.errors").cannot_enforce("resource_limits", err, errno)
    end
    st.cgroup = nil
  end
  -- the disk's loop device detaches once no sandbox holds a clone of its mount
  for _, k in ipairs({ "disk", "storage_userns", "workspace", "workspace_userns", "storage_lock" }) do
    if st[k] then
      st[k]:close()
      st[k] = nil
    end
  end
  return true
end

-- The workspace as a detached tree's source: the directory itself (no symlink on the
-- way), shown through an idmapped mount when someone else owns it and one can be made.
-- One holding a hard link out of it or another sandbox's storage is refused
-- (corral.idmapped); one inside the runtime, one anyone may write (/tmp), or one on a
-- filesystem without idmapped mounts, is shown as it is: writable where its permissions
-- let the host id write (another storage there stays its own host id's, mode 0700).
local function acquire_workspace(sb, st)
  local fd, err = core.fs.open_dir(sb.workspace_path)
  if not fd then return nil, require("corral.errors").invalid_argument("workspace_path", tostring(err)) end
  st.workspace = fd
  local held, herr = require("corral.broker.boundary").held("workspace_path", fd, sb.workspace_path)
  if not held then return nil, herr end
  local id = sandbox.host_id(sb)
  if core.fs.lstat(fd).uid == id then return true end
  local userns, why, kind = require("corral.idmapped").mapping(fd, sb.workspace_path, id, sandbox.storage_path(sb))
  if kind == "refused" or kind == "storage" then
    return nil, require("corral.errors").invalid_argument("workspace_path", why)
  end
  st.workspace_userns = userns
  return true
end

--- Removes the storage directory and the disk image that `acquire` made (ones that were
-- there before stay), once released: a sandbox refused or ended before any command ran
-- in it leaves nothing it made. The directory only while it is empty, as it was made.
-- @tparam table st the state `acquire` returned
function M.remove_made(st)
  local made = st.made or {}
  if made.image then os.remove(made.image) end
  if made.storage then os.remove(made.storage) end
  st.made = nil
end

--- Creates the storage, the cgroup and the plane a sandbox asks for, and its disk.
-- @tparam table sb
-- @tparam[opt] table opts how the mechanism reaches the storage (corral.storage.prepare):
--   `trees` (it moves detached trees into the tenant's root: then, as root, the storage and
--   workspace are shown through `tree`), `by_path`, `mechanism`
-- @treturn table state `{status =, cgroup =, plane =, …}`, or nil and an error (nothing held)
function M.acquire(sb, opts)
  opts = opts or {}
  local trees = opts.trees and core.proc.geteuid() == 0
  if not trees then
    local named = require("corral.broker.boundary").named()
    if named then return nil, named end
  end
  local ok, lock, userns, made_storage = storage.prepare(sb, opts)
  if not ok then return nil, lock end
  local err, made_image
  local st = { status = "provisioned", storage_lock = lock, storage_userns = userns, trees = trees,
    made = { storage = made_storage } }
  local function refuse(e)
    M.release(st)
    M.remove_made(st)
    return nil, e
  end
  if sb.limits and sb.limits.disk then
    st.disk, err, made_image = require("corral.disk").acquire(sb, sandbox.host_id(sb))
    st.made.image = made_image and require("corral.disk").image_path(sb) or nil
    if not st.disk then return refuse(err) end
  end
  if trees and sb.workspace_path then
    ok, err = acquire_workspace(sb, st)
    if not ok then return refuse(err) end
  end
  -- swept on every provision, so a SIGKILLed run's cgroup need not wait for one with limits
  if core.proc.geteuid() == 0 and core.cgroup then
    leftovers.sweep_soon(function() pcall(M.sweep_cgroups) end)
  end
  st.cgroup, err = limits.cgroup(sb)
  if err then return refuse(err) end
  st.names, err = name_files.write(name_files.HOSTNAME)
  if not st.names then
    return refuse(require("corral.errors").cannot_enforce("filesystem_confinement", "the sandbox's own name " ..
      "files (/etc/hosts, resolv.conf, nsswitch.conf): " .. tostring(err)))
  end
  if M.needs_plane(sb) then
    st.plane, err = require("corral.egress.plane").new(sb.id, sb.network)
    if not st.plane then return refuse(err) end
    -- source-port slices by storage path, unique per sandbox (the id is not)
    st.plane.port_key = sandbox.storage_path(sb)
    require("corral.egress.loop").add(st.plane)
    if st.plane.terminator then
      -- the run's CA into the tenant's trust (corral.egress.secrets)
      local _, berr = name_files.write_ca_bundle(st.names, st.plane.terminator:ca_pem())
      if berr then
        return refuse(require("corral.errors").cannot_enforce("network_restriction", "the tenant's CA bundle: "
          .. tostring(berr)))
      end
    end
    if sb.service_port then
      ok, err = st.plane:serve(sb.service_port)
      if not ok then return refuse(err) end
    end
  end
  return st
end

--- A fresh detached tree of the storage or the workspace for one spawn to move into its
-- root (core.spawn.start's binds[i].tree): the disk's filesystem, or the directory,
-- idmapped when someone else owns it; nosuid and nodev. Each spawn takes its own (a tree
-- moved into one namespace cannot be moved again); close it once the spawn returns.
-- @tparam table st the state from `acquire`, with `trees`
-- @tparam string which "storage" or "workspace"
-- @treturn userdata the tree (a corral.fd), or nil and cannot_enforce("filesystem_confinement")
function M.tree(st, which)
  local tree, err
  if which == "storage" and st.disk then
    tree, err = core.idmap.tree(st.disk, nil, { rw = true })
  else
    local userns = st[which .. "_userns"]
    tree, err = core.idmap.tree(which == "storage" and st.storage_lock or st.workspace, userns,
      { rw = true, recursive = userns == nil })
  end
  if not tree then return nil, require("corral.errors").cannot_enforce("filesystem_confinement", tostring(err)) end
  return tree
end

--- Where the host reads and writes a sandbox's storage itself: its directory, or, on a
-- disk of its own, that filesystem through the mount this process holds (valid while the
-- sandbox is provisioned).
-- @tparam table sb
-- @tparam[opt] table st
-- @treturn string
function M.storage_view(sb, st)
  if st and st.disk then return "/proc/" .. core.proc.getpid() .. "/fd/" .. st.disk:fileno() end
  return sandbox.storage_path(sb)
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
