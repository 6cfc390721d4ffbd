--- Structured errors: every policy refusal corral returns is built here.
--
-- A refusal is `nil, err`, `err` a table `{code =, capability? =, argument? =, detail =,
-- errno? =, detail_format? =}` with a `__tostring`; `detail_format`, when the detail names
-- the argument, is the detail with `%s` in its place, so that a caller that renames the
-- argument (`limits.memory` is `--memory`) rebuilds the detail, and never rewrites the
-- text of a value it quotes. The stable codes: `cannot_enforce` (this host cannot
-- build a protection the call requires; never answered with a weaker result),
-- `invalid_argument`, `refused_env`.
-- @module corral.errors
local M = {}

local Error = {}
Error.__index = Error

function Error.__tostring(e)
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

--- A protection this host cannot build.
-- @tparam string capability
-- @tparam string detail what was tried and what was seen
-- @tparam[opt] integer errno the system error behind it
-- @treturn table
function M.cannot_enforce(capability, detail, errno)
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
