--- A `corral run` request's values checked before anything is made: its limits, its
-- storage path, its service port, and the files the host writes for it (--learn,
-- --log-json). Each refusal goes through the caller's `invalid(key, detail)`, which
-- names the argument in the caller's words (corral.run's context). Nothing here
-- acquires anything.
-- @module corral.run_request
local core = require "corral.core"

local M = {}

-- Sizes and durations as given (corral.sandbox parses them), counts to integers, cpu to a
-- number; each written in plain decimal (tonumber would take "0x10" and " 5").
local function convert_limits(given, invalid)
  local sandbox = require "corral.sandbox"
  local limits = {}
  given = given or {}
  for _, k in ipairs({ "memory", "fsize", "wall", "disk" }) do limits[k] = given[k] end
  for _, k in ipairs({ "pids", "nofile" }) do
    if given[k] then
      limits[k] = sandbox.parse_integer(given[k])
      if not limits[k] then
        return invalid("limits." .. k, string.format("must be a whole number in decimal, got %q", tostring(given[k])))
      end
    end
  end
  if given.cpu then
    limits.cpu = sandbox.parse_decimal(given.cpu)
    if not limits.cpu then
      return invalid("limits.cpu", string.format("must be a number of cores in decimal (e.g. 0.5), got %q",
        tostring(given.cpu)))
    end
  end
  return limits
end

-- The storage root and id from a storage path: DIR may not exist yet, its parent must
-- (corral.sandbox.check_root, the Lua API's rule too); the id is DIR's last component.
local function split_storage(storage, id, invalid, name)
  local parent, base = storage:gsub("/+$", ""):match("^(.*)/([^/]+)$")
  if storage:sub(1, 1) ~= "/" then return invalid("storage", storage .. ": must be an absolute path") end
  if not parent or base == "." or base == ".." then
    return invalid("storage", storage .. ": must name a directory below /, ending in its own name (not . or ..)")
  end
  local dir, err = require("corral.sandbox").check_root(parent == "" and "/" or parent)
  if not dir then return invalid("storage", err.detail) end
  if id and id ~= base then
    return invalid("id", string.format("the sandbox's id is %s's last component (%s); give one of %s and %s",
      name("storage"), base, name("id"), name("storage")))
  end
  return dir, base
end

-- Why the host must not write `path` (a --learn or --log-json file), or nil. It may lie
-- where the tenant writes — its storage, its workspace — and there a tenant of an earlier
-- run may have put a symbolic link in its way (the host's write would land where it points:
-- /etc/passwd truncated by --learn) or a FIFO (the host's open would block for ever). Each
-- component is examined in turn: outside those trees a link is the operator's and is
-- followed; inside, none is, and what the path names must be a regular file or missing.
local function unsafe_host_file(path, sb)
  local trees = {}
  for _, dir in ipairs({ require("corral.sandbox").storage_path(sb), sb.workspace_path }) do
    local st = core.fs.lstat(dir)
    if st and st.type == "dir" then trees[#trees + 1] = st end
  end
  local function is_tree(st)
    for _, t in ipairs(trees) do
      if st.dev == t.dev and st.ino == t.ino then return true end
    end
    return false
  end
  if path == "-" or #trees == 0 then return nil end
  local cur = path:sub(1, 1) == "/" and "" or (core.path.resolve(".") or ".")
  local inside, st = false, nil
  for comp in path:gmatch("[^/]+") do
    local at = cur .. "/" .. comp
    st = core.fs.lstat(at)
    if not st then return nil end -- the rest does not exist yet: the write makes it, or fails
    if st.type == "link" then
      if inside then
        return at .. " is a symbolic link inside the sandbox's storage or workspace (name the file itself)"
      end
      at = core.path.resolve(at)
      st = at and core.fs.lstat(at)
      if not st then return nil end
    end
    cur = at
    inside = inside or (st.type == "dir" and is_tree(st))
  end
  if inside and st and st.type ~= "file" then
    return path .. " is not a regular file (" .. st.type .. ") inside the sandbox's storage or workspace"
  end
  return nil
end

--- The limits, the storage's root and id, and the service port, as corral.sandbox
-- takes them.
-- @tparam table run `req` (corral.run.execute's), `invalid(key, detail)`, `name(key)`
-- @treturn[1] table `{limits =, root =, id =, service_port =}`
-- @return[2] nil
-- @treturn[2] table the invalid_argument
function M.arguments(run)
  local req = run.req
  local limits, lerr = convert_limits(req.limits, run.invalid)
  if not limits then return nil, lerr end
  local args = { limits = limits, id = req.id }
  if req.storage then
    local root, base_or_err = split_storage(req.storage, req.id, run.invalid, run.name)
    if not root then return nil, base_or_err end
    args.root, args.id = root, base_or_err
  end
  if req.service_port then
    args.service_port = require("corral.sandbox").parse_integer(req.service_port)
    if not args.service_port then
      return run.invalid("service_port", string.format("must be a port number in decimal, got %q",
        tostring(req.service_port)))
    end
  end
  return args
end

--- Whether the host may write the request's --learn and --log-json files for sandbox
-- `sb` (see unsafe_host_file).
-- @tparam table run as `arguments` takes it
-- @tparam table sb the checked sandbox
-- @treturn[1] boolean true
-- @return[2] nil
-- @treturn[2] table the invalid_argument naming the file's argument
function M.host_files(run, sb)
  for _, key in ipairs({ "log_json", "learn" }) do
    local why = run.req[key] and unsafe_host_file(run.req[key], sb)
    if why then return run.invalid(key, why) end
  end
  return true
end

return M
