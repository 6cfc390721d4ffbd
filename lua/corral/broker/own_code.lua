--- corral's own code as a broker runs it outside the boundary: the executable, the
-- front, the confinement wrapper and the OCI runtime beside it, its compiled module
-- twins and every directory its module search paths name. An agent that could write one of them inside its boundary
-- would have the broker run its code, unconfined; so those inside are bound read-only
-- (confine's read-only paths, which only a namespace layer holds) or the broker refuses
-- to start. And the broker's `corral` searches absolute directories only: the default
-- `./?.lua` would find modules in the agent's working directory.
-- @module corral.broker.own_code
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

-- The directory of each absolute template of a search path ("/a/b/?.lua" → "/a/b").
local function template_dirs(path, out)
  for t in path:gmatch("[^;]+") do
    local dir = t:sub(1, 1) == "/" and t:match("^(.-)/[^/]*%?")
    if dir and dir ~= "" then out[#out + 1] = dir end
  end
end

--- The existing paths of corral's own code, resolved, without repeats.
-- @treturn {string,...}
function M.paths()
  local raw = {}
  local host = core.proc.host_executable()
  if host then
    raw[#raw + 1] = host
    raw[#raw + 1] = require("corral.confine_wrapper").beside(host)
    local exedir = host:match("^(.*)/[^/]*$") or "/"
    raw[#raw + 1] = exedir .. "/luac"
    -- the front (`corral`, core/front), which the operator runs and which hands over to it
    raw[#raw + 1] = exedir .. "/corral"
    -- the OCI runtime beside it: an engine the operator pointed at it runs it outside too
    raw[#raw + 1] = exedir .. "/corral-runtime"
    raw[#raw + 1] = (exedir:match("^(.*)/[^/]*$") or "") .. "/lib/lua/5.4/corral/luac"
  end
  template_dirs(package.path, raw)
  template_dirs(package.cpath, raw)
  local out, seen = {}, {}
  for _, p in ipairs(raw) do
    local r = core.path.resolve(p)
    if r and not seen[r] and core.fs.lstat(r) then
      seen[r] = true
      out[#out + 1] = r
    end
  end
  return out
end

--- The module search paths of the broker's `corral`: absolute entries only.
-- @treturn {string,...} `LUA_PATH_5_4=…` and `LUA_CPATH_5_4=…`
function M.search_env()
  local function absolute(path)
    local keep = {}
    for t in path:gmatch("[^;]+") do
      if t:sub(1, 1) == "/" then keep[#keep + 1] = t end
    end
    return table.concat(keep, ";")
  end
  return { "LUA_PATH_5_4=" .. absolute(package.path), "LUA_CPATH_5_4=" .. absolute(package.cpath) }
end

--- The code paths inside the boundary, to be bound read-only.
-- @tparam {string,...} roots the boundary's directories (`--permit`, each directory
--   `--extra`), as given
-- @tparam {string,...}|nil layers the layers the spec holds
-- @treturn {string,...} the paths to add to `--read-only`; or nil and the refusal
--   (invalid_argument: a boundary directory that is code itself; cannot_enforce: no
--   namespace layer to hold them)
function M.read_only(roots, layers)
  local dirs = {}
  for _, r in ipairs(roots) do
    local d = core.path.resolve(r)
    local st = d and core.fs.lstat(d)
    if st and st.type == "dir" then dirs[#dirs + 1] = d end
  end
  local inside = {}
  for _, p in ipairs(M.paths()) do
    for _, d in ipairs(dirs) do
      if p == d or core.path.is_beneath(d, p) then
        return nil, errors.invalid_argument("--broker", string.format("%s holds corral's own code (%s), which " ..
          "the broker runs outside the boundary: it cannot stay writable; grant a directory beside it", d, p))
      end
      if core.path.is_beneath(p, d) then
        inside[#inside + 1] = p
        break
      end
    end
  end
  if #inside == 0 then return inside end
  local held = false
  for _, l in ipairs(layers or {}) do held = held or l == "ns" or l == "bwrap" end
  if not held then
    return nil, errors.cannot_enforce("--broker", inside[1] .. " (corral's own code, which the broker runs " ..
      "outside the boundary) lies inside it, and only a namespace layer (ns, bwrap) can keep it read-only " ..
      "there; Landlock alone cannot: move the boundary off it")
  end
  return inside
end

return M
