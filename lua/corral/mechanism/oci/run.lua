--- The `oci` mechanism's runs: the engine's client started for a command in a sandbox,
-- its stderr fed through, how its end is classified, and how it is ended (at its wall,
-- after a forwarded signal, or when its reader went away), its exec's processes killed.
-- @module corral.mechanism.oci.run
local core = require "corral.core"
local file = require "corral.file"
local errors = require "corral.errors"
local shell = require "corral.shell"
local proctree = require "corral.proctree"
local engine = require "corral.mechanism.oci.engine"
local image = require "corral.mechanism.oci.image"
local marks = require "corral.mechanism.oci.marks"
local render = require "corral.mechanism.oci.render"

local M = {}

-- The kernel's count of OOM kills since boot (/proc/vmstat oom_kill).
local function oom_kills()
  return tonumber((file.read("/proc/vmstat") or ""):match("\noom_kill (%d+)")) or 0
end

-- How much of the engine client's stderr a run keeps, for the error of a failed run.
local STDERR_KEPT = 8192

-- A function writing to the caller's stderr (a Lua file or a corral.fd; nil: ours), or
-- nil when it is a bare fd number corral does not write to.
local function stderr_writer(target)
  target = target or io.stderr
  if io.type(target) == "file" then
    return function(d)
      target:write(d)
      target:flush()
    end
  end
  local mt = getmetatable(target)
  if type(mt) == "table" and mt.__name == "corral.fd" then
    return function(d)
      while #d > 0 do
        local n = core.io.write(target, d)
        if not n then return end
        d = d:sub(n + 1)
      end
    end
  end
  return nil
end

-- The engine client's stderr through a pipe corral reads: forwarded to the caller's as it
-- comes, its last STDERR_KEPT bytes kept, so that a run the engine could not make (status
-- 125) returns the engine's own words. `on` reads what is there (false at its end).
local function stderr_feed(target)
  local write = stderr_writer(target)
  if not write then return nil end
  local rd, wr = core.io.pipe()
  if not rd then return nil end
  local feed = { fd = rd, wr = wr, kept = "" }
  function feed.on()
    for _ = 1, 16 do
      local d, _, errno = core.io.read(rd, 65536)
      if not d then return errno == core.errno.EAGAIN end
      if d == "" then return false end
      write(d)
      feed.kept = (feed.kept .. d):sub(-STDERR_KEPT)
    end
    return true
  end
  return feed
end

--- Starts the engine's client for argv in sb, in a private working directory. With
-- `capture`, its stderr comes through a feed (see `stderr_feed`; the caller serves it).
-- Each new container's name is noted in this process's mark (corral.mechanism.oci.marks)
-- before its client starts.
-- @treturn[1] table the run: `{proc =, name =, dir =, joined =, argv =, …}`
-- @return[2] nil
-- @treturn[2] table the error
function M.spawn(sb, st, argv, opts, capture)
  local dir, derr = engine.private_dir()
  if not dir then return nil, errors.cannot_enforce("oci", "a private directory for the engine: " .. tostring(derr)) end
  local full, name, joined = render.command(sb, st, argv, opts, dir)
  local out
  if full and opts.output then
    out = io.open(opts.output, "w")
    if not out then name = errors.invalid_argument("output", "cannot open " .. opts.output) end
  end
  if not full or (opts.output and not out) then
    core.fs.remove_tree(dir)
    return nil, name
  end
  if not joined and not marks.note(name) then
    if out then out:close() end
    core.fs.remove_tree(dir)
    return nil, errors.cannot_enforce("oci", "cannot note the container's name in " .. marks.path())
  end
  local feed = capture and stderr_feed(out or opts.stderr)
  local oom0 = oom_kills()
  -- A session of its own: a terminal's Ctrl-C reaches corral alone, which delivers it.
  local proc, err = core.spawn.start({ plain = true, new_session = true, path = full[1], argv = full,
    env = engine.ENV, cwd = dir, stdin = opts.stdin, stdout = out or opts.stdout,
    stderr = feed and feed.wr or out or opts.stderr })
  if feed then feed.wr:close() end
  if not proc then
    if feed then feed.fd:close() end
    if out then out:close() end
    core.fs.remove_tree(dir)
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(full) .. "` failed (cannot start: " ..
      tostring(err) .. ")")
  end
  return { proc = proc, name = name, dir = dir, joined = joined, argv = full, oom_kills = oom0, out = out,
    output = opts.output, feed = feed }
end

--- Seconds a run is given to end after a forwarded signal (Ctrl-C, SIGTERM) before it
-- is ended as at its wall. The engine hands the signal to the container's first
-- process, which is the command itself: as a pid namespace's init it ignores every
-- signal it has no handler for, so a plain `sleep` would otherwise outlive them all.
M.SIGNAL_GRACE = 3

--- Seconds an exec in a started container is given, after its wall, for its processes
-- to be found and killed before the whole container is removed instead.
M.EXEC_GRACE = 5

local pid_ns = proctree.pid_ns

