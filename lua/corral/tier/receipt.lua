--- Step receipts: what ran, at which tier, under which committed policy, at what cost.
--
-- One JSON line per step, keys in a fixed order, appended to one file for an auditor.
-- Energy is `ModelBased` where RAPL is readable (package energy times the step's share of
-- host CPU time from /proc/stat), else `Estimator`: cpu_s × `CORE_WATTS`. 10 W is a
-- server core's share of its package at load (2 × 225 W TDP over 2 × 24 cores is 9.4 W);
-- the receipt carries the model so that a reader can rescale.
-- @module corral.tier.receipt
local json = require "corral.json"

local M = {}

--- The canonical serialisation each receipt's commitment covers (corral.tier.policy
-- .canonical), by receipt; kept beside it, not in its JSON line, for a signed receipt
-- (corral.receipt) to carry.
M.canonical_of = setmetatable({}, { __mode = "k" })

--- Watts one fully busy core draws in the Estimator model.
M.CORE_WATTS = 10

local KEYORDER = { "tier", "mechanism", "commitment", "cmd", "exit", "result", "failure", "wall_s", "cpu_s",
  "max_rss", "energy", "joules", "method", "model", "probe", "control", "attempts", "attempt", "denied",
  "errno", "control_after", "grants", "read", "write", "exec", "net", "subprocess", "env", "clock",
  "random", "residue", "s2" }

local function read_number(path)
  local f = io.open(path)
  if not f then return nil end
  local v = tonumber((f:read("l") or ""):match("%d+"))
  f:close()
  return v
end

local function rapl_files()
  local out = {}
  for i = 0, 7 do
    local p = "/sys/class/powercap/intel-rapl:" .. i .. "/energy_uj"
    if read_number(p) then out[#out + 1] = p end
  end
  return out
end

-- Busy CPU seconds of the whole host so far (/proc/stat, USER_HZ = 100 on Linux).
local function host_busy_s()
  local f = io.open("/proc/stat")
  if not f then return nil end
  local line = f:read("l")
  f:close()
  local n, busy = 0, 0
  for v in line:gmatch("%d+") do
    n = n + 1
    if n ~= 4 and n ~= 5 then busy = busy + tonumber(v) end -- idle and iowait are not busy
  end
  return busy / 100
end

--- Reads the energy counters before a step (nil fields where none is readable).
-- @treturn table a meter to pass to `M.energy`
function M.meter()
  local files = rapl_files()
  local uj = 0
  for _, p in ipairs(files) do uj = uj + read_number(p) end
  if #files == 0 then return { files = files } end
  return { files = files, uj = uj, busy = host_busy_s() }
end

--- The step's energy from a meter read before it and its CPU time.
-- @tparam table meter from `M.meter`
-- @tparam number cpu_s the step's user+system CPU seconds
-- @treturn table `{joules =, method = "ModelBased"|"Estimator", model =}`
function M.energy(meter, cpu_s)
  if meter.uj then
    local uj = 0
    for _, p in ipairs(meter.files) do uj = uj + (read_number(p) or 0) end
    local busy = host_busy_s()
    local spent = busy and meter.busy and busy - meter.busy or 0
    local share = spent > 0 and math.min(1, cpu_s / spent) or 1
    if uj >= meter.uj then
      return { joules = (uj - meter.uj) / 1e6 * share, method = "ModelBased",
               model = "RAPL package energy x the step's share of host CPU time" }
    end
  end
  return { joules = cpu_s * M.CORE_WATTS, method = "Estimator",
           model = string.format("cpu_s x %g W per busy core", M.CORE_WATTS) }
end

--- The receipt as one JSON line (no newline).
-- @tparam table receipt
-- @treturn string
function M.encode(receipt)
  return json.encode(receipt, { keyorder = KEYORDER })
end

--- Appends the receipt as one line to a file.
-- @tparam table receipt
-- @tparam string path
-- @treturn true, or nil and why
function M.append(receipt, path)
  local f, err = io.open(path, "a")
  if not f then return nil, err end
  f:write(M.encode(receipt), "\n")
  f:close()
  return true
end

return M
