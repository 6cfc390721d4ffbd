--- Structured errors: every policy refusal corral returns is built here.
--
-- A refusal is `nil, err` where `err` is a table `{code =, capability? =, argument? =,
-- detail =, errno? =}` with a `__tostring`; `errno` is kept when a system call refused.
-- The codes are stable and documented:
--
-- * `cannot_enforce` — this host cannot build a protection the call requires
--   (`capability` names it). Never answered with a weaker result instead.
-- * `invalid_argument` — an argument is malformed (`argument` names it).
-- * `refused_env` — an environment variable was refused for a tenant (`argument`).
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
-- @tparam table fields extra fields (`capability`, `argument`, `detail`)
-- @treturn table the error
function M.new(code, fields)
  assert(M.codes[code], "unknown error code " .. tostring(code))
  local e = { code = code }
  for k, v in pairs(fields or {}) do e[k] = v end
  e.detail = e.detail or ""
  return setmetatable(e, Error)
end

--- A protection this host cannot build.
-- @tparam string capability the capability that is missing
-- @tparam string detail what was tried and what was seen
-- @tparam[opt] integer errno the system error behind it, when a system call refused
-- @treturn table the error
function M.cannot_enforce(capability, detail, errno)
  return M.new("cannot_enforce", { capability = capability, detail = detail, errno = errno })
end

--- A malformed argument.
-- @tparam string argument the argument's name
-- @tparam string detail what is wrong with it
-- @tparam[opt] integer errno the system error behind it (a file that cannot be read)
-- @treturn table the error
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
