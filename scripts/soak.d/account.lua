-- The soak's account: what its workers wrote (scripts/soak.d/worker.sh's lines), its
-- canary log and its censuses, summed up (`summarise`, inside the soak's world), then
-- printed against the goals (`report`, outside).
local census = require "census"
local json = require "dkjson"

local M = {}

-- Goals of issue 24 for 10 minutes at 2x CPUs workers; runs and kills scale with the time.
M.GOALS = { runs_per_10min = 5000, kills_per_10min = 500 }

-- Counters that move with the load: shown, never compared.
local MOVING = { ["corral processes"] = true, ["corral fds"] = true, ["corral max RSS KiB"] = true }

local function read_json(path)
  local text = census.slurp(path)
  return text and json.decode(text)
end

local function lines(path)
  local out = {}
  for line in (census.slurp(path) or ""):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

-- What the census after the sweep holds that the one before did not.
local function leaks(before, after)
  if not (before and after) then return { census = { "a census is missing" } } end
  local out = {}
  for name, n in pairs(before.counts) do
    if not MOVING[name] then
      local new = census.new_items(after.items[name] or {}, before.items[name] or {})
      if #new > 0 or (after.counts[name] or 0) > n then out[name] = new end
    end
  end
  return out
end

--- Reads WORK's account, canary log and censuses.
function M.summarise(work)
  local s = { runs = 0, verdicts = {}, faults = {}, landed = 0, kills = 0, lost_bytes = 0, problems = {},
    slowest = 0, swept = lines(work .. "/swept") }
  for _, line in ipairs(lines(work .. "/account")) do
    local tag, wl, fault, landed, secs, verdict = line:match("^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)")
    if tag then
      s.runs = s.runs + 1
      s.verdicts[verdict] = (s.verdicts[verdict] or 0) + 1
      s.faults[fault] = (s.faults[fault] or 0) + 1
      if landed == "landed" then
        s.landed = s.landed + 1
        if fault:match("^kill%-") or fault:match("^term%-") then s.kills = s.kills + 1 end
      end
      s.slowest = math.max(s.slowest, tonumber(secs) or 0)
      s.lost_bytes = s.lost_bytes + (tonumber(line:match(" lost (%d+) bytes")) or 0)
      if verdict ~= "ok" and verdict ~= "explained" then
        s.problems[#s.problems + 1] = { line = line, err = census.slurp(work .. "/problems/" .. tag .. ".err") }
      end
      s.workloads = s.workloads or {}
      s.workloads[wl] = (s.workloads[wl] or 0) + 1
      s.seconds = s.seconds or {}
      s.seconds[wl] = (s.seconds[wl] or 0) + (tonumber(secs) or 0)
    end
  end
  s.elapsed = tonumber(census.slurp(work .. "/elapsed") or "")
  s.canary = lines(work .. "/canary.log")
  local before, after = read_json(work .. "/census-before.json"), read_json(work .. "/census-after.json")
  s.leaks = leaks(before, after)
  s.census = { before = before and before.counts, after = after and after.counts, during = {} }
  for i = 1, 1000 do
    local d = read_json(work .. "/census-during-" .. i .. ".json")
    if not d then break end
    s.census.during[i] = d.counts
  end
  return s
end

local function counts_line(c)
  local keys = {}
  for k in pairs(c or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. " " .. c[k] end
  return table.concat(parts, ", ")
end

local function check(name, value, pass, want)
  print(string.format("  %-34s %10s   %s (goal %s)", name, tostring(value), pass and "met" or "NOT MET", want))
  return pass
end

--- Prints the figures and the goals; returns whether every goal is met.
function M.report(s, seconds, workers)
  -- stopped early (Ctrl-C, SIGTERM), the goals scale with the time it ran
  seconds = math.min(seconds, s.elapsed or seconds)
  local scale = seconds / 600
  print(string.format("soak: %d s, %d workers", seconds, workers))
  print("census before: " .. counts_line(s.census and s.census.before))
  for i, d in ipairs(s.census and s.census.during or {}) do print("census minute " .. i .. ": " .. counts_line(d)) end
  print("census after:  " .. counts_line(s.census and s.census.after))
  print("faults: " .. counts_line(s.faults) .. "; workloads: " .. counts_line(s.workloads))
  local mean = {}
  for wl, n in pairs(s.workloads or {}) do mean[wl] = string.format("%.2f s", s.seconds[wl] / n) end
  print("mean time per workload: " .. counts_line(mean))
  print("verdicts: " .. counts_line(s.verdicts) .. string.format("; slowest run %.1f s", s.slowest or 0))
  if #(s.swept or {}) > 0 then print("sessions or containers a kill left, removed by the sweep: " .. #s.swept) end
  for _, p in ipairs(s.problems or {}) do
    print("  problem: " .. p.line)
    for line in (p.err or ""):gmatch("[^\n]+") do print("    " .. line) end
  end
  for _, c in ipairs(s.canary or {}) do print("  canary: " .. c) end
  local leaked = 0
  for name, new in pairs(s.leaks or {}) do
    leaked = leaked + math.max(#new, 1)
    print("  leaked " .. name .. ": " .. table.concat(new, "; "))
  end
  for _, c in ipairs(s.cgroups_left or {}) do print("  cgroup left: " .. c) end
  leaked = leaked + #(s.cgroups_left or {})
  local unexplained = 0
  for _, p in ipairs(s.problems or {}) do
    if not p.line:match("^%S+ %S+ %S+ %S+ %S+ lost ") then unexplained = unexplained + 1 end
  end
  print("goals:")
  local runs_goal = math.ceil(M.GOALS.runs_per_10min * scale)
  local kills_goal = math.ceil(M.GOALS.kills_per_10min * scale)
  local ok = s.ok ~= false
  ok = check("runs", s.runs, (s.runs or 0) >= runs_goal, ">= " .. runs_goal) and ok
  ok = check("injected kills (signals delivered)", s.kills, (s.kills or 0) >= kills_goal, ">= " .. kills_goal) and ok
  ok = check("canary connections", #(s.canary or {}), #(s.canary or {}) == 0, "0") and ok
  ok = check("leaked objects after the sweep", leaked, leaked == 0, "0") and ok
  ok = check("unexplained exit statuses or hangs", unexplained, unexplained == 0, "0") and ok
  ok = check("lost bytes of kept storage", s.lost_bytes, (s.lost_bytes or 1) == 0, "0") and ok
  if s.ok == false then print("  the soak's own set-up or driver failed (see above)") end
  return ok
end

return M
