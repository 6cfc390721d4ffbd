--- The caller's private runtime directory: where corral keeps what lives as long as the
-- boot (control sockets of running sandboxes, the probe cache).
--
-- `/run/corral/<uid>` for root, `$XDG_RUNTIME_DIR/corral` otherwise (`/tmp/corral-<uid>`
-- without one), mode 0700 and owned by the caller — or it is not used at all.
-- @module corral.runtime_dir
local core = require "corral.core"

local M = {}

-- Read once, when corral loads: corral may clear its own environment before a run.
local XDG_RUNTIME_DIR = os.getenv("XDG_RUNTIME_DIR")

--- Whether `path` is a directory owned by the caller that no one else may enter.
-- @tparam string path
-- @treturn[1] string the path
-- @return[2] nil
-- @treturn[2] string why not
function M.owned_private(path)
  local st = core.fs.lstat(path)
  if not st then return nil, path .. ": missing" end
  if st.type ~= "dir" then return nil, path .. ": not a directory" end
  local me = core.proc.geteuid()
  if st.uid ~= me then return nil, path .. ": owned by uid " .. st.uid .. ", not " .. me end
  if st.mode & 0x3f ~= 0 then return nil, string.format("%s: mode %o lets others in", path, st.mode) end
  return path
end

local function make_dir(path, mode)
  local ok, err, errno = core.fs.mkdir(path, mode)
  if not ok and errno ~= core.errno.EEXIST then return nil, err end
  if ok then core.fs.chmod(path, mode) end
  return true
end

--- The runtime directory (made, mode 0700, when missing).
-- @treturn[1] string the path
-- @return[2] nil
-- @treturn[2] string why it cannot be used (another owner, a mode that lets others in)
function M.dir()
  local uid = core.proc.geteuid()
  local dir
  if uid == 0 then
    local ok, err = make_dir("/run/corral", tonumber("755", 8))
    if not ok then return nil, err end
    dir = "/run/corral/" .. uid
  elseif XDG_RUNTIME_DIR and XDG_RUNTIME_DIR:sub(1, 1) == "/" then
    dir = XDG_RUNTIME_DIR .. "/corral"
  else
    dir = "/tmp/corral-" .. uid
  end
  local ok, err = make_dir(dir, tonumber("700", 8))
  if not ok then return nil, err end
  return M.owned_private(dir)
end

return M
