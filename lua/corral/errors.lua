--- Structured errors: every policy refusal corral returns is built here.
--
-- A refusal is `nil, err`, `err` a table `{code =, capability? =, argument? =, detail =,
-- errno? =, detail_format? =}` with a `__tostring`; `detail_format`, when the detail names
-- the argument, is the detail with `%s` in its place, so that a caller that renames the
-- argument (`limits.memory` is `--memory`) rebuilds the detail, and never rewrites the
-- text of a value it quotes. The stable codes: `cannot_enforce` (this host cannot
-- build a protection the call requires; never answered with a weaker result),
-- `resource` (a resource ran out for a moment, corral.transient: nothing ran, and no
-- protection is missing; its `resource` field says what ran out), `invalid_argument`,
-- `refused_env`.
-- @module corral.errors
local transient = require "corral.transient"

local M = {}

local Error = {}
Error.__index = Error

function Error.__tostring(e)
  if e.code == "resource" then
    return "setup failed: " .. e.detail .. transient.suffix(e.resource)
  end
  local what = e.capability or e.argument
  if what then
    return string.format("%s: %s: %s", e.code, what, e.detail)
  end
  return string.format("%s: %s", e.code, e.detail)
end

--- The stable error codes.
M.codes = {
  cannot_enforce = "cannot_enforce",
  invalid_argument = "invalid_argument",
  resource = "resource",
  refused_env = "refused_env",
}

--- Builds an error of the given code.
-- @tparam string code one of `M.codes`
-- @tparam table fields `capability`, `argument`, `detail`
-- @treturn table
function M.new(code, fields)
  assert(M.codes[code], "unknown error code " .. tostring(code))
  local e = { code = code }
  for k, v in pairs(fields or {}) do e[k] = v end
  e.detail = e.detail or ""
  return setmetatable(e, Error)
end

--- A resource that ran out for a moment while building what `capability` needs.
-- @tparam string|nil capability
-- @tparam string detail what was tried and what was seen
-- @tparam string what what ran out (corral.transient)
-- @tparam[opt] integer errno
-- @treturn table
function M.resource(capability, detail, what, errno)
  return M.new("resource", { capability = capability, detail = detail, resource = what, errno = errno })
end

--- A protection this host cannot build; a `resource` error instead when `errno` or
-- the detail's system text is a transient resource failure (corral.transient).
-- @tparam string capability
-- @tparam string detail what was tried and what was seen
-- @tparam[opt] integer errno the system error behind it
-- @treturn table
function M.cannot_enforce(capability, detail, errno)
  local what = transient.of(errno) or transient.of(detail)
  if what then return M.resource(capability, detail, what, errno) end
  return M.new("cannot_enforce", { capability = capability, detail = detail, errno = errno })
end

--- A malformed argument.
-- @tparam string argument
-- @tparam string detail
-- @tparam[opt] integer errno the system error behind it
-- @treturn table
function M.invalid_argument(argument, detail, errno)
  return M.new("invalid_argument", { argument = argument, detail = detail, errno = errno })
end

--- Whether `err` is a corral error (of `code`, when given).
-- @param err any value
-- @tparam[opt] string code
-- @treturn boolean
function M.is(err, code)
  return getmetatable(err) == Error and (code == nil or err.code == code)
end

return M
