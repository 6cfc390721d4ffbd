--- How a probe's child runs: in a private scratch directory of its own (named with the
-- creator's pid, swept by corral.leftovers), with stdin from /dev/null and its output
-- captured, killed after 10 s; in the tenant's namespaces, or under one layer of the
-- confinement wrapper. What is probed, and the verdicts, are corral.probe's.
-- @module corral.probe_child
local core = require "corral.core"
local file = require "corral.file"
local leftovers = require "corral.leftovers"
local transient = require "corral.transient"

local M = {}

-- What ran out while the current probe's children ran (corral.transient), or nil.
local ran_out

--- What ran out since the last call (a spawn that failed for want of a resource, a
-- child killed by a signal it did not raise, output that could not be written), and
-- forgets it: a probe that saw one is "not known" (corral.probe).
-- @treturn string|nil
function M.take_ran_out()
  local what = ran_out
  ran_out = nil
  return what
end

-- A private scratch directory for a probe, in $TMPDIR or /tmp (corral.leftovers). Without
-- $TMPDIR and with /tmp read-only (a `corral confine` nested in another, whose /tmp is the
-- runtime's), the working directory: there the confined process starts, inside its
-- boundary. Named with the creator's pid, so that one a killed probe left is found and
-- removed (corral.probe.sweep) by the next process that probes or runs.
local function mkscratch()
  local dir, err = leftovers.make(leftovers.base(), "corral-probe-")
  if dir or os.getenv("TMPDIR") then return dir, err end
  local cwd = core.path.resolve(".")
  if not cwd then return nil, err end
  leftovers.sweep_own(cwd, ".corral-probe-")
  return leftovers.make(cwd, ".corral-probe-")
end

-- A file for a probe child's output, in a private directory of its own (never a
-- guessable name in a shared /tmp). Returns its path and a function that removes both.
local function scratch_file()
  local dir = assert(mkscratch())
  return dir .. "/out", function() core.fs.remove_tree(dir) end
end

-- Exit 10: the control (write and read back inside the boundary) failed; 11: the breach
-- (a read outside) succeeded. Shell builtins only: with cat and a popen shell the two
-- layer probes took 27 of `time corral confine --exec`'s 30 ms.
local LAYER_SCRIPT = [[
echo control > control || exit 10
read -r got < control || exit 10
[ "$got" = control ] || exit 10
if read -r got 2>/dev/null < "$1"; then exit 11; fi
exit 0]]

-- Why a child left no output, when its output file cannot take a byte
-- (a full $TMPDIR: the child's own words were lost to ENOSPC), else nil.
local function unwritable(path)
  local f, err, errno = io.open(path, "a")
  if f then
    f:setvbuf("no")
    local _, werr, werrno = f:write("\n")
    f:close()
    err, errno = werr, werrno
  end
  if not err then return nil end
  ran_out = ran_out or transient.of(errno)
  return "its output could not be written to " .. path .. ": " .. tostring(err)
end

-- Spawns `plan` with stdin from /dev/null (a verdict must not depend on the caller's
-- stdin: a directory there fails every layer probe), output into a scratch file, killed
-- after 10 s. Returns the output and the exit code (128+signal), or nil, error. What ran
-- out on the way is noted (`M.take_ran_out`).
local function run_captured(plan)
  local out_path, drop = scratch_file()
  local out = assert(io.open(out_path, "w"))
  local devnull = assert(io.open("/dev/null"))
  plan.stdin, plan.stdout, plan.stderr = devnull, out, out
  local proc, err, errno = core.spawn.start(plan)
  devnull:close()
  out:close()
  if not proc then
    drop()
    ran_out = ran_out or transient.of(errno)
    return nil, err
  end
  local code = proc:wait(10)
  if not code then proc:kill(); code = proc:wait() end
  proc:close()
  ran_out = ran_out or transient.killed(code)
  local text = file.read(out_path) or ""
  if text:find("^%s*$") then text = unwritable(out_path) or text end
  drop()
  return text, code
end

local PROBE_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

-- Runs argv (an absolute path first) outside any sandbox of its own.
local function capture_spawn(argv)
  return run_captured({ plain = true, path = argv[1], argv = argv, env = { PROBE_PATH } })
end

--- Runs the confinement wrapper's `layer` alone: a write and read-back inside its
-- boundary (the control), then a read outside (the breach).
-- @tparam string layer "ns" | "bwrap" | "landlock"
-- @treturn boolean whether the layer holds
-- @treturn string why
function M.layer(layer)
  -- the program a confine spec names, so that what was probed is what launches
  local wrapper, why = require("corral.confine_wrapper").path()
  if not wrapper then return false, why end
  local dir, err = mkscratch()
  if not dir then return false, err end
  local secret = dir .. "/outside/secret"
  local out, status
  local made = core.fs.mkdir(dir .. "/box", tonumber("700", 8)) and core.fs.mkdir(dir .. "/outside", tonumber("700", 8))
  local f = made and io.open(secret, "w")
  if f then
    f:write("secret\n")
    f:close()
    out, status = capture_spawn({ wrapper, "exec-confined", "--layers", layer,
      "--permit", dir .. "/box", "--", "/bin/sh", "-c", LAYER_SCRIPT, "sh", secret })
  else
    out, status = "cannot prepare " .. dir, -1
  end
  core.fs.remove_tree(dir)
  out = (out or ""):gsub("%s+$", "")
  if status == 0 then
    return true, "control wrote and read inside the boundary; a read outside was denied"
  elseif status == 10 then
    return false, "control failed (a working process could not use its own boundary): " .. out
  elseif status == 11 then
    return false, "breach: a file outside the boundary was readable"
  end
  return false, string.format("wrapper exited %s: %s", tostring(status), out)
end

--- Runs argv in a child in the tenant namespaces (user, mount, pid, ipc, uts, cgroup,
-- empty net, or opts.netns), as 65534, under the tenant seccomp filter unless
-- opts.seccomp is false.
-- @tparam {string,...} argv an absolute path first
-- @tparam[opt] table opts `binds` (added to the runtime), `netns`, `seccomp`, `cgroup_procs`
-- @treturn[1] string its output (stdout and stderr)
-- @treturn[1] integer its exit code (128+signal)
-- @return[2] nil
-- @treturn[2] string why it did not start
function M.tenant(argv, opts)
  opts = opts or {}
  local binds, links = {}, {}
  for _, p in ipairs(core.rootplan.runtime_paths()) do
    local target = core.fs.readlink(p)
    if target then links[#links + 1] = { target = target, path = p }
    else binds[#binds + 1] = { src = p, dest = p, optional = true } end
  end
  for _, b in ipairs(opts.binds or {}) do binds[#binds + 1] = b end
  return run_captured({
    path = argv[1], argv = argv, env = { PROBE_PATH }, cwd = "/",
    new_net = opts.netns == nil, netns = opts.netns, uid = 65534, gid = 65534, binds = binds, symlinks = links,
    proc = true, dev = true, seccomp = opts.seccomp ~= false, cgroup_procs = opts.cgroup_procs,
  })
end

--- Calls fn(dir) with a private scratch directory, removed afterwards.
-- @tparam function fn returns the probe's verdict
-- @return what fn returns, or false and why (no scratch, an error raised)
function M.with_scratch(fn)
  local dir, err = mkscratch()
  if not dir then return false, err end
  local ok, a, b, c = pcall(fn, dir)
  core.fs.remove_tree(dir)
  if not ok then return false, "probe error: " .. tostring(a) end
  return a, b, c
end

return M
