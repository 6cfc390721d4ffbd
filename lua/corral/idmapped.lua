--- Directories someone else made — an operator's provisioned storage, a repository
-- checked out by another user as the workspace — shown to a tenant through an idmapped
-- mount (core.idmap): the tenant's root owns inside what the directory's owner owns on
-- the host, every file it creates lands there owned by that owner, and nothing is ever
-- chowned. The mount is nosuid and nodev; the tenant's seccomp filter still refuses every
-- setuid and setgid bit.
--
-- What this hands over is the whole tree: everything in it the owner owns becomes the
-- tenant's to change. So it is refused for a path inside the runtime or the kernel's
-- interfaces (a storage or workspace at /etc, /usr, /proc …), for a directory anyone may
-- write (/tmp: root's files there belong to every program that made them), and for a
-- tree holding a hard link to a file outside it (a root-owned storage with a link to
-- /etc/shadow would hand the tenant /etc/shadow), or a setuid, setgid or file-capability program it could
-- rewrite (a write through a shared mapping keeps the bit: a setuid-root program any host
-- user then runs as root). The tenant itself cannot make either: link(2) across mounts
-- fails with EXDEV, and its seccomp filter refuses the bits (it holds no CAP_SETFCAP).
-- The walk is paid at each provision: ~6 µs a file with the tree in the page cache
-- (measured: /usr, 158,663 entries, 0.95 s, of which the capability lookups 0.2 s; 4 s
-- cold).
-- @module corral.idmapped
local core = require "corral.core"
local storage_mark = require "corral.storage_mark"

local M = {}

--- The user namespace that shows the directory open at `fd` as owned by `host_id`,
-- established by doing: the idmapped mount of this very directory is made once (the
-- filesystems that support it vary), and its tree is walked for hard links out of it and
-- privileged programs.
-- @tparam userdata fd the directory (a corral.fd from core.fs.lock_dir or open_dir)
-- @tparam string path its resolved path, for the boundary rule and the messages
-- @tparam integer host_id the sandbox's host id (its tenant's root)
-- @tparam[opt] string own the sandbox's own storage, which a workspace may hold
-- @treturn[1] userdata the namespace (a corral.fd) for core.idmap.tree
-- @return[2] nil
-- @treturn[2] string why, a phrase
-- @treturn[2] string "unavailable" (this host or filesystem cannot), "boundary" (a path
--   inside the runtime or the kernel's interfaces), "shared" (a directory anyone may
--   write: not its owner's alone), "storage" (it holds another sandbox's storage) or
--   "refused" (a hard link out of it, or a privileged program the tenant could rewrite)
function M.mapping(fd, path, host_id, own)
  if core.proc.geteuid() ~= 0 then return nil, "an idmapped mount needs corral to run as root", "unavailable" end
  local inside, why = core.rootplan.check_boundary(path)
  if not inside then
    return nil, path .. " " .. why .. ": it cannot be handed to a tenant", "boundary"
  end
  local st = core.fs.lstat(fd)
  -- a directory anyone may write (/tmp) is no one's tree: what its owner owns there (root's
  -- files in /tmp, another run's temporary storage and its disk image) is not the owner's to
  -- hand over
  if st.mode & tonumber("002", 8) ~= 0 then
    return nil, string.format("%s is writable by everyone (mode %o): a shared directory, not its owner's tree " ..
      "to hand over", path, st.mode), "shared"
  end
  local ns, err = core.idmap.userns(st.uid, host_id, st.gid, host_id)
  if not ns then return nil, tostring(err), "unavailable" end
  local tree, terr, terrno = core.idmap.tree(fd, ns, { rw = true })
  if not tree then
    ns:close()
    if terrno == core.errno.EINVAL then
      return nil, "the filesystem of " .. path .. " does not support idmapped mounts (" .. terr .. ")", "unavailable"
    end
    return nil, terr, "unavailable"
  end
  tree:close()
  -- walked as the tenant will see it: a clone without the mounts beneath
  local plain, perr = core.idmap.tree(fd)
  local found, first = nil, perr
  if plain then
    found, first = core.idmap.scan(plain, st.uid, st.gid, storage_mark.MARK)
    plain:close()
  end
  if not found then
    ns:close()
    return nil, "cannot walk " .. path .. ": " .. tostring(first), "unavailable"
  end
  local function more(n) return n > 1 and string.format(" (one of %d such files)", n) or "" end
  if found.links > 0 then
    ns:close()
    return nil, string.format("%s/%s is a hard link to a file outside it%s: through the idmapped mount the tenant " ..
      "could write that file (replace the link by a copy)", path, found.link, more(found.links)), "refused"
  end
  local function is_own(rel)
    local a, b = own and core.fs.lstat(own), core.fs.lstat(path .. "/" .. rel)
    return a and b and a.dev == b.dev and a.ino == b.ino
  end
  if found.storages > 1 or (found.storages == 1 and not is_own(found.storage)) then
    ns:close()
    return nil, string.format("%s/%s is where another sandbox keeps its files%s: through the idmapped mount the " ..
      "tenant could reach them and the disk image beside them (keep them side by side)", path, found.storage,
      found.storages > 1 and string.format(" (one of %d such directories)", found.storages) or ""), "storage"
  end
  if found.privileged > 0 then
    ns:close()
    return nil, string.format("%s/%s is setuid, setgid or has file capabilities%s: through the idmapped mount " ..
      "the tenant could rewrite it (a write through a shared mapping keeps the bit), and on the host it runs " ..
      "with its owner's privileges (remove the bit, or the file)", path, found.privileged_path,
      more(found.privileged)), "refused"
  end
  return ns
end

return M
