--- A sandbox's own disk (`limits.disk`, `corral run --disk SIZE`): the storage becomes a
-- filesystem of that size, so a tenant that writes past it gets ENOSPC and the host's
-- disk keeps its room.
--
-- The filesystem is an ext4 image beside the storage directory (`ROOT/.ID.disk`: a name
-- no sandbox id can take), sparse, formatted once with its root owned by the sandbox's
-- host id (under a temporary name, renamed into place once formatted), and kept with the
-- storage: the next run of the same storage mounts it again.
-- It is attached to a loop device that detaches itself (core.disk) and mounted as a
-- detached tree that no host path names; each spawn moves a clone of that tree to
-- /storage. Nothing is left once the sandbox is destroyed: no mount, no loop device.
-- @module corral.disk
local core = require "corral.core"
local errors = require "corral.errors"
local leftovers = require "corral.leftovers"

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

-- An image being made: beside the image, named by the making process, renamed into place
-- only once formatted, so a run killed while making it leaves no image without a
-- filesystem in its place (swept once that process is gone).
local function temporary_path(path) return path .. "-" .. core.proc.getpid() .. ".new" end
local TEMPORARY_PATTERN = "^%..+%.disk%-(%d+)%.new$"

-- Whether the image open at `image` starts like an ext4 filesystem (its superblock's magic).
local function has_filesystem(image)
  local f = io.open("/proc/self/fd/" .. image:fileno(), "rb")
  if not f then return false end
  f:seek("set", 1024 + 56)
  local magic = f:read(2)
  f:close()
  return magic == "\x53\xef"
end

-- Refusal of a disk the host's free space cannot hold: past it the tenant's writes would
-- fail on the host's filesystem (an I/O error inside, the host's disk full), not with
-- ENOSPC on its own. `growth`: what the image may still take on the host.
local function too_large(sb, want, growth)
  local fs = core.fs.statvfs(sb.storage_root)
  if not fs or growth <= fs.available then return nil end
  local function approx(bytes)
    local t = size_text(bytes)
    if t:match("^%d+$") or t:match("K$") then t = string.format("%.1fG", bytes / 1024 ^ 3) end
    return t
  end
  return errors.invalid_argument("limits.disk", string.format("%s is more than the filesystem of %s has free " ..
    "(%s): the image could not grow to its size%s (free space there, or give a smaller size)", size_text(want),
    sb.storage_root, approx(fs.available), growth < want and string.format(" (it may still take %s)",
    approx(growth)) or ""))
end

--- Opens (or creates and formats) a sandbox's disk image and mounts it as a detached tree.
-- A new image is made and formatted under a temporary name and renamed into place once
-- formatted; it must fit in the free space of the filesystem that holds it, and a kept
-- one must be able to grow to its size there (what it already takes is counted).
-- @tparam table sb a validated sandbox with `limits.disk`
-- @tparam integer uid the host id its root belongs to
-- @treturn[1] userdata the mount (a corral.fd: closing it releases the disk once no
--   sandbox holds a clone)
-- @treturn[1] nil
-- @treturn[1] boolean whether the image was made by this call
-- @return[2] nil and invalid_argument("limits.disk")/cannot_enforce("disk_quota")
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
  leftovers.sweep(sb.storage_root, TEMPORARY_PATTERN, leftovers.remove_own_file)
  local image, size, errno, made
  image, size, errno = core.disk.open(path)
  if not image and errno == core.errno.ENOENT then
    local e = too_large(sb, want, want)
    if e then return nil, e end
    local temp = temporary_path(path)
    leftovers.remove_own_file(temp) -- an earlier process of this pid's
    image, size, errno = core.disk.open(temp, want)
    if image then
      local ok, why = M.format(temp, uid)
      if ok then
        ok, why = os.rename(temp, path)
      else
        why = "cannot format " .. temp .. ": " .. why
      end
      if not ok then
        image:close()
        os.remove(temp)
        return nil, errors.cannot_enforce("disk_quota", why)
      end
      made = true
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
  local function refuse(e)
    image:close()
    return nil, e
  end
  if size ~= want then
    return refuse(errors.invalid_argument("limits.disk", string.format("this storage's disk (%s) is %s, not %s: a " ..
      "disk keeps the size it was made with (give %s, or remove the image to start afresh)",
      path, size_text(size), size_text(want), size_text(size))))
  end
  if not made then
    if not has_filesystem(image) then
      return refuse(errors.invalid_argument("limits.disk", string.format("this storage's disk (%s) holds no " ..
        "filesystem (a run killed while making it, before this version of corral, left it so; it held no files " ..
        "yet): remove it (rm %s) and the next run makes it afresh", path, path)))
    end
    local st = core.fs.lstat(image)
    local e = st and too_large(sb, want, math.max(0, want - st.allocated))
    if e then return refuse(e) end
  end
  local mount, dev, aerrno = core.disk.attach(image)
  image:close()
  if not mount then
    if made then os.remove(path) end
    if not made and aerrno == core.errno.EINVAL then
      return nil, errors.invalid_argument("limits.disk", string.format("this storage's disk (%s) cannot be " ..
        "mounted (%s): check it with e2fsck -f %s, or remove it to start afresh (its files are lost)", path,
        tostring(dev), path))
    end
    return nil, errors.cannot_enforce("disk_quota", tostring(dev))
  end
  -- mke2fs's lost+found is root's, which the tenant's root is not: one directory it could
  -- neither use nor remove (e2fsck makes it again when it needs one)
  if made then os.remove("/proc/self/fd/" .. mount:fileno() .. "/lost+found") end
  return mount, nil, made
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
