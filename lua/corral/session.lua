--- Live sandboxes from the CLI (`corral create`, `exec`, `ls`, `rm`, `policy`): where a
-- session's socket is, which sessions are live, and the sweep of what a killed keeper
-- left. The keeper itself is corral.session.keeper; its exec op corral.session.exec; the
-- wire protocol is docs/sessions.md's.
--
-- A session is `<runtime_dir>/session-<ID>.sock` (corral.runtime_dir, mode 0600), bound
-- by its keeper. A socket nothing listens on any more (ECONNREFUSED: the keeper was
-- killed) is stale: the next `sweep` removes it, with the cgroups, temporary storages and
-- name files of dead corral processes.
-- @module corral.session
local core = require "corral.core"
local control = require "corral.control"
local errors = require "corral.errors"
local leftovers = require "corral.leftovers"

local M = {}

--- An id's grammar (SESSIONS-PROTOCOL): a letter or digit, then up to 62 of `[A-Za-z0-9_.-]`.
M.ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]*$"
M.ID_MAX = 63

--- Checks a session id.
-- @tparam string id
-- @treturn[1] string id
-- @return[2] nil
-- @treturn[2] table invalid_argument naming ID
function M.check_id(id)
  -- no "..": the sandbox's own id (corral.sandbox) never holds one
  if type(id) ~= "string" or #id > M.ID_MAX or not id:match(M.ID_PATTERN) or id:find("..", 1, true) then
    return nil, errors.invalid_argument("ID", string.format("%q: 1 to %d of A-Z a-z 0-9 _ . -, starting with a "
      .. "letter or digit, without '..'", tostring(id), M.ID_MAX))
  end
  return id
end

--- The socket of session `id`.
-- @tparam string id a checked id
-- @treturn[1] string the path
-- @return[2] nil
-- @treturn[2] string why the runtime directory cannot be used
function M.path(id)
  local dir, err = control.dir()
  if not dir then return nil, err end
  return dir .. "/session-" .. id .. ".sock"
end

-- Whether a keeper listens at path: "live", "stale" (a socket nothing listens on) or
-- "absent".
local function state_of(path)
  local fd, _, errno = core.unix.connect(path, 1)
  if fd then
    fd:close()
    return "live"
  end
  if errno == core.errno.ECONNREFUSED then return "stale" end
  -- a listener whose backlog is full: a keeper is there, only busy
  if errno == core.errno.ETIMEDOUT or errno == core.errno.EAGAIN then return "live" end
  return core.fs.lstat(path) and "stale" or "absent"
end

--- Whether session `id` is live (its keeper answers at its socket).
-- @tparam string id
-- @treturn boolean
function M.live(id)
  local path = M.path(id)
  return path ~= nil and state_of(path) == "live"
end

--- Removes the sockets of killed keepers among `paths` (nothing listens on them).
-- @tparam {string,...} paths session sockets
-- @treturn table the paths removed, as a set
-- @treturn integer how many
function M.sweep_sockets(paths)
  local removed, n = {}, 0
  for _, path in ipairs(paths) do
    if state_of(path) == "stale" and os.remove(path) then removed[path], n = true, n + 1 end
  end
  return removed, n
end

--- Removes what killed keepers left: their sockets, and (corral.leftovers' pid rule) the
-- cgroups, temporary storages and name files of dead corral processes.
-- @tparam[opt] {string,...} paths the session sockets to try (default: every one; `ls`,
--   which asks every keeper at once, tries only those that did not answer)
-- @treturn integer how many sockets were removed
function M.sweep(paths)
  if not paths then
    local dir = control.dir()
    paths = {}
    for _, name in ipairs(dir and core.fs.listdir(dir) or {}) do
      if name:match(control.SESSION_PATTERN) then paths[#paths + 1] = dir .. "/" .. name end
    end
  end
  local _, removed = M.sweep_sockets(paths)
  leftovers.sweep_cgroups()
  leftovers.sweep_own_all("/tmp", { "corral-run-", "corral-names-" })
  return removed
end

--- The live sessions of this user, after a sweep, by id.
-- @treturn {table,...} `{id =, path =}` each
function M.list()
  M.sweep()
  local out = {}
  for _, reg in ipairs(control.list()) do
    if reg.session then out[#out + 1] = { id = reg.session, path = reg.path } end
  end
  table.sort(out, function(a, b) return a.id < b.id end)
  return out
end

--- Asks session `id` one request (corral.control.request).
-- @tparam string id
-- @tparam table req
-- @tparam[opt] number timeout seconds
-- @return[1] the result
-- @return[2] nil
-- @treturn[2] string why
-- @treturn[2] string|nil "unanswered": the keeper was not there or never answered (not
--   a refusal of the request)
function M.request(id, req, timeout)
  local path, err = M.path(id)
  if not path then return nil, err end
  if state_of(path) ~= "live" then
    return nil, "no live sandbox " .. id .. " (corral ls lists this user's)", "unanswered"
  end
  return control.request(path, req, timeout)
end

return M