-- The host pids of what exec sessions run in the container whose first process is `init`:
-- each session's first process (in the container's pid namespace, its parent outside it,
-- where the engine's monitor is) and everything beneath it. The container's own first
-- process and its tree are left, as is what an exec left behind (reparented to it).
local function exec_processes(init, ns)
  local parent = proctree.parents(function(pid) return pid_ns(pid) == ns end)
  local roots = {}
  for pid, pp in pairs(parent) do
    if pid ~= init and not parent[pp] then roots[#roots + 1] = pid end
  end
  return proctree.beneath(parent, roots, true)
end

-- Stops the exec sessions' processes until no new one appears (a stopped process can
-- neither fork nor exit and have its pid reused), each checked in the container's pid
-- namespace once stopped, then kills them.
local function kill_exec_processes(init, ns)
  local stopped = {}
  for _ = 1, 50 do
    local grew = false
    for _, pid in ipairs(exec_processes(init, ns)) do
      if not stopped[pid] and core.proc.kill(pid, 19) then -- SIGSTOP
        if pid_ns(pid) == ns then
          stopped[pid], grew = true, true
        else
          core.proc.kill(pid, 18) -- SIGCONT: the pid was reused outside the container
        end
      end
    end
    if not grew then break end
  end
  for pid in pairs(stopped) do
    if pid_ns(pid) == ns then core.proc.kill(pid, 9) end
  end
end

-- Ends an exec in the started container at its wall: its sessions' processes are killed
-- until the engine's client returns (the session may still be starting). When they
-- cannot be found from here, or the client is still there after EXEC_GRACE, the
-- container is removed, its started command with it.
local function end_exec(run, deadline)
  local out = engine.call({ "inspect", "--format", "{{.State.Pid}}", run.name })
  local init = tonumber(out and out:match("%d+"))
  local ns = init and init > 1 and pid_ns(init)
  local grace = math.min(deadline, core.clock.monotime() + M.EXEC_GRACE)
  while ns and run.proc:running() and core.clock.monotime() < grace do
    kill_exec_processes(init, ns)
    run.proc:wait(0.1)
  end
  if run.proc:running() then engine.remove(run.name) end
end

--- Hands signal sig to a run's container, through the engine (`kill --signal`). False
-- while the engine refuses: until its client has started the container, the engine
-- holds it as created, not running, and the signal waits.
function M.deliver(run, sig)
  local _, err = engine.call({ "kill", "--signal", tostring(sig), run.name })
  return err == nil
end

--- Ends a run: at its wall (`kill`), its exec's processes, or its container, are killed;
-- then the client is waited for, its stderr forwarded to the end, and its private
-- directory removed. A container's removal is repeated until the engine's client has
-- exited: asked while the engine is still creating the container, `rm` finds nothing,
-- and the container then started (a wall of 0.5 s let a command run on past it).
function M.finish(run, kill)
  local deadline = core.clock.monotime() + engine.config.timeout
  if kill and run.joined then end_exec(run, deadline) end
  while kill and not run.joined and run.proc:running() and core.clock.monotime() < deadline do
    engine.remove(run.name)
    run.proc:wait(0.5)
  end
  if kill and not run.joined then engine.remove(run.name) end
  if run.proc:running() then run.proc:wait(math.max(0, deadline - core.clock.monotime())) end
  if run.proc:running() then
    run.proc:kill()
    run.proc:wait()
  end
  run.proc:close()
  if run.feed then
    run.feed.on()
    run.feed.fd:close()
  end
  if run.out then run.out:close() end
  core.fs.remove_tree(run.dir)
end

-- What the engine said on a failed run's stderr: the feed's last bytes, or the end of
-- the output file it wrote to.
local function engine_words(run)
  local text = run.feed and run.feed.kept
  if not text and run.output then
    if run.out then run.out:flush() end
    text = engine.read_all(run.output):sub(-STDERR_KEPT)
  end
  text = (text or ""):gsub("^%s+", ""):gsub("%s+$", "")
  if text == "" then return "the engine wrote nothing on stderr corral could read" end
  return text
end

--- How a run ended: `limit = "memory"` when it was SIGKILLed under a memory cap while the
-- kernel's OOM killer fired. The engine's own report cannot be used: on podman 4.3 and
-- cgroup v1, `podman run --name x --memory 32m --memory-swap 32m --ulimit nofile=1024:1024
-- --ulimit nproc=1024:1024 --rootfs /:O sh -c 'tail /dev/zero'` exits 137 and `podman
-- inspect --format '{{.State.OOMKilled}}' x` says false; and the container's memory
-- cgroup, the only one counting the kill on v1, is gone with it.
function M.classify(sb, run, code)
  local result = { code = code, how = "exited" }
  -- 125 is also a command's own status: with the client's stderr read, the engine's
  -- failure is the one it said an error about (podman's "Error: …", docker's too)
  if code == 125 and not (run.feed and not run.feed.kept:find("Error", 1, true)) then
    image.forget()
    return nil, errors.cannot_enforce("oci", "`" .. shell.join(run.argv) .. "` failed (status 125: " ..
      engine_words(run) .. ")")
  end
  if code == 128 + 9 and sb.limits and sb.limits.memory and oom_kills() > run.oom_kills then
    result.limit = "memory"
  end
  return result
end

return M
