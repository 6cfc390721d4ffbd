--- Work the egress loop does at the end of every turn, subscribed by the modules that
-- need it (the event log's rate limiters), so that the loop neither loads them nor looks
-- for them: a plain run that never logs pays nothing.
-- @module corral.egress.turns
local M = {}

local subscribers = {}

--- Calls `fn()` at the end of every turn of the loop, from now on. `fn` must not raise.
-- @tparam function fn
function M.subscribe(fn)
  subscribers[#subscribers + 1] = fn
end

--- Runs every subscriber once; the loop calls it at the end of each turn.
function M.run()
  for i = 1, #subscribers do subscribers[i]() end
end

return M
