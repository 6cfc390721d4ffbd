--- The bookkeeping a mechanism written on the core's primitives keeps of its sandboxes:
-- a table by sandbox id of `{lock =, process =, status =}` (the storage lock, the
-- started process, "provisioned" | "running" | "stopped"). The status it reports and
-- the release of one sandbox, in one place for every such mechanism
-- (scripts/examples/primitives.lua, the conformance fixtures); the status is the
-- built-in mechanisms' too (corral.mechanism.lifecycle).
-- @module corral.mechanism.ledger
local M = {}

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
