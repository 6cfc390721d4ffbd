--- Fuzz target: what a client sends a run's control socket (every input is the bytes of
-- one connection, split into lines as the server splits them), answered by
-- corral.control with a run's ops (corral.control_ops) for a sandbox with no egress
-- plane. It must answer each line, never raise, with one JSON line
-- `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
local S = require "support"
local control = require "corral.control"
local control_ops = require "corral.control_ops"
local json = require "corral.json"

local mech = { name = "fuzz", cgroup_paths = function() return {} end }
local ops = control_ops.for_run(mech, { id = "fuzz-1", limits = { memory = 1 << 20 } }, { argv = { "true" } })

local M = {}

--- Checks one answer line as a client reads it; the decoded answer.
function M.answer_ok(text)
  S.check(type(text) == "string" and text:sub(-1) == "\n" and not text:sub(1, -2):find("\n", 1, true),
    "an answer is one line")
  local a = json.decode(text)
  S.check(type(a) == "table" and type(a.ok) == "boolean", "an answer has ok: " .. text)
  if not a.ok then S.check(type(a.error) == "string", "a refusal says why: " .. text) end
  return a
end

function M.run(data, the_ops, client_of)
  for _, line in ipairs(S.lines(data)) do
    local client = client_of and client_of(line)
    local text = S.no_raise("control.answer_line", control.answer_line, the_ops, line, client)
    if text or not client then M.answer_ok(text) end
  end
end

return setmetatable(M, { __call = function(_, data) return M.run(data, ops) end })
