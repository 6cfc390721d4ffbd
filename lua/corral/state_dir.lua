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
local dir, home

--- The caller's state directory; for the default under $HOME, also $HOME (which must
-- exist already: corral makes the directories below it, never it) and "HOME".
-- @treturn string
-- @treturn[opt] string
-- @treturn[opt] string
function M.dir()
  if not dir then
    local env = core.proc.environ()
    if env.CORRAL_STATE_DIR and env.CORRAL_STATE_DIR ~= "" then
      dir = env.CORRAL_STATE_DIR
    elseif core.proc.geteuid() == 0 then
      dir = "/var/lib/corral"
    elseif env.XDG_STATE_HOME and env.XDG_STATE_HOME:sub(1, 1) == "/" then
      dir = env.XDG_STATE_HOME .. "/corral"
    else
      home = env.HOME or "/nonexistent"
      dir = home .. "/.local/state/corral"
    end
  end
  if home then return dir, home, "HOME" end
  return dir
end

--- The private key's path.
-- @treturn string
function M.key_path()
  return M.dir() .. "/key"
end

-- A key's directory as the kernel resolves it, when it exists; its text otherwise.
local function resolved_key(path)
  local parent, name = path:match("^(.*)/([^/]+)$")
  local real = parent and core.path.resolve(parent ~= "" and parent or "/")
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
