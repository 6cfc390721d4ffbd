--- The bookkeeping a mechanism written on the core's primitives keeps of its sandboxes:
-- a table by sandbox id of `{lock =, process =, status =}` (the storage lock, the
-- started process, "provisioned" | "running" | "stopped"). The status it reports and
-- the release of one sandbox, in one place for every such mechanism
-- (scripts/examples/primitives.lua, the conformance fixtures); the status is the
-- built-in mechanisms' too (corral.mechanism.lifecycle).
-- @module corral.mechanism.ledger
local errors = require "corral.errors"

local M = {}

--- Starts argv as a provisioned sandbox's long-running process through `spawn(sb, argv,
-- opts)` (which answers the process, or nil and an error, or nil, nil and a failed
-- start's `{error =}`); refused when the sandbox is not provisioned or already runs one.
-- @treturn true, or nil and invalid_argument
function M.start(state, sb, spawn, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  if st.process and st.process:running() then return nil, errors.invalid_argument("sandbox", "already running") end
  local proc, err, failed = spawn(sb, argv, opts)
  if failed then return nil, errors.invalid_argument("argv", failed.error) end
  if not proc then return nil, err end
  st.process, st.status = proc, "running"
  return true
end

--- Ends a sandbox's started process with `kill(process)` and marks it stopped.
-- @treturn true
function M.stop(state, sb, kill)
  local st = state[sb.id]
  if st and st.process then
    kill(st.process)
    st.process, st.status = nil, "stopped"
  end
  return true
end

--- A sandbox's status: "absent" | "provisioned" | "running" | "stopped" (a started
-- process that has ended makes it "stopped").
-- @tparam table state the mechanism's sandboxes by id
-- @tparam table sb
-- @treturn string
function M.status(state, sb)
  local st = state[sb.id]
  if not st then return "absent" end
  if st.process and not st.process:running() then st.status = "stopped" end
  return st.status
end

--- Releases a sandbox: `stop(sb)`, then its storage lock closed and its entry dropped.
-- @tparam table state the mechanism's sandboxes by id
-- @tparam table sb
-- @tparam function stop the mechanism's stop
-- @treturn boolean whether the sandbox was held (false: nothing to release)
function M.release(state, sb, stop)
  local st = state[sb.id]
  if not st then return false end
  stop(sb)
  st.lock:close()
  state[sb.id] = nil
  return true
end

return M
