--- The agent's boundary as a brokered `corral` holds it. The broker checks each path of a
-- request, then runs `corral SUB …` with the resolved strings; between the two an agent
-- could swap a checked directory for a symlink out. So the broker also hands its child
-- the boundary (CORRAL_BROKER_BOUNDARY, set on the child it spawns: the agent names no
-- variable of corral's own), and the child opens each granted path again with no symlink
-- anywhere on it (core.fs.open_dir, open_path), requires the opened object's own path to
-- be the string the broker granted (invariant 3) and inside the boundary, and then uses
-- the object through its fd (/proc/self/fd/N), never the name again.
-- @module corral.broker.boundary
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

--- The variable the broker sets on its own child.
M.VAR = "CORRAL_BROKER_BOUNDARY"

-- The fds pinned for this process's life: what their /proc/self/fd paths name.
local pinned = {}

-- The storage and workspace the broker granted (resolved strings), when the request
-- named them.
local granted = {}

-- Read when this module loads (corral.cli loads it first): a run clears its own
-- environment before its mechanism loads (corral.hardening), the variable with it.
local TEXT = os.getenv(M.VAR)

--- The boundary this process was handed by its broker, or nil outside one.
-- @treturn table|nil `{dirs = {…}, files = {…}}` (resolved)
function M.get()
  local text = TEXT
  if not text or text == "" then return nil end
  local ok, b = pcall(require("corral.json").decode, text)
  -- a broken variable is no boundary at all: refuse everything rather than nothing
  if not ok or type(b) ~= "table" then return { dirs = {}, files = {} } end
  return { dirs = type(b.dirs) == "table" and b.dirs or {}, files = type(b.files) == "table" and b.files or {} }
end

--- The variable's value for a boundary, the sessions the broker made and the agent's
-- --env values.
-- @tparam table b `dirs`, `files`
-- @tparam table sessions id → true
-- @tparam table env name → value
function M.encode(b, sessions, env)
  local ids = {}
  for id in pairs(sessions or {}) do ids[#ids + 1] = id end
  table.sort(ids)
  return require("corral.json").encode({ dirs = b.dirs, files = b.files, sessions = ids, env = env or {} })
end

--- The agent's values of the variables its request names with --env (a run's tenant
-- takes them from here, not from this process's environment), or nil outside a broker.
-- @treturn table|nil name → value
function M.environment()
  if not TEXT or TEXT == "" then return nil end
  local ok, b = pcall(require("corral.json").decode, TEXT)
  local env = {}
  for k, v in pairs(ok and type(b) == "table" and type(b.env) == "table" and b.env or {}) do
    if type(k) == "string" and type(v) == "string" then env[k] = v end
  end
  return env
end

--- The sessions this process's broker made (what its `ls` shows), or nil outside one.
-- @treturn table|nil id → true
function M.sessions()
  local text = TEXT
  if not text or text == "" then return nil end
  local ok, b = pcall(require("corral.json").decode, text)
  local set = {}
  for _, id in ipairs(ok and type(b) == "table" and type(b.sessions) == "table" and b.sessions or {}) do
    set[id] = true
  end
  return set
end

local function inside(b, path, files_too)
  for _, d in ipairs(b.dirs) do
    if core.path.is_beneath(path, d) then return true end
  end
  for _, f in ipairs(files_too and b.files or {}) do
    if f == path then return true end
  end
  return false
end

-- Where the object an fd holds lies now (the kernel's name for it).
local function real(fd)
  return core.fs.readlink("/proc/self/fd/" .. fd:fileno())
end

-- Opens `path` (the string the broker granted) with no symlink on the way and checks
-- the object is that path, inside the boundary; its /proc/self/fd path, or nil and why.
local function pin(b, flag, path, dir, files_too)
  local fd, err = (dir and core.fs.open_dir or core.fs.open_path)(path)
  if not fd then return nil, errors.invalid_argument(flag, tostring(err) .. " (opened with no symlink followed, " ..
    "as the broker granted it)") end
  local at = real(fd)
  if at ~= path or not inside(b, at, files_too) then
    fd:close()
    return nil, errors.invalid_argument(flag, path .. " changed after the broker checked it (now " .. tostring(at) ..
      "): refused")
  end
  pinned[#pinned + 1] = fd
  return "/proc/self/fd/" .. fd:fileno()
end

--- A directory granted by the broker, pinned: the path this process uses for it.
-- @tparam string flag the CLI flag, for errors
-- @tparam string path as granted (resolved)
-- @treturn string `/proc/self/fd/N` (the directory itself) or `path` outside a broker;
--   or nil and invalid_argument
function M.dir(flag, path)
  local b = M.get()
  if not b then return path end
  return pin(b, flag, path, true)
end

--- Whether the workspace this process opened with no symlink followed (`fd`, from
-- `path`) is the one the broker granted, inside the boundary.
-- @treturn true, or nil and invalid_argument (always true outside a broker)
function M.held(flag, fd, path)
  local b = M.get()
  if not b then return true end
  local at = real(fd)
  path = granted.workspace or path
  if at ~= path or not inside(b, at) then
    return nil, errors.invalid_argument(flag, path .. " changed after the broker checked it (now " .. tostring(at) ..
      "): refused")
  end
  return true
end

--- Why a sandbox whose storage and workspace the mechanism binds by name (not from the
-- directory this process opened: corral not root) cannot take one the broker granted, or
-- nil: a name is resolved again when bound, after every check.
function M.named()
  if not M.get() then return nil end
  local p = granted.storage or granted.workspace
  if not p then return nil end
  return errors.cannot_enforce("filesystem_confinement", p .. ": through a broker, a storage or workspace in " ..
    "the agent's boundary is shown from the directory corral opened and checked, which needs corral to run as " ..
    "root (unprivileged, it is bound by its name, which the agent could swap); without --storage and " ..
    "--workspace the tenant gets a storage corral makes")
end

--- A file to read (a boundary file too), pinned as `dir` pins a directory.
function M.file(flag, path)
  local b = M.get()
  if not b then return path end
  return pin(b, flag, path, false, true)
end

--- Records the `--storage` or `--workspace` the broker granted; `storage` and `held`
-- then hold corral to it.
-- @tparam string kind "storage" or "workspace"
function M.grant(kind, path)
  granted[kind] = path
end

--- The path to make and lock a sandbox's storage by: outside a broker, or for a storage
-- corral makes itself (none was asked), `path`; else the granted storage, its parent
-- pinned, and only when `path` (what this process resolved) is still that one.
-- @treturn string, or nil and invalid_argument
function M.storage(path)
  if not M.get() or not granted.storage then return path end
  if path ~= granted.storage then
    return nil, errors.invalid_argument("storage", granted.storage .. " changed after the broker checked it (now " ..
      path .. "): refused")
  end
  return M.child("storage", path)
end

--- A path whose last component may not exist yet (a storage, a file to write): its
-- parent pinned, the last component appended (whose own opener must not follow a link).
-- @treturn string `/proc/self/fd/N/NAME` or `path` outside a broker; or nil and invalid_argument
function M.child(flag, path)
  local b = M.get()
  if not b then return path end
  local parent, base = path:match("^(.*)/([^/]+)$")
  if not parent or base == "." or base == ".." then
    return nil, errors.invalid_argument(flag, path .. ": not a path")
  end
  local at, err = pin(b, flag, parent == "" and "/" or parent, true)
  if not at then return nil, err end
  return at .. "/" .. base
end

return M
