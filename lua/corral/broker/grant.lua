--- What a confined agent's request may ask of its broker: its flags parsed, every host
-- path resolved (core.path: every symlink and `..`) and required inside the agent's own
-- boundary, every limit no larger than the agent's own, the session ids it names its
-- own; then the argv the broker runs, rebuilt from what was checked (never the agent's
-- words as they came: a flag the broker read one way and corral another would pass
-- unchecked).
--
-- Each subcommand is a table of its flags' classes. A flag with no class is refused: a
-- flag added to corral later reaches no agent until someone says what it grants.
-- @module corral.broker.grant
local core = require "corral.core"
local sandbox = require "corral.sandbox"

local M = {}

-- Classes of `corral run`'s (and `create`'s) flags. dir: an existing directory inside the
-- boundary; storage: the same, or a new one whose parent is; file_read: a regular file
-- inside (or a file --extra); file_write: a file to write, whose parent is inside a
-- boundary directory ("-": stdout); limit: compared with the agent's; env: a variable
-- name, its value taken from the agent's environment.
local RUN = {
  mechanism = "mechanism", id = "pass", storage = "storage", workspace = "dir",
  memory = "limit", pids = "limit", cpu = "limit", wall = "pass", fsize = "limit", nofile = "limit",
  disk = "its image is made by name beside the storage, where a swapped directory could redirect it",
  env = "env", allow = "pass", ["allow-file"] = "file_read", internal = "pass",
  resolve = "pass", ["service-port"] = "pass", idle = "pass", ["max-connections"] = "pass",
  ["udp-idle"] = "pass", ["max-udp-flows"] = "pass", sni = "pass", learn = "file_write",
  ["log-json"] = "file_write", verbose = "pass",
  -- refused, with the reason the agent reads
  engine = "the engine runs containers from paths the broker cannot check (native and bwrap only)",
  link = "a routed link joins another network namespace of the host",
  receipt = "receipts are signed with the operator's host key, which is not lent",
}

local function run_kinds()
  local kinds = {}
  for _, group in ipairs(require("corral.run.cli").OPTIONS) do
    for _, o in ipairs(group[2]) do kinds[o[1]] = o[2] end
  end
  return kinds
end

-- Each brokered subcommand: its flags' kinds and classes, short aliases, and whether
-- its first operand is a session id (`create` makes one; the others need one this
-- broker made). The session commands follow docs/sessions.md.
M.SUBCOMMANDS = {
  run = { kinds = run_kinds, classes = RUN },
  create = { kinds = run_kinds, classes = RUN, session = "new" },
  exec = { kinds = { env = "list", cwd = "value", tty = "flag" }, short = { t = "tty" },
           classes = { env = "env", cwd = "pass", tty = "pass" }, session = "own" },
  rm = { kinds = {}, classes = {}, session = "own" },
  policy = { kinds = { allow = "list", revoke = "list" }, classes = { allow = "pass", revoke = "pass" },
             session = "own" },
  ls = { kinds = { json = "flag" }, classes = { json = "pass" } },
}

local ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]*$"

local function refuse(flag, detail)
  return nil, (flag and (flag .. ": ") or "") .. detail, core.exit.USAGE
end

