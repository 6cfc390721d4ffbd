--- corral: process confinement with a C core and Lua policy.
--
-- Two entry points share no option: `confine` (a *trusted* control-plane process) and
-- the tenant calls (`sandbox`, `provision`, `start`, `exec`, …).
-- @module corral
local M = {}

M._VERSION = "corral 0.1"

M.core = require "corral.core"
M.errors = require "corral.errors"

--- Confines a trusted control-plane process to one directory (see corral.confinement).
-- @function confine
M.confine = function(...) return require("corral.confinement").confine(...) end

--- The capability probe (see corral.probe).
-- @function probe
M.probe = function(...) return require("corral.probe").probe(...) end

--- Validates a tenant sandbox description (see corral.sandbox).
-- @function sandbox
M.sandbox = function(...) return require("corral.sandbox").new(...) end

--- Egress allowlists: allow/revoke at run time, events (see corral.egress).
M.egress = setmetatable({}, { __index = function(_, k) return require("corral.egress")[k] end })

--- The operator's verbs, the REPL's helpers of the same names (see corral.operator):
-- sandboxes(), ruleset(id), decisions(n), step(spec).
-- @function sandboxes
M.sandboxes = function(...) return require("corral.operator").sandboxes(...) end
-- @function ruleset
M.ruleset = function(...) return require("corral.operator").ruleset(...) end
-- @function decisions
M.decisions = function(...) return require("corral.operator").decisions(...) end
-- @function step
M.step = function(...) return require("corral.operator").step(...) end

--- The mechanism behaviour: load, check, gate (see corral.mechanism).
M.mechanism = setmetatable({}, { __index = function(_, k) return require("corral.mechanism")[k] end })

local function mech_of(m)
  return require("corral.mechanism").load(m)
end

-- Every host call goes through corral.mechanism.host_call: the gate before the mechanism
-- builds anything, and each result checked against the contract.
local function host_call(name)
  return function(m, sb, ...)
    return require("corral.mechanism").host_call(m, name, sb, ...)
  end
end

--- Provisions a sandbox under a mechanism (gated).
-- @function provision
M.provision = host_call("provision")
--- Starts a sandbox's long-running process (gated).
-- @function start
M.start = host_call("start")
--- Runs a command in a sandbox to completion (gated).
-- @function exec
M.exec = host_call("exec")
--- Stops a sandbox's processes.
-- @function stop
M.stop = host_call("stop")
--- Destroys a sandbox (stop, then release everything but its storage).
-- @function destroy
M.destroy = host_call("destroy")
--- A sandbox's status.
-- @function status
M.status = host_call("status")

--- Where a sandbox is reachable: `true, "host:port"`, or `true, nil` (never an error).
-- @function address
function M.address(m, sb)
  local mech, err = mech_of(m)
  if not mech then return nil, err end
  if not mech.address then return true, nil end
  local ok, found, addr = pcall(mech.address, sb)
  if not ok or not found then return true, nil end
  return true, addr
end

--- The path of the published contract (docs/boundary.md): in the source tree, under an
-- install prefix (share/corral/boundary.md) or in a LuaRocks tree.
-- @treturn string path, or nil and where it was looked for
function M.boundary_path()
  local here = debug.getinfo(1, "S").source:match("^@(.*)/corral/init%.lua$") or "."
  local tries = { here .. "/../docs/boundary.md", here .. "/../../corral/boundary.md" }
  local rocks = here .. "/../../../lib/luarocks/rocks-5.4/corral"
  for _, v in ipairs(M.core.fs.listdir(rocks) or {}) do tries[#tries + 1] = rocks .. "/" .. v .. "/docs/boundary.md" end
  for _, p in ipairs(tries) do
    local f = io.open(p)
    if f then
      f:close()
      return M.core.path.resolve(p) or p
    end
  end
  return nil, "boundary.md not found (looked in " .. table.concat(tries, ", ") .. ")"
end

--- Runs the conformance suite against a mechanism (see corral.conformance.run).
-- @function conformance
M.conformance = function(...) return require("corral.conformance").run(...) end

return M
