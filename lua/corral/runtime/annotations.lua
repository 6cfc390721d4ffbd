--- A container's `corral.dev/*` annotations (its bundle's config.json) read into the
-- `network` table a plane is built from, with the grammar of `corral run`'s flags
-- (`corral.egress.run_options`): `corral.dev/allow` is `--allow` (entries comma- or
-- newline-separated), `internal`, `resolve`, `sni`, `idle`, `log-json`, `learn` the flags
-- of those names. Each refusal names its annotation. An unknown `corral.dev/` key is
-- refused too: a misspelt `corral.dev/alow` would otherwise start a container with no
-- filter at all.
--
-- `log-json` and `learn` name a file, never a path: the pod's author chooses the name,
-- the node's operator the directory (`CORRAL_RUNTIME_LOG_DIR`, default
-- /var/log/corral-runtime), so an annotation cannot write anywhere else on the node.
-- @module corral.runtime.annotations
local errors = require "corral.errors"
local run_options = require "corral.egress.run_options"

local M = {}

M.PREFIX = "corral.dev/"

-- annotation → how its value is read: a list of entries, or one value
local KINDS = { allow = "list", internal = "list", resolve = "list", sni = "one", idle = "one",
  ["log-json"] = "file", learn = "file" }

--- Keys reserved for what corral does not do yet: refused, never ignored.
M.RESERVED = { secret = "secrets are not yet supported by corral-runtime" }

--- The node's directory for `log-json` and `learn` files.
function M.log_dir()
  return os.getenv("CORRAL_RUNTIME_LOG_DIR") or "/var/log/corral-runtime"
end

local function invalid(key, detail)
  return nil, errors.invalid_argument(M.PREFIX .. key, detail)
end

local function split(text)
  local out = {}
  for item in text:gmatch("[^,\n]+") do
    item = item:match("^%s*(.-)%s*$")
    if item ~= "" then out[#out + 1] = item end
  end
  return out
end

-- A refusal of run_options names a flag: here, the annotation it came from.
local function renamed(err)
  if not errors.is(err, "invalid_argument") then return err end
  local function ann(flag) return KINDS[flag] and (M.PREFIX .. flag) or ("--" .. flag) end
  local arg = tostring(err.argument):gsub("^%-%-([%w-]+)$", ann)
  local detail = tostring(err.detail):gsub("%-%-allow%-file FILE", M.PREFIX .. "allow"):gsub("%-%-([%a][%w-]*)", ann)
  return errors.invalid_argument(arg, detail)
end

--- The options `corral.egress.run_options` reads, from a config's annotations.
-- @tparam table annotations name → value (the config's `annotations`, or nil)
-- @treturn[1] table opts (empty when no `corral.dev/` key is there)
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the annotation
function M.options(annotations)
  local opts = {}
  for name, value in pairs(annotations or {}) do
    local key = type(name) == "string" and name:sub(1, #M.PREFIX) == M.PREFIX and name:sub(#M.PREFIX + 1)
    if key then
      if M.RESERVED[key] then return invalid(key, M.RESERVED[key]) end
      local kind = KINDS[key]
      if not kind then return invalid(key, "not an annotation corral-runtime knows (corral.dev/allow, internal, "
        .. "resolve, sni, idle, log-json, learn)") end
      if type(value) ~= "string" then return invalid(key, "must be a string") end
      if kind == "list" then
        opts[key] = split(value)
        if #opts[key] == 0 then return invalid(key, "empty: give at least one entry") end
      elseif kind == "file" then
        if not value:match("^[%w_][%w._-]*$") or #value > 200 then
          return invalid(key, '"' .. value .. '": a file name (letters, digits, ".", "_", "-"), written in '
            .. M.log_dir() .. "; never a path")
        end
        opts[key] = M.log_dir() .. "/" .. value
      else
        opts[key] = value
      end
    end
  end
  return opts
end

--- The `network` table of a container, or nil when it asks for none.
-- @tparam table annotations
-- @treturn[1] table|false network (false: no `corral.dev/` annotation is there)
-- @treturn[1] table opts
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the annotation
function M.network(annotations)
  local opts, err = M.options(annotations)
  if not opts then return nil, err end
  if next(opts) == nil then return false, opts end
  local network
  network, err = run_options.network(opts)
  if err then return nil, renamed(err) end
  local ok
  ok, err = run_options.combination(network, opts)
  if not ok then return nil, renamed(err) end
  network, err = run_options.apply(network, opts)
  if err then return nil, renamed(err) end
  return network, opts
end

return M
