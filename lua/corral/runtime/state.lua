--- corral-runtime's directory of one container, `<root>/<id>/` (mode 0700): `keeper`
-- (the keeper's pid and its netns fd), `decisions.jsonl` (every egress decision, one
-- JSON object a line), `summary.json` (written by the keeper as it ends, and kept
-- `SUMMARY_DAYS` as `<log dir>/<id>.summary.json` once the directory is gone), `keeper.log`
-- (its stderr); and the messages corral-runtime writes to the engine's `--log` file in
-- the format it asks (`--log-format json|text`, runc's).
-- @module corral.runtime.state
local core = require "corral.core"
local file = require "corral.file"

local M = {}

--- The root corral-runtime keeps its state under when no `--root` is given.
M.DEFAULT_ROOT = "/run/corral-runtime"

--- Whether `id` may name a directory of ours (runc's rule, and never a hidden name:
-- the delegate's state lives in `<root>/.delegate`).
function M.valid_id(id)
  return type(id) == "string" and #id <= 1024 and id:match("^[%w_+-][%w_+.-]*$") ~= nil
end

--- The container's directory.
function M.dir(root, id) return root .. "/" .. id end

--- Makes the root and the container's directory (0700).
-- @treturn[1] string the directory
-- @return[2] nil
-- @treturn[2] string why
function M.make(root, id)
  for _, d in ipairs({ root, M.dir(root, id) }) do
    local ok, err, errno = core.fs.mkdir(d, tonumber("700", 8))
    if not ok and errno ~= core.errno.EEXIST then return nil, d .. ": " .. tostring(err) end
  end
  return M.dir(root, id)
end

--- The keeper recorded in a container's directory: `{pid =, fd =}`, or nil.
function M.keeper(root, id)
  local text = file.read(M.dir(root, id) .. "/keeper")
  local pid, fd = (text or ""):match("^(%d+) (%d+)")
  if pid then return { pid = math.tointeger(tonumber(pid)), fd = math.tointeger(tonumber(fd)) } end
end

--- Whether a keeper process is alive: its pid there, and running corral's host.
function M.alive(k)
  if not k then return false end
  local cmd = file.read("/proc/" .. k.pid .. "/cmdline") or ""
  return cmd:find("keeper", 1, true) ~= nil
end

-- RFC 3339 with seconds, as runc writes its log
local function now() return os.date("!%Y-%m-%dT%H:%M:%SZ") end

--- One line for the engine's log, in its format.
-- @tparam string format "json" or "text"
-- @tparam string level
-- @tparam string msg
-- @tparam[opt] table fields more JSON fields (json only)
function M.log_line(format, level, msg, fields)
  if format == "json" then
    local t = { level = level, msg = msg, time = now() }
    for k, v in pairs(fields or {}) do t[k] = t[k] or v end
    return require("corral.json").encode(t) .. "\n"
  end
  return string.format('time="%s" level=%s msg=%q\n', now(), level, msg)
end

--- Appends a line to the engine's log file, when it named one.
function M.log(g, level, msg, fields)
  if not g.log then return end
  local f = io.open(g.log, "a")
  if not f then return end
  f:write(M.log_line(g.log_format, level, msg, fields))
  f:close()
end

--- Days a container's summary is kept in the log directory (`<id>.summary.json`).
M.SUMMARY_DAYS = 7

--- Writes a container's summary to `path` (a new file, 0600, its directory made 0700):
-- it outlives the state directory, which `delete` removes.
function M.keep_summary(path, text)
  core.fs.mkdir(path:match("^(.*)/"), tonumber("700", 8))
  local tmp = path .. ".tmp"
  local f = io.open(tmp, "w")
  if not f then return end
  core.fs.chmod(tmp, tonumber("600", 8))
  f:write(text)
  f:close()
  os.rename(tmp, path)
end

--- Removes the summaries older than `SUMMARY_DAYS` from the log directory.
-- @treturn integer how many were removed
function M.sweep_summaries(dir)
  local n, limit = 0, os.time() - M.SUMMARY_DAYS * 86400
  for _, name in ipairs(core.fs.listdir(dir) or {}) do
    local st = name:match("%.summary%.json$") and core.fs.lstat(dir .. "/" .. name)
    if st and st.type == "file" and st.mtime_ns // 1000000000 < limit then
      os.remove(dir .. "/" .. name)
      n = n + 1
    end
  end
  return n
end

--- Removes the directories of containers whose keeper died and whose delegate no longer
-- knows them (a keeper killed, then its container deleted behind corral-runtime's back).
-- @tparam string root
-- @tparam function knows `knows(id)`: the delegate still has the container
-- @treturn integer how many were removed
function M.sweep(root, knows)
  local names = core.fs.listdir(root)
  local n = 0
  for _, id in ipairs(names or {}) do
    if M.valid_id(id) then
      local k = M.keeper(root, id)
      if k and not M.alive(k) and not knows(id) then
        core.fs.remove_tree(M.dir(root, id))
        n = n + 1
      end
    end
  end
  return n
end

return M
