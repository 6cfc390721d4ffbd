--- A sandbox's storage directory on the host: created owned by its host id or accepted
-- (an operator's, shown through an idmapped mount), locked for the sandbox's life, marked
-- (`corral.storage_mark`), and refused where a tenant could reach another's files. The
-- host calls `prepare` for every mechanism (`corral.resources`); a custom mechanism that
-- provisions on its own calls it too and keeps the lock until destroy.
-- @module corral.storage
local core = require "corral.core"
local errors = require "corral.errors"
local storage_mark = require "corral.storage_mark"
local state_dir = require "corral.state_dir"
local idmapped = require "corral.idmapped"
local disk = require "corral.disk"

local M = {}

--- The sandbox's storage directory: `storage_root/id`.
-- @tparam table sb
-- @treturn string
function M.path(sb)
  return (sb.storage_root:gsub("/+$", "")) .. "/" .. sb.id
end

--- Checks that a storage root exists and is a directory. corral creates the sandbox's
-- own directory, never those above it: where tenant data lives is the operator's call,
-- not a tree made as root at whatever path a typo names.
-- @tparam string root
-- @treturn string the root, resolved; or nil and invalid_argument("storage_root", …)
function M.check_root(root)
  local resolved = core.path.resolve(root)
  local st = resolved and core.fs.lstat(resolved)
  if not st and core.fs.lstat(root) then
    return nil, errors.invalid_argument("storage_root", root .. " is not a directory")
  end
  if not st then
    return nil, errors.invalid_argument("storage_root", root .. " does not exist; corral creates only the " ..
      "sandbox's own directory beneath it (create it first, e.g. mkdir -m 0711 " .. root .. ")")
  end
  if st.type ~= "dir" then return nil, errors.invalid_argument("storage_root", root .. " is not a directory") end
  return resolved
end

--- Whether `uid` is in the range corral's host ids take (see `host_id`).
-- @tparam integer uid
-- @treturn boolean
function M.is_host_id(uid)
  return uid >= 1000000000 and uid < 2000000000
end

--- The unprivileged host id a sandbox's root maps to: FNV-1a of the storage path, in
-- 1,000,000,000..1,999,999,999, a range no login account uses.
-- @tparam table sb
-- @treturn integer
function M.host_id(sb)
  local euid = core.proc.geteuid()
  if euid ~= 0 then return euid end
  -- the whole storage path, not the id: every `corral run` without --storage is id
  -- "tenant"; the same path keeps its owner across runs
  local key = M.path(sb)
  local h = 2166136261
  for i = 1, #key do h = ((h ~ key:byte(i)) * 16777619) & 0xffffffff end
  return 1000000000 + h % 1000000000
end

--- Who else holds a sandbox's host id, or nil: a live process running as it, or another
-- storage directory beside this one owned by it. The id is a hash, and a colliding pair
-- of paths is found offline in under a second; two sandboxes sharing an id share its
-- kernel limits and each other's files.
-- @tparam table sb
-- @treturn string|nil what holds it
function M.holder(sb)
  local id = M.host_id(sb)
  if id == core.proc.geteuid() then return nil end -- unprivileged: always the caller's own id
  -- a zombie holds nothing (core.proc.find_owned passes over it)
  local pid = core.proc.find_owned(id)
  if pid then return "process " .. pid end
  for _, name in ipairs(core.fs.listdir(sb.storage_root) or {}) do
    if name ~= sb.id then
      local st = core.fs.lstat(sb.storage_root .. "/" .. name)
      if st and st.uid == id then return "storage " .. sb.storage_root .. "/" .. name end
    end
  end
  return nil
end

-- Why a storage directory `owner` made (not the sandbox's host id) cannot be taken as an
-- operator's, or nil. Shown through an idmapped mount, the tenant's files land as that
-- owner's: only root, or the owner itself, may have put it there — its root is theirs and
-- no one else may write it (a sticky root: no one else may replace their entries).
-- Elsewhere anyone could have made it in advance (a --storage under a shared /tmp) and
-- would own what the tenant writes; and a directory of another host id is another
-- sandbox's storage (one a tenant made beneath its own, to be adopted by a sandbox there).
local function unvouched(sb, path, owner)
  if M.is_host_id(owner) then
    return string.format("%s is owned by uid %d, another sandbox's host id: it belongs to that sandbox, not " ..
      "to this one", path, owner)
  end
  local root = core.path.resolve(sb.storage_root)
  local st = root and core.fs.lstat(root)
  if not st then return sb.storage_root .. " cannot be examined" end
  local others_write = st.mode & tonumber("022", 8) ~= 0
  local sticky = st.mode & tonumber("1000", 8) ~= 0
  if (st.uid == 0 or st.uid == owner) and (not others_write or (sticky and owner == st.uid)) then return nil end
  return string.format("%s exists, owned by uid %d, in %s (uid %d, mode %o), which %s: anyone could have " ..
    "made it, and the tenant's files would be theirs; an existing directory is taken from a root only root " ..
    "or its owner may write (remove it to have corral make one)", path, owner, root, st.uid, st.mode,
    others_write and "others may write" or "another user owns")
end

--- Creates the sandbox's storage directory owned by its host id, or accepts an existing
-- one: one that id owns; or, made by someone else (an operator's provisioning, owned by
-- root or anyone), where the mechanism takes detached trees and corral runs as root, shown
-- to the tenant through an idmapped mount (corral.idmapped) so that what its owner owns
-- is the tenant's inside and every file the tenant makes lands owned by that owner; it is
-- never chowned. Elsewhere one owned by another id is refused, saying why no idmapped mount
-- could show it (a `--storage /etc` must not hand /etc to a tenant). With `limits.disk`
-- the directory is not shown (the disk is, corral.disk), so any owner will do. The storage
-- is locked until the sandbox is destroyed.
-- @tparam table sb
-- @tparam[opt] table opts `trees` (the mechanism moves detached trees, made by this
--   process, into the tenant's root), `by_path` (a helper reaches the storage by its path
--   as the host id: every directory above must then be searchable by it), `mechanism`
--   (its name, for messages)
-- @treturn[1] true
-- @treturn[1] userdata the lock (a corral.fd on the directory; close it to release)
-- @treturn[1] userdata|nil the idmapped mount's user namespace, when the directory is
--   shown through one
-- @treturn[1] string|nil when this call made the directory, the path it was made by (under
--   a broker, beneath the pinned parent: remove it by that) (a caller refusing the run
--   afterwards removes it)
-- @return[2] nil and invalid_argument/cannot_enforce
function M.prepare(sb, opts)
  opts = opts or {}
  local path, id = M.path(sb), M.host_id(sb)
  -- a path that cannot hold a directory is the argument's fault (exit 2), anything else
  -- the host's; ENOENT, EACCES, ENOTDIR, EROFS, EPERM
  local BAD_PATH = { [2] = true, [13] = true, [20] = true, [30] = true, [1] = true }
  local function cannot(detail, errno)
    if BAD_PATH[errno] then return nil, errors.invalid_argument("storage", "cannot create it: " .. detail) end
    return nil, errors.cannot_enforce("filesystem_confinement", "cannot create storage " .. path .. ": " .. detail)
  end
  local root_ok, root_err = M.check_root(sb.storage_root)
  if not root_ok then return nil, root_err end
  -- nor one made there: /etc/x would be the tenant's, inside the runtime every sandbox reads
  local resolved = (root_ok:gsub("/+$", "")) .. "/" .. sb.id
  local outside, bwhy = core.rootplan.check_boundary(resolved)
  if not outside then
    return nil, errors.invalid_argument("storage", resolved .. " " .. bwhy .. ": it cannot be handed to a tenant")
  end
  local private = state_dir.refusal(resolved)
  if private then return nil, errors.invalid_argument("storage", resolved .. " " .. private) end
  local enclosing = core.proc.geteuid() == 0 and storage_mark.enclosing(root_ok)
  if enclosing then
    return nil, errors.invalid_argument("storage", string.format("%s is inside %s, where another sandbox keeps " ..
      "its files: its tenant could reach this one's files and disk (keep them side by side)", resolved, enclosing))
  end
  local unclaimed = disk.unclaimed(sb)
  if unclaimed then return nil, unclaimed end
  -- under a broker, made and locked through its parent pinned (corral.broker.boundary)
  local at, aerr = require("corral.broker.boundary").storage(path)
  if not at then return nil, aerr end
  local made, err, errno = core.fs.mkdir(at, tonumber("700", 8))
  if made then
    local ok, cerr = core.fs.chown(at, id, id)
    if not ok then
      core.fs.remove_tree(at)
      return cannot(cerr)
    end
  elseif errno ~= core.errno.EEXIST then
    return cannot(err, errno)
  else
    local st = core.fs.lstat(at)
    if st and st.type == "link" then
      -- never followed: where it points could change between the checks and the mount
      return nil, errors.invalid_argument("storage", path .. " is a symbolic link; give the directory itself")
    end
    if not st or st.type ~= "dir" then
      return nil, errors.invalid_argument("storage", path .. " exists and is not a directory")
    end
  end
  -- the lock is taken before the holder check, which sees only ids already running, so
  -- two provisions of one storage at once cannot both pass it; and every decision below is
  -- about the directory it holds, whatever the path names by then
  local lock, lerr, lerrno = core.fs.lock_dir(at)
  if not lock then
    if lerrno == core.errno.EAGAIN then
      return nil, errors.invalid_argument("storage", path .. " is in use by another sandbox")
    end
    if lerrno == core.errno.ELOOP or lerrno == core.errno.ENOTDIR then
      return nil, errors.invalid_argument("storage", path .. " exists and is not a directory")
    end
    return nil, errors.cannot_enforce("filesystem_confinement", "cannot lock storage: " .. tostring(lerr))
  end
  -- a refused run leaves nothing it made: the directory is still empty here
  local function refuse(e)
    lock:close()
    if made then os.remove(at) end
    return nil, e
  end
  local owner = core.fs.lstat(lock).uid
  local userns, shown_as_is = nil, owner == id
  if owner ~= id and not (sb.limits and sb.limits.disk) then
    local why, kind
    local suspect = core.proc.geteuid() == 0 and unvouched(sb, path, owner)
    if suspect then return refuse(errors.invalid_argument("storage", suspect)) end
    if opts.trees and core.proc.geteuid() == 0 then
      userns, why, kind = idmapped.mapping(lock, path, id)
    elseif core.proc.geteuid() ~= 0 then
      why = "an idmapped mount, which would show it as the tenant's own, needs corral to run as root"
    else
      why = string.format("the %s mechanism cannot show it through an idmapped mount (it binds the directory " ..
        "by its path%s)", opts.mechanism or "chosen", opts.mechanism == "oci" and "; its engine takes no idmap" or "")
    end
    if kind == "refused" or kind == "boundary" or kind == "shared" or kind == "storage" then
      return refuse(errors.invalid_argument("storage", why))
    end
    if not userns then
      return refuse(errors.invalid_argument("storage", string.format("%s exists and is owned by uid %d; a tenant " ..
        "storage must be created by corral or owned by the sandbox host id %d, and idmapped mounts are " ..
        "unavailable here: %s", path, owner, id, why)))
    end
  end
  -- a helper that opens the storage by path as the tenant's own id needs every directory
  -- above searchable by that id; a tree made here (native as root) needs nothing of them
  if core.proc.geteuid() == 0 and (opts.by_path or not opts.trees) then
    local target = shown_as_is and path or sb.storage_root
    if core.fs.access_as(target, id, id, "x") ~= true then
      if userns then userns:close() end
      return refuse(errors.invalid_argument("storage_root", sb.storage_root .. " is not searchable by the " ..
        "sandbox's host id " .. id .. " (give every directory above the storage o+x, e.g. mode 0711)"))
    end
  end
  local holder = M.holder(sb)
  if holder then
    if userns then userns:close() end
    local e = errors.invalid_argument("id", string.format(
      "host id %d (derived from %s) is already held by %s; choose another sandbox id", id, path, holder))
    e.held_by = holder -- a caller with a throwaway storage may just take another path
    return refuse(e)
  end
  if core.proc.geteuid() == 0 then
    -- a filesystem without trusted.* attributes keeps no mark; there nothing tells a
    -- storage made inside this one from any other directory
    local marked, merr, merrno = core.fs.mark(lock, storage_mark.MARK)
    if not marked and merrno ~= core.errno.EOPNOTSUPP then
      if userns then userns:close() end
      return refuse(errors.cannot_enforce("filesystem_confinement", "cannot mark storage " .. path .. ": " ..
        tostring(merr)))
    end
  end
  return true, lock, userns, made and at
end

return M
