--- The capability probe: each capability is established by doing it.
--
-- A probe runs a control that must succeed and then the breach that must be denied,
-- under the same set-up, in the same run (DESIGN invariant 2: a set-up that kills the
-- process "denies" everything; only the control tells the two apart). Results are
-- cached once per process.
-- @module corral.capability
local core = require "corral.core"
local shell = require "corral.shell"

local M = {}

local cache = {}

-- The control writes and reads back a file inside the boundary; the breach reads a
-- file outside it. Exit 10: the control failed; 11: the breach succeeded.
local LAYER_SCRIPT = [[
echo control > control || exit 10
read -r got < control || exit 10
[ "$got" = control ] || exit 10
if cat "$1" >/dev/null 2>&1; then exit 11; fi
exit 0]]

local function probe_layer(layer)
  local host, why = core.host_executable()
  if not host then return false, why end
  local dir, err = core.mkdtemp("/tmp/corral-probe-")
  if not dir then return false, err end
  local secret = dir .. "/outside/secret"
  local out, status = shell.capture({ "sh", "-c",
    'mkdir "$1/box" "$1/outside" && echo secret > "$1/outside/secret"', "sh", dir })
  if status == 0 then
    out, status = shell.capture({ host, "exec-confined", "--layers", layer,
      "--permit", dir .. "/box", "--", "/bin/sh", "-c", LAYER_SCRIPT, "sh", secret })
  end
  shell.capture({ "rm", "-rf", dir })
  out = (out or ""):gsub("%s+$", "")
  if status == 0 then
    return true, "control wrote and read inside the boundary; a read outside was denied"
  elseif status == 10 then
    return false, "control failed (a working process could not use its own boundary): " .. out
  elseif status == 11 then
    return false, "breach: a file outside the boundary was readable"
  end
  return false, string.format("wrapper exited %d: %s", status, out)
end

local probes = {
  {
    name = "confinement.namespace",
    gates = { "confine" },
    run = function() return probe_layer("ns") end,
  },
  {
    name = "confinement.landlock",
    gates = { "confine" },
    run = function()
      local abi, err = core.landlock_abi()
      if not abi then return false, err end
      local ok, detail = probe_layer("landlock")
      return ok, string.format("ABI %d; %s", abi, detail), { abi = abi }
    end,
  },
  {
    name = "bwrap",
    gates = {},
    run = function()
      local out, status = shell.capture({ "bwrap", "--version" })
      if status ~= 0 then return false, "bwrap not runnable: " .. out:gsub("%s+$", "") end
      return true, (out:gsub("%s+$", ""))
    end,
  },
}

--- Runs (once per process) and returns one probe's result.
-- @tparam string name a probe name, e.g. "confinement.landlock"
-- @treturn table `{name =, holds =, detail =, gates =}`
function M.check(name)
  if cache[name] then return cache[name] end
  for _, p in ipairs(probes) do
    if p.name == name then
      local ok, holds, detail, extra = pcall(p.run)
      if not ok then holds, detail = false, "probe error: " .. tostring(holds) end
      cache[name] = { name = name, holds = holds and true or false, detail = detail,
                      gates = p.gates, extra = extra }
      return cache[name]
    end
  end
  error("unknown capability probe: " .. tostring(name), 2)
end

--- Runs every probe (cached) and returns the results in a stable order.
-- @treturn {table,...}
function M.probe()
  local out = {}
  for i, p in ipairs(probes) do out[i] = M.check(p.name) end
  return out
end

--- The names of every probe.
-- @treturn {string,...}
function M.names()
  local out = {}
  for i, p in ipairs(probes) do out[i] = p.name end
  return out
end

--- Forgets cached results (tests that change the host use it).
function M.reset()
  cache = {}
end

return M
