--- A mechanism whose every command is exec'd into a live sandbox, as `corral exec` runs
-- it (corral.session.exec: `join` onto the sandbox's waiting init): native's sandbox,
-- provisioned with the init a keeper starts, then each `start` and `exec` joined into
-- it. `corral conformance --session` runs the suite through it, so the census it prints
-- is that of exec'd processes.
-- @module corral.mechanism.session
local core = require "corral.core"
local errors = require "corral.errors"
local lifecycle = require "corral.mechanism.lifecycle"
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
  if type(base.join) ~= "function" or not (base.name == "native" or base.name == "bwrap") then
    return nil, errors.invalid_argument("mechanism", "exec into a live sandbox is built for native and bwrap only")
  end
  local running = {} -- sandbox id → the process `start` joined in
  local inits = {} -- sandbox id → the pid of the init's own command
  local mech = setmetatable({ name = base.name .. "+exec" }, { __index = base })

  -- Ends every process of the sandbox but its waiting init, as a run's stop ends every
  -- process of its sandbox: what a command left in the background (a session keeps it
  -- for the next exec) would otherwise hold the next command's limits.
  local function stop_all(sb)
    local p = running[sb.id]
    if p then
      lifecycle.kill_tree(p)
      p:close()
    end
    running[sb.id] = nil
    local init = base.process_of(sb)
    if not init then return end
    local keep = inits[sb.id]
    for _ = 1, 2 do
      for _, pid in ipairs(proctree.descendants(init:pid())) do
        if not keep[pid] then core.proc.kill(pid, 9) end
      end
    end
  end

  function mech.provision(sb)
    local ok, err = base.provision(sb)
    if not ok then return nil, err end
    ok, err = base.start(sb, M.INIT)
    if not ok then
      base.destroy(sb)
      return nil, err
    end
    -- the init's own processes (native: its command; bwrap: bubblewrap and its command),
    -- once a helper-built sandbox is ready: what stop leaves
    local deadline = core.clock.monotime() + 5
    while base.root_pid and not base.root_pid(sb) and core.clock.monotime() < deadline do core.io.poll({}, 0.005) end
    local keep = {}
    for _, pid in ipairs(proctree.descendants(base.process_of(sb):pid())) do keep[pid] = true end
    inits[sb.id] = keep
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
    stop_all(sb)
    return true
  end

  function mech.destroy(sb)
    stop_all(sb)
    inits[sb.id] = nil
    return base.destroy(sb)
  end

  return mech
end

return M
