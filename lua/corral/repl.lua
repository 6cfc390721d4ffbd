--- Diagnostics for the REPL: what this host process is serving right now.
--
--     corral> corral.sandboxes()        -- sandboxes with an egress plane, and live connections
--     corral> corral.ruleset("alice")   -- the nftables table in alice's netns, as the kernel has it
--     corral> corral.decisions(20)      -- the last decisions (DNS answers, connects, closes)
--     corral> conformance("native")     -- the conformance report (corral.conformance.run)
-- @module corral.repl
local core = require "corral.core"
local shell = require "corral.shell"

local M = {}

local function planes()
  return require("corral.egress.loop").planes()
end

--- The sandboxes this process serves, with their live relayed connections.
-- @treturn {table,...} `{id =, connections =, dns_port =, acceptor_port =, service =}`
function M.sandboxes()
  local loop = require("corral.egress.loop").get()
  local out = {}
  for _, p in ipairs(planes()) do
    out[#out + 1] = { id = p.id, connections = loop.relay:count(p.id), dns_port = p.dns_port,
                      acceptor_port = p.acceptor_port, service = p.service_addr }
  end
  table.sort(out, function(a, b) return a.id < b.id end)
  return out
end

--- The ruleset in a sandbox's network namespace, read back from the kernel (`nft`).
-- @tparam string id
-- @treturn string the ruleset text
function M.ruleset(id)
  for _, p in ipairs(planes()) do
    if p.id == id and p.netns then
      local fd = p.netns:fileno()
      local out = shell.capture({ "nsenter", "--net=/proc/" .. core.proc.getpid() .. "/fd/" .. fd, "nft", "list",
        "ruleset" })
      return out
    end
  end
  return nil, "no sandbox " .. tostring(id) .. " with an egress plane in this process"
end

--- Runs one step at the highest tier this host earns and returns its receipt (see
-- corral.tier.step): `corral.step{"/bin/echo", "hi", grants = {read = {"/srv"}}}`, or
-- `corral.step{s2 = "return 1 + 1"}` for Lua at S2.
-- @tparam table spec
-- @treturn table the receipt (its `result` holds the step's result)
-- @return[2] nil
-- @treturn[2] table the refusal
function M.step(spec)
  local tier = require "corral.tier"
  local result, rec
  if type(spec) == "table" and spec.s2 then
    result, rec = tier.s2({ code = spec.s2, grants = spec.grants, fuel = spec.fuel, memory = spec.memory })
  else
    result, rec = tier.step(spec)
  end
  if not result then return nil, rec end
  rec.result = result
  return rec
end

--- The most recent decisions, newest last.
-- @tparam[opt=20] integer n
-- @treturn {table,...}
function M.decisions(n)
  return require("corral.egress.events").recent(n or 20)
end

--- Runs the conformance suite (see corral.conformance.run) and returns its report.
function M.conformance(...)
  return require("corral.conformance").run(...)
end

return M
