--- An example mechanism that wraps native with a policy: only the commands on a list
-- may run, and every tenant gets a fixed variable naming the policy.
--
-- `corral run --mechanism scripts/examples/command_policy.lua -- sh -c 'echo $CORRAL_POLICY'`
--
-- Everything else is native's: its callbacks are reused as they are, so it constructs
-- and requires exactly what native does (its capabilities lists are native's own).
-- The policy looks at argv[1] only: a listed shell runs whatever its script says.
local native = require "corral.mechanism.native"
local errors = require "corral.errors"

local M = { name = "command_policy" }

--- The commands (argv[1], by their last path component) that may run.
M.ALLOWED = { sh = true, cat = true, ls = true, echo = true, ["true"] = true, env = true }

--- The variable every tenant of this mechanism is given (it passes corral.hardening).
M.POLICY_ENV = { CORRAL_POLICY = "command_policy" }

for k, v in pairs(native) do M[k] = v end
M.name = "command_policy"

-- The sandbox as native sees it: the host's environment plus the policy's variable.
local function with_policy(sb)
  local copy = {}
  for k, v in pairs(sb) do copy[k] = v end
  copy.env = {}
  for k, v in pairs(sb.env) do copy.env[k] = v end
  for k, v in pairs(M.POLICY_ENV) do copy.env[k] = v end
  return copy
end

local function refused(argv)
  local cmd = type(argv) == "table" and type(argv[1]) == "string" and argv[1]:match("[^/]*$")
  if not cmd or not M.ALLOWED[cmd] then
    return errors.invalid_argument("argv", string.format("%s is not on command_policy's list (%s)",
      tostring(argv and argv[1]), "sh, cat, ls, echo, true, env"))
  end
end

--- Runs argv to completion under native, when argv[1] is on the list.
function M.exec(sb, argv, opts)
  local err = refused(argv)
  if err then return nil, err end
  return native.exec(with_policy(sb), argv, opts)
end

--- Starts argv under native, when argv[1] is on the list.
function M.start(sb, argv, opts)
  local err = refused(argv)
  if err then return nil, err end
  return native.start(with_policy(sb), argv, opts)
end

return M
