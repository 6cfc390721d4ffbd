--- A mechanism whose every command is exec'd into a live sandbox, as `corral exec` runs
-- it (corral.session.exec: `join` onto the sandbox's waiting init): native's sandbox,
-- provisioned with the init a keeper starts, then each `start` and `exec` joined into
-- it. `corral conformance --session` runs the suite through it, so the census it prints
-- is that of exec'd processes.
-- @module corral.mechanism.session
local errors = require "corral.errors"
local proctree = require "corral.proctree"

local M = {}

--- The waiting init (corral.session.keeper's).
M.INIT = { "sleep", "infinity" }

--- Wraps a mechanism that offers `join` (native).
-- @tparam table base
-- @treturn[1] table the mechanism
-- @return[2] nil
-- @treturn[2] table invalid_argument when base cannot join a running sandbox
function M.wrap(base)
  if type(base.join) ~= "function" or base.name ~= "native" then
    return nil, errors.invalid_argument("mechanism", "exec into a live sandbox is built for native only")
  end
  local running = {} -- sandbox id → the process `start` joined in
  local mech = setmetatable({ name = base.name .. "+exec" }, { __index = base })

  -- Kills a joined process and what is still beneath it: it is no pid 1, so its end
  -- does not end what it started (corral.session.exec does the same).
  local function kill_tree(proc)
    for _ = 1, 2 do
      for _, p in ipairs(proctree.descendants(proc:pid())) do require("corral.core").proc.kill(p, 9) end
    end
    proc:close()
  end

  function mech.provision(sb)
    local ok, err = base.provision(sb)
    if not ok then return nil, err end
    ok, err = base.start(sb, M.INIT)
    if not ok then
      base.destroy(sb)
      return nil, err
    end
    return true
  end

  function mech.start(sb, argv, opts)
    local p = running[sb.id]
    if p and p:running() then return nil, errors.invalid_argument("sandbox", sb.id .. " is already running") end
    local proc, err, failed = base.join(sb, argv, opts)
    if failed then return nil, errors.invalid_argument("argv", failed.error) end
    if not proc then return nil, err end
    running[sb.id] = proc
    return true
  end

  function mech.status(sb)
    local s = base.status(sb)
    if s ~= "running" then return s end
    local p = running[sb.id]
    if not p then return "provisioned" end
    return p:running() and "running" or "stopped"
  end

  function mech.stop(sb)
    local p = running[sb.id]
    if p then kill_tree(p) end
    running[sb.id] = nil
    return true
  end

  function mech.destroy(sb)
    mech.stop(sb)
    return base.destroy(sb)
  end

  return mech
end

return M
