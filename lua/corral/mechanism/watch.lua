--- The host's promises around a mechanism it did not write: a custom mechanism's exec
-- runs in a watched child (core.spawn.fork), so that --wall and forwarded signals bound
-- it whatever its code does (an `os.execute` blocks where no hook reaches). The host
-- meanwhile serves its own loop (corral.egress.loop): the run's control socket
-- (corral.control), so that the REPL sees the run, and the egress planes provision
-- built, so that decisions, `allow` and `revoke` happen where the policy lives.
--
-- When the mechanism asks the host for resource_limits, the child joins a cgroup capped
-- at the sandbox's memory, pids and cpu and takes its fsize and nofile rlimits before
-- the mechanism's code runs (or reports that it could not, and nothing runs).
-- What it started is the child's cgroup when the host can make one (cgroup.kill ends it
-- however processes detach), and always the child's process tree: the child is a
-- subreaper, so descendants stay beneath it. At the wall, or `GRACE` seconds after a
-- forwarded signal that starts the grace (SIGTERM, SIGHUP, a second SIGINT:
-- corral.egress.loop.starts_grace), all of it is killed. The result comes through a pipe, checked
-- against the contract on both sides.
-- @module corral.mechanism.watch
local core = require "corral.core"
local errors = require "corral.errors"
local limits = require "corral.limits"
local proctree = require "corral.proctree"

local M = {}

--- Seconds a mechanism is given to return after a forwarded signal.
M.GRACE = 3

