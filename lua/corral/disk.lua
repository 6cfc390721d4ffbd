--- A sandbox's own disk (`limits.disk`, `corral run --disk SIZE`): the storage becomes a
-- filesystem of that size, so a tenant that writes past it gets ENOSPC and the host's
-- disk keeps its room.
--
-- The filesystem is an ext4 image beside the storage directory (`ROOT/.ID.disk`: a name
-- no sandbox id can take), sparse, formatted once with its root owned by the sandbox's
-- host id, and kept with the storage: the next run of the same storage mounts it again.
-- It is attached to a loop device that detaches itself (core.disk) and mounted as a
-- detached tree that no host path names; each spawn moves a clone of that tree to
-- /storage. Nothing is left once the sandbox is destroyed: no mount, no loop device.
-- @module corral.disk
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

--- The smallest disk: below it ext4 has no room for its journal.
M.MIN_BYTES = 8 * 1024 * 1024

local TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

--- Where a sandbox's disk image lives: beside its storage directory, named by its id.
-- @tparam table sb
-- @treturn string
function M.image_path(sb)
  return (sb.storage_root:gsub("/+$", "")) .. "/." .. sb.id .. ".disk"
end

local function size_text(bytes)
  for _, u in ipairs({ { "T", 1024 ^ 4 }, { "G", 1024 ^ 3 }, { "M", 1024 ^ 2 }, { "K", 1024 } }) do
    if bytes % u[2] == 0 then return string.format("%d%s", bytes // u[2], u[1]) end
  end
  return tostring(bytes)
end
M.size_text = size_text

-- Runs argv (no shell: its start-up is a third of a cold disk's), at most 60 s, and
-- returns its exit status and what it printed.
local function run(argv)
  local out, null = io.tmpfile(), io.open("/dev/null")
  local proc, err = core.spawn.start({ plain = true, path = argv[1], argv = argv, env = { "PATH=" .. TOOL_PATH },
    stdin = null, stdout = out, stderr = out })
  null:close()
  local status = proc and proc:wait(60) or 127
  if proc and not status then
    proc:kill()
    status = 124
  end
  if proc then proc:close() end
  out:seek("set")
  local text = proc and out:read("a") or tostring(err)
  out:close()
  return status, (text:gsub("%s+$", ""))
end

--- Formats the image at `path` as ext4 whose root `uid` owns: no reserved blocks (the
-- tenant's root is not the host's), no discard, and, the file being sparse, nothing
-- zeroed: with e2fsprogs >= 1.47 (assume_storage_prezeroed) a 1 GiB disk starts at
-- ~0.7 MiB on the host instead of ~33 MiB of journal and inode tables, and the kernel
-- does not zero them later either (measured: `du` of the image after mkfs.ext4).
-- @tparam string path
-- @tparam integer uid
-- @treturn true, or nil and why
function M.format(path, uid)
  local mkfs = core.path.resolve_executable("mkfs.ext4", TOOL_PATH)
  if not mkfs or mkfs:sub(1, 1) ~= "/" then return nil, "no mkfs.ext4 in " .. TOOL_PATH end
  local ext = string.format("root_owner=%d:%d,nodiscard", uid, uid)
  local status, out = run({ mkfs, "-q", "-F", "-m", "0", "-E", ext .. ",assume_storage_prezeroed=1", path })
  if status ~= 0 and out:find("assume_storage_prezeroed", 1, true) then
    status, out = run({ mkfs, "-q", "-F", "-m", "0", "-E", ext .. ",lazy_itable_init=1,lazy_journal_init=1", path })
  end
  if status ~= 0 then return nil, "mkfs.ext4 exited " .. status .. ": " .. out end
  return true
end

--- Opens (or creates and formats) a sandbox's disk image and mounts it as a detached tree.
-- @tparam table sb a validated sandbox with `limits.disk`
-- @tparam integer uid the host id its root belongs to
-- @treturn userdata the mount (a corral.fd: closing it releases the disk once no
--   sandbox holds a clone), or nil and invalid_argument("limits.disk")/cannot_enforce("disk_quota")
function M.acquire(sb, uid)
  local want, path = sb.limits.disk, M.image_path(sb)
  -- in a root others may write, anyone may rename the images in it: one sandbox's disk
  -- would be handed to another (sticky: only root renames root's)
  local root = core.fs.lstat(sb.storage_root)
  if root and root.mode & tonumber("022", 8) ~= 0 and root.mode & tonumber("1000", 8) == 0 then
    return nil, errors.invalid_argument("limits.disk", string.format("%s (mode %o) lets others rename the disk " ..
      "images in it, and hand one sandbox's disk to another: give a root only root may write (or make it sticky, " ..
      "chmod +t)", sb.storage_root, root.mode))
  end
  local image, size, errno, made
  image, size, errno = core.disk.open(path)
  if not image and errno == core.errno.ENOENT then
    image, size, errno = core.disk.open(path, want)
    made = image ~= nil
    if image then
      local ok, why = M.format(path, uid)
      if not ok then
        image:close()
        os.remove(path)
        return nil, errors.cannot_enforce("disk_quota", "cannot format " .. path .. ": " .. why)
      end
    end
  end
  if not image then
    if errno == core.errno.EFBIG then
      return nil, errors.invalid_argument("limits.disk", string.format("%s is larger than the filesystem of %s " ..
        "allows a file to be", size_text(want), sb.storage_root))
    end
    if errno == core.errno.EISDIR then errno = core.errno.EPERM end
    if errno == core.errno.EPERM or errno == core.errno.ELOOP then
      return nil, errors.invalid_argument("limits.disk", path .. " is not a disk image corral made (a regular file " ..
        "owned by uid " .. core.proc.geteuid() .. " that no one else may write); move it away")
    end
    return nil, errors.cannot_enforce("disk_quota", "cannot open " .. tostring(size))
  end
  if size ~= want then
    image:close()
    return nil, errors.invalid_argument("limits.disk", string.format("this storage's disk (%s) is %s, not %s: a " ..
      "disk keeps the size it was made with (give %s, or remove the image to start afresh)",
      path, size_text(size), size_text(want), size_text(size)))
  end
  local mount, dev = core.disk.attach(image)
  image:close()
  if not mount then return nil, errors.cannot_enforce("disk_quota", tostring(dev)) end
  -- mke2fs's lost+found is root's, which the tenant's root is not: one directory it could
  -- neither use nor remove (e2fsck makes it again when it needs one)
  if made then os.remove("/proc/self/fd/" .. mount:fileno() .. "/lost+found") end
  return mount
end

--- An error when the storage has a disk image but the sandbox asks for none: its data is
-- on that disk, and an empty directory shown instead would look like a lost storage.
-- @tparam table sb
-- @treturn nil, or invalid_argument("limits.disk")
function M.unclaimed(sb)
  if sb.limits and sb.limits.disk then return nil end
  local path = M.image_path(sb)
  local st = core.fs.lstat(path)
  if not st then return nil end
  return errors.invalid_argument("limits.disk", string.format("this storage keeps its files on a disk of its own " ..
    "(%s, %s): give limits.disk %s to use it, or remove the image", path, size_text(st.size or 0),
    size_text(st.size or 0)))
end

return M
