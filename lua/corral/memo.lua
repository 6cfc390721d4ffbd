--- A pure function's answers remembered by its one argument, at most `max` of them, then
-- all forgotten at once: bounded memory whatever a tenant sends, and no bookkeeping on a
-- hit. For what the egress path asks again of the same few values on every request
-- (a hostname's normal form, an address's logged text).
-- @module corral.memo
local M = {}

--- `fn` remembered: the returned function answers as `fn(arg)` (its first two values).
-- @tparam function fn pure, one argument
-- @tparam integer max how many answers are kept before all are forgotten
-- @treturn function
function M.bounded(fn, max)
  local kept, n = {}, 0
  return function(arg)
    local m = kept[arg]
    if not m then
      local a, b = fn(arg)
      m = { a, b }
      if n >= max then kept, n = {}, 0 end
      kept[arg], n = m, n + 1
    end
    return m[1], m[2]
  end
end

return M