-- A result or an error as a Lua literal of scalars and tables of scalars.
local function encode(v, depth)
  if type(v) == "table" and depth < 3 then
    local parts = {}
    for k, x in pairs(v) do
      if type(k) == "string" and k:match("^[%a_][%w_]*$") then
        local e = encode(x, depth + 1)
        if e then parts[#parts + 1] = k .. "=" .. e end
      end
    end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif type(v) == "string" or type(v) == "number" or type(v) == "boolean" then
    return string.format("%q", v)
  end
  return nil
end

local function decode(text)
  local chunk = load("return " .. text, "=result", "t", {})
  local ok, v = pcall(chunk or error)
  if ok and type(v) == "table" then return v end
  return nil
end

local descendants = proctree.descendants

-- Stops the tree until it stops growing, so nothing forks past the kill, then kills it.
local function kill_tree(pid)
  local stopped = {}
  for _ = 1, 50 do
    local grew = false
    for _, p in ipairs(descendants(pid)) do
      if not stopped[p] then
        stopped[p], grew = true, true
        core.proc.kill(p, 19) -- SIGSTOP
      end
    end
    if not grew then break end
  end
  for p in pairs(stopped) do core.proc.kill(p, 9) end
end

-- Sends sig to the child, its tree and (SIGKILL) its cgroup; only while the child is
-- unreaped, since until then its pid, and the tree found from it, is its own. A
-- forwarded signal goes to what the mechanism started, where the command is, and to the
-- child itself only when it started nothing: a child ended by it could not report the
-- status a command that handled the signal chose.
local function signal_all(child, cg, sig)
  if sig == 9 then
    if cg then cg:kill() end
    kill_tree(child:pid())
    child:kill(sig)
    return
  end
  local tree = descendants(child:pid())
  for _, pid in ipairs(tree) do core.proc.kill(pid, sig) end
  if #tree == 0 then child:kill(sig) end
end

-- The limits the host applies (`bounds`) are in place before the mechanism's code runs,
-- or it never runs: the child joins the capped cgroup and takes the rlimits itself, so
-- everything it starts inherits both.
local function bound(cg, bounds)
  if cg then
    local ok, err = cg:attach(core.proc.getpid())
    if not ok and bounds then return nil, "cannot join the sandbox's cgroup: " .. tostring(err) end
  end
  for name, n in pairs(bounds and bounds.rlimits or {}) do
    local ok, err = core.proc.limit(name, n)
    if not ok then return nil, "cannot set the " .. name .. " limit: " .. tostring(err) end
  end
  return true
end

local function child_main(mech, sb, argv, opts, cg, bounds, pipe)
  local bounded, why = bound(cg, bounds)
  if not bounded then
    core.io.write(pipe, encode({ error = errors.cannot_enforce("resource_limits", why) }, 0) or "{}")
    core.proc.exit(0)
  end
  -- the egress planes and the control socket stay the host's to serve
  require("corral.egress.loop").forget()
  local corral = require "corral"
  local ok, r, err = pcall(corral.exec, mech, sb, argv, opts)
  -- what the mechanism left running is lost to the tree once this subreaper is gone
  kill_tree(core.proc.getpid())
  local report
  if ok and r then
    report = encode({ result = r }, 0)
  else
    local e = ok and err or errors.invalid_argument("mechanism " .. require("corral.mechanism").label(mech),
      "exec raised: " .. tostring(r))
    report = encode({ error = errors.is(e) and e or { detail = tostring(e) } }, 0)
  end
  core.io.write(pipe, report or "{}")
  core.proc.exit(0)
end

-- The limits the host promised (the mechanism requires resource_limits and does not
-- construct it): `bounds` ({rlimits = {fsize =, nofile =}}) and a cgroup capped at
-- memory, pids and cpu; otherwise no bounds and, as root, an uncapped cgroup that only
-- ends the tree. A promised cgroup that cannot be made refuses the run.
local function host_bounds(mech, sb)
  local applied, aerr = require("corral.mechanism").host_applied(mech, sb)
  if not applied then return nil, nil, errors.cannot_enforce("mechanism", aerr) end
  if not applied.resource_limits then
    return nil, core.proc.geteuid() == 0 and core.cgroup and core.cgroup.create({}) or nil
  end
  local l = sb.limits or {}
  local bounds = { rlimits = { fsize = l.fsize, nofile = l.nofile } }
  if not limits.wants_cgroup(sb) then
    return bounds, core.proc.geteuid() == 0 and core.cgroup and core.cgroup.create({}) or nil
  end
  if not core.cgroup then
    return nil, nil, errors.cannot_enforce("resource_limits", "no cgroup support in this build")
  end
  local cg, err = limits.cgroup(sb)
  if not cg then return nil, nil, err end
  bounds.capped = true
  return bounds, cg
end

-- A capped cgroup's OOM kill during the run: the memory cap ended it, whether it took
-- the command (the mechanism reports 128 + 9) or the watched child itself (no report).
local function capped_result(cg, bounds, result)
  if not (cg and bounds and bounds.capped) then return result end
  local usage = cg:usage()
  if not (usage and (usage.oom_kills or 0) > 0) then return result end
  result = result or { code = 128 + 9, how = "killed" }
  return limits.observe({ cgroup = cg }, result)
end

--- Runs `corral.exec(mech, sb, argv, opts)` in a watched child and bounds it.
-- @tparam table mech a loaded mechanism
-- @tparam table sb
-- @tparam {string,...} argv
-- @tparam[opt] table opts passed to exec
-- @tparam[opt] userdata signals the host's signalfd (INT, TERM, HUP)
-- @treturn table the result, or nil and an error
function M.exec(mech, sb, argv, opts, signals)
  local label = require("corral.mechanism").label(mech)
  local loop = require "corral.egress.loop"
  local bounds, cg, berr = host_bounds(mech, sb)
  if berr then return nil, berr end
  local child, pipe = core.spawn.fork()
  if child == false then child_main(mech, sb, argv, opts or {}, cg, bounds, pipe) end
  if not child then
    if cg then cg:destroy() end
    return nil, errors.cannot_enforce("process_isolation", "cannot start the watched child: " .. tostring(pipe))
  end
  local wall = sb.limits and sb.limits.wall
  local deadline = wall and core.clock.monotime() + wall
  local chunks, timed_out, got_signal, grace_end, interrupts = {}, false, nil, nil, 0
  local fds = { pipe, signals }
  while true do
    local now = core.clock.monotime()
    local ends = { deadline, grace_end }
    local next_end
    for _, t in pairs(ends) do next_end = next_end and math.min(next_end, t) or t end
    if next_end and now >= next_end then
      if deadline and now >= deadline then timed_out = true end
      signal_all(child, cg, 9)
      break
    end
    -- the host's loop: the run's control socket and any egress plane provision built
    local hit = loop.step(next_end and math.min(next_end - now, 1) or 1, fds)
    if hit[2] then
      local sig = core.signal.read(signals)
      if sig then
        signal_all(child, nil, sig)
        got_signal = got_signal or sig
        if sig == 2 then interrupts = interrupts + 1 end
        if not grace_end and
          loop.starts_grace(sig, interrupts, function() return proctree.all_ignore(child:pid(), sig) end) then
          grace_end = core.clock.monotime() + M.GRACE
        end
      end
    end
    if hit[1] then
      local data = core.io.read(pipe, 65536)
      if not data or data == "" then break end
      chunks[#chunks + 1] = data
    end
  end
  local code, how = child:wait()
  pipe:close()
  local report = decode(table.concat(chunks))
  local capped = not timed_out and not (report and report.error) and capped_result(cg, bounds, report and report.result)
  if cg then
    cg:kill()
    cg:destroy()
  end
  child:close()
  if timed_out then return { code = 128 + 9, how = "killed", limit = "wall" } end
  if capped then return capped end
  if report and report.result then return report.result end
  if report and report.error then
    local e = report.error
    if e.code and errors.codes[e.code] then
      return nil, errors.new(e.code, { argument = e.argument, capability = e.capability, detail = e.detail,
                                       detail_format = e.detail_format, resource = e.resource })
    end
    return nil, errors.invalid_argument("mechanism " .. label, tostring(e.detail))
  end
  if got_signal then return { code = 128 + got_signal, how = "killed" } end
  return nil, errors.invalid_argument("mechanism " .. label, string.format(
    "exec ended its process (%s %d) without a result", how or "status", code or -1))
end

return M
