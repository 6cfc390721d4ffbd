--- Running helper commands from Lua: quoting and exit statuses, one implementation.
-- @module corral.shell
local M = {}

--- Quotes one word for /bin/sh.
-- @tparam string s
-- @treturn string
function M.quote(s)
  s = tostring(s)
  if s:match("^[%w@%%+=:,./_-]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

--- Joins a list of words into one quoted command line.
-- @tparam {string,...} argv
-- @treturn string
function M.join(argv)
  local out = {}
  for i, a in ipairs(argv) do out[i] = M.quote(a) end
  return table.concat(out, " ")
end

--- Runs argv, capturing stdout and stderr together.
-- @tparam {string,...} argv
-- @treturn string output
-- @treturn integer exit status (128+signal when killed)
function M.capture(argv)
  local p = assert(io.popen(M.join(argv) .. " 2>&1", "r"))
  local out = p:read("a")
  local _, how, code = p:close()
  if how == "signal" then code = 128 + code end
  return out, code
end

return M
