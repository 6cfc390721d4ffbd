--- corral's own state on the host: the directory that holds the host key (root's
-- /var/lib/corral, anyone else's $XDG_STATE_HOME/corral, or $CORRAL_STATE_DIR), and the
-- rule that no sandbox, step or confined process is ever handed a directory that holds
-- the key: a tenant that read it could sign receipts of runs that never happened.
-- A leaf: every module that grants a path asks it.
-- @module corral.state_dir
local core = require "corral.core"

local M = {}

-- Read from the environment once, when first asked: `corral run` clears its own
-- environment before the mechanism loads, and asks first (corral.run).
local dir

--- The caller's state directory.
-- @treturn string
function M.dir()
  if dir then return dir end
  local env = core.proc.environ()
  if env.CORRAL_STATE_DIR and env.CORRAL_STATE_DIR ~= "" then
    dir = env.CORRAL_STATE_DIR
  elseif core.proc.geteuid() == 0 then
    dir = "/var/lib/corral"
  elseif env.XDG_STATE_HOME and env.XDG_STATE_HOME:sub(1, 1) == "/" then
    dir = env.XDG_STATE_HOME .. "/corral"
  else
    dir = (env.HOME or "/nonexistent") .. "/.local/state/corral"
  end
  return dir
end

--- The private key's path.
-- @treturn string
function M.key_path()
  return M.dir() .. "/key"
end

-- A key's directory as the kernel resolves it, when it exists; its text otherwise.
local function resolved_key(path)
  local dir, name = path:match("^(.*)/([^/]+)$")
  local real = dir and core.path.resolve(dir ~= "" and dir or "/")
  return real and ((real == "/" and "" or real) .. "/" .. name) or path
end

--- Why `path` (resolved) may not be handed to a sandbox, a step or a confined process:
-- it is, or is a directory that holds, the caller's host key or root's; nil otherwise.
-- @tparam string path
-- @treturn string|nil
function M.refusal(path)
  for _, key in ipairs({ M.key_path(), "/var/lib/corral/key" }) do
    local k = resolved_key(key)
    if core.path.is_beneath(k, path) then
      return string.format("holds corral's host key (%s), which signs receipts: no sandbox, step or " ..
        "confined process is handed it", k)
    end
  end
  return nil
end

return M