-- Flags and operands as the broker reads them, in the order given, mirroring corral.cli:
-- `--name value`, `--name=value`, `--` ends them; a dash word before an operand is an
-- unknown option.
local function parse(argv, kinds, short)
  local flags, rest = {}, {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      table.move(argv, i + 1, #argv, #rest + 1, rest)
      break
    end
    local name, inline = a:match("^%-%-([%w-]+)=(.*)$")
    name = name or a:match("^%-%-([%w-]+)$") or (short and short[a:match("^%-(%w)$") or ""])
    if not name and a:match("^%-.") then return refuse(a, "unknown option") end
    if not name then
      rest[#rest + 1] = a
    else
      local kind = kinds[name]
      if not kind then return refuse("--" .. name, "unknown option") end
      local v = true
      if kind ~= "flag" then
        v = inline
        if not v then
          i = i + 1
          v = argv[i]
          if v == nil or v == "--" then return refuse("--" .. name, "needs a value") end
        end
      elseif inline then
        return refuse("--" .. name, "takes no value")
      end
      flags[#flags + 1] = { name = name, value = v }
    end
    i = i + 1
  end
  return flags, rest
end

-- Variables the loader and libc read at a process's start (glibc's list of those it
-- drops for setuid programs) and corral's own.
local START_UP = { GCONV_PATH = true, GETCONF_DIR = true, GLIBC_TUNABLES = true, HOSTALIASES = true,
  LOCALDOMAIN = true, LOCPATH = true, NIS_PATH = true, NLSPATH = true, RESOLV_HOST_CONF = true,
  RES_OPTIONS = true, TMPDIR = true, TZDIR = true, XDG_RUNTIME_DIR = true, PATH = true, HOME = true }

local function start_up_variable(name)
  return START_UP[name] or name:match("^LD_") or name:match("^MALLOC_") or name:match("^CORRAL_")
    or name:match("^LUA_")
end

-- The absolute form of `p` given relative to the agent's working directory, or nil.
local function absolute(p, cwd)
  if p == "" or p:find("[%z\n\r]") then return nil end
  return p:sub(1, 1) == "/" and p or (cwd .. "/" .. p)
end

-- Whether resolved `path` lies in one of the boundary's directories.
local function in_dirs(path, boundary)
  for _, d in ipairs(boundary.dirs) do
    if core.path.is_beneath(path, d) then return true end
  end
  return false
end

-- A path that may not exist yet: its resolved parent (which must be a directory) and
-- its last component (never . or ..).
local function resolve_new(abs)
  local parent, base = abs:gsub("/+$", ""):match("^(.*)/([^/]+)$")
  if not parent or base == "." or base == ".." then return nil end
  local dir = core.path.resolve(parent == "" and "/" or parent)
  return dir and (dir == "/" and "/" or dir .. "/") .. base, dir
end

local PATH_CHECKS = {}

function PATH_CHECKS.dir(flag, abs, boundary)
  local r, err = core.path.resolve(abs)
  if not r then return refuse(flag, tostring(err)) end
  if not in_dirs(r, boundary) then
    return refuse(flag, r .. " is outside the agent's boundary (its --permit and --extra directories)")
  end
  return r
end

function PATH_CHECKS.storage(flag, abs, boundary)
  if core.fs.lstat(abs) then return PATH_CHECKS.dir(flag, abs, boundary) end
  local r, parent = resolve_new(abs)
  if not r then return refuse(flag, abs .. ": its parent directory does not exist") end
  if not in_dirs(parent, boundary) then
    return refuse(flag, r .. " is outside the agent's boundary (its --permit and --extra directories)")
  end
  return r
end

function PATH_CHECKS.file_read(flag, abs, boundary)
  local r, err = core.path.resolve_file(abs)
  if not r then return refuse(flag, tostring(err)) end
  local st = core.fs.lstat(r)
  if not st or st.type ~= "file" then return refuse(flag, r .. " is not a regular file") end
  for _, f in ipairs(boundary.files) do
    if f == r then return r end
  end
  if not in_dirs(r, boundary) then return refuse(flag, r .. " is outside the agent's boundary") end
  return r
end

function PATH_CHECKS.file_write(flag, abs, boundary)
  local r = core.path.resolve_file(abs)
  local parent
  if r then
    local st = core.fs.lstat(r)
    if not st or st.type ~= "file" then return refuse(flag, r .. " is not a regular file") end
    parent = r
  else
    r, parent = resolve_new(abs)
    if not r then return refuse(flag, abs .. ": its parent directory does not exist") end
  end
  if not in_dirs(parent, boundary) then
    return refuse(flag, r .. " is outside the agent's writable boundary (its --permit and directory --extra)")
  end
  return r
end

-- Each limit flag: how it parses, and the agent's limits it may not exceed.
local LIMITS = {
  memory = { parse = sandbox.parse_size, under = { memory = "its memory cgroup", as = "its ulimit -v" } },
  pids = { parse = sandbox.parse_integer, under = { pids = "its pids cgroup", nproc = "its ulimit -u" } },
  cpu = { parse = sandbox.parse_decimal, under = { cpu = "its cpu cgroup quota or online CPUs" } },
  nofile = { parse = sandbox.parse_integer, under = { nofile = "its ulimit -n" } },
  fsize = { parse = sandbox.parse_size, under = { fsize = "its ulimit -f" } },
}
-- Limits the agent's process carries that a tenant would not inherit: given when absent.
local INHERITED = { "nofile", "fsize" }

local function check_limit(name, v, agent)
  local l = LIMITS[name]
  local n = l.parse(v)
  if not n then return refuse("--" .. name, string.format("%q is not a valid value", v)) end
  for key, what in pairs(l.under) do
    local cap = agent[key] or math.huge
    if n > cap then
      return refuse("--" .. name, string.format("%s is larger than the agent's own limit (%s: %s)", v,
        math.tointeger(cap) or cap, what))
    end
  end
  return v
end

-- The session id operand: made by this broker (`own`), or new and within the cap.
local function check_session(spec, id, ctx)
  if not id or not id:match(ID_PATTERN) or #id > 63 then return refuse("ID", "missing or not a session id") end
  if spec.session == "own" and not ctx.sessions[id] then
    return refuse("ID", "no session " .. id .. " made through this broker (an agent reaches only its own)")
  end
  if spec.session == "new" and ctx.sessions[id] then return refuse("ID", id .. " exists already") end
  if spec.session == "new" and ctx.session_count >= ctx.max_sessions then
    return nil, string.format("at most %d live sessions per broker; remove one first (corral rm ID)",
      ctx.max_sessions), 1
  end
  return id
end

--- Checks a request and rebuilds its argv.
-- @tparam string sub the subcommand
-- @tparam {string,...} argv its words after the subcommand
-- @tparam table ctx `cwd` (resolved, inside the boundary), `boundary` (`dirs`, `files`:
--   resolved), `agent` (corral.broker.agent_limits), `sessions` (id set), `session_count`,
--   `max_sessions`
-- @treturn[1] table `{argv = {sub, ...}, env_names = {...}, session = id|nil}`
-- @return[2] nil
-- @treturn[2] string why, naming the flag
-- @treturn[2] integer the exit status to give (2: a refused argument)
function M.check(sub, argv, ctx)
  local spec = M.SUBCOMMANDS[sub]
  if not spec then return refuse(nil, "corral " .. tostring(sub) .. " is not brokered") end
  local kinds = type(spec.kinds) == "function" and spec.kinds() or spec.kinds
  local flags, rest, status = parse(argv, kinds, spec.short)
  if not flags then return nil, rest, status end
  local out, env_names, given = { sub }, {}, {}
  local session
  if spec.session then
    local why
    session, why, status = check_session(spec, table.remove(rest, 1), ctx)
    if not session then return nil, why, status end
    out[#out + 1] = session
  end
  for _, f in ipairs(flags) do
    local class, flag, v = spec.classes[f.name], "--" .. f.name, f.value
    given[f.name] = true
    if class == nil then return refuse(flag, "not granted through the broker") end
    if class == "mechanism" and v ~= "native" and v ~= "bwrap" then
      return refuse(flag, "only native or bwrap through the broker (a mechanism file is host code; oci's " ..
        "engine is reached outside the boundary)")
    elseif PATH_CHECKS[class] and not (class == "file_write" and v == "-") then
      local abs = absolute(v, ctx.cwd)
      if not abs then return refuse(flag, "not a path") end
      local r, why, st = PATH_CHECKS[class](flag, abs, ctx.boundary)
      if not r then return nil, why, st end
      v = r
    elseif class == "limit" then
      local ok, why, st = check_limit(f.name, v, ctx.agent)
      if not ok then return nil, why, st end
    elseif class == "env" then
      -- NAME alone: its value is taken from the agent's environment; NAME=VALUE as given
      local named = v:match("^[%a_][%w_]*$")
      if not named and not v:match("^[%a_][%w_]*=") then return refuse(flag, "takes NAME or NAME=VALUE") end
      -- `exec`'s client takes a name's value from its own environment: none that a
      -- process's start-up (the loader, libc) or corral reads
      if named and start_up_variable(v) then
        return refuse(flag, v .. " is read by the broker's own corral as it starts; not passed through the broker")
      end
      if named then env_names[#env_names + 1] = v end
    elseif class ~= "pass" and class ~= "mechanism" then
      return refuse(flag, class)
    end
    out[#out + 1] = v == true and flag or (flag .. "=" .. v)
  end
  if spec.kinds == run_kinds then
    for _, name in ipairs(INHERITED) do
      local cap = ctx.agent[name]
      if not given[name] and cap and cap ~= math.huge then out[#out + 1] = "--" .. name .. "=" .. cap end
    end
  end
  if #rest > 0 then
    out[#out + 1] = "--"
    table.move(rest, 1, #rest, #out + 1, out)
  end
  return { argv = out, env_names = env_names, session = session }
end

return M
