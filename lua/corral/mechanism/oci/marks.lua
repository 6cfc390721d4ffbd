--- The `oci` mechanism's marks and sweep: the containers a corral process starts outlive
-- it when it is SIGKILLed, and the next corral process using oci removes them.
--
-- Each live corral process using oci has its mark (`owner-PID` in corral's root-only
-- directory), where each container name is added before its client starts: a client
-- outlives a SIGKILLed corral (a session of its own) and may create its container after
-- a sweep looked, so the sweep finds the name here.
-- @module corral.mechanism.oci.marks
local core = require "corral.core"
local file = require "corral.file"
local json = require "corral.json"
local leftovers = require "corral.leftovers"
local proctree = require "corral.proctree"
local resources = require "corral.resources"
local engine = require "corral.mechanism.oci.engine"

local M = {}

local marked = false -- whether this process's mark exists

--- This process's mark, or process pid's.
function M.path(pid) return engine.scratch_dir() .. "/owner-" .. (pid or core.proc.getpid()) end

--- Adds a container's name to this process's mark (true at once when it has none).
-- @tparam string name
-- @treturn boolean|nil
function M.note(name)
  if not marked then return true end
  local f = io.open(M.path(), "a")
  if not f then return nil end
  f:write(name, "\n")
  f:close()
  return true
end

-- The live processes whose argv holds one of `names` as a word: the engine clients a
-- dead corral started, still creating their containers.
local function clients_of(names)
  local found = {}
  if not next(names) then return found end
  for _, pid in ipairs(proctree.pids()) do
    for _, word in ipairs(proctree.argv(pid)) do
      if names[word] then found[#found + 1] = pid break end
    end
  end
  return found
end

-- The container ids (conmon's `-c ID`) in the argvs of pids, as a set of words.
local function container_ids(pids)
  local ids = {}
  for _, pid in ipairs(pids) do
    local argv = proctree.argv(pid)
    for i, word in ipairs(argv) do
      if word == "-c" and argv[i + 1] then ids[argv[i + 1]] = true end
    end
  end
  return ids
end

-- Waits (until the monotonic time `until_`) for the pids of list() to end.
local function wait_gone(list, until_)
  local pids = list()
  while #pids > 0 and core.clock.monotime() < until_ do
    core.io.poll({}, 0.05)
    pids = list()
  end
end

-- Ends a dead corral's engine clients first, so that no container appears after the
-- sweep looked: each (podman's client, its conmon) is killed and waited for, then the
-- runtime's own `create` a killed conmon started, which runs on to its end and would
-- add its container after the runtime's list was read (5 s at most in all).
local function end_clients(names)
  local pids = clients_of(names)
  local ids = container_ids(pids)
  for _, pid in ipairs(pids) do core.proc.kill(pid, 9) end
  local until_ = core.clock.monotime() + 5
  wait_gone(function()
    local alive = {}
    for _, pid in ipairs(pids) do
      if core.fs.lstat("/proc/" .. pid) then alive[#alive + 1] = pid end
    end
    return alive
  end, until_)
  wait_gone(function() return clients_of(ids) end, until_)
end

-- Deletes, through podman's OCI runtime, each container it still holds whose
-- `corral.owner` annotation names a pid with no process. The engine can forget a
-- container its runtime still holds: a client killed while the runtime was creating it
-- leaves a "created" container (its init waiting to be started, forever) that podman no
-- longer lists, so `rm` cannot reach it. Asked only when a mark outlived its process
-- (the runtime's list reads every container it holds: ~10 ms, far more with many).
local function sweep_runtime()
  local out = engine.runtime_call({ "list", "--format", "json" })
  local ok, list = pcall(json.decode, out or "null")
  if not ok or type(list) ~= "table" then return 0 end
  local removed = 0
  for _, c in ipairs(list) do
    local owner = type(c) == "table" and type(c.annotations) == "table" and c.annotations["corral.owner"]
    if type(c.id) == "string" and type(owner) == "string" and owner:match("^%d+$")
      and not core.fs.lstat("/proc/" .. owner) and engine.runtime_call({ "delete", "--force", c.id }) then
      removed = removed + 1
    end
  end
  return removed
end

--- Removes the containers of corral processes that are gone (SIGKILL leaves them no
-- chance to): when some process's mark (`owner-PID`) outlived it, the engine clients
-- it started are killed first (one still creating its container would otherwise add it
-- after the sweep looked), then every container labelled `corral.owner=PID` whose PID
-- has no process, and each container the mark names, are removed, and last what the
-- engine's runtime still holds of them. A mark goes only once its containers have, so
-- one the engine could not remove is tried again by the next sweep.
-- @treturn integer how many were removed
function M.sweep()
  local dir = engine.scratch_dir()
  resources.sweep(dir, leftovers.pattern("call-"), core.fs.remove_tree)
  resources.sweep(dir, "^root%-(%d+)%.tar$", os.remove)
  local dead, named = {}, {}
  resources.sweep(dir, "^owner%-(%d+)$", function(path)
    dead[#dead + 1] = path
    for name in (file.read(path) or ""):gmatch("[^\n]+") do named[name] = path:match("(%d+)$") end
    return true
  end)
  if #dead == 0 then return 0 end
  end_clients(named)
  local out, err = engine.call({ "ps", "--all", "--filter", "label=corral.owner", "--format",
    "{{.Names}} {{index .Labels \"corral.owner\"}}" })
  if err then return 0 end
  local removed, kept = 0, {}
  for name, pid in out:gmatch("(%S+) (%d+)\n") do
    if not core.fs.lstat("/proc/" .. pid) then
      named[name] = nil
      if engine.remove(name) then removed = removed + 1 else kept[pid] = true end
    end
  end
  -- a name the engine does not list under the label: a client killed while creating it
  -- may have left it half-made; removing one that does not exist fails harmlessly
  for name in pairs(named) do
    if engine.remove(name) then removed = removed + 1 end
  end
  removed = removed + sweep_runtime()
  for _, path in ipairs(dead) do
    if not kept[path:match("(%d+)$")] then os.remove(path) end
  end
  return removed
end

--- Sweeps once, then makes this process's mark (at its first provision): a dead
-- process's mark means its containers may be left, so the engine is asked only then.
function M.begin()
  if marked then return end
  marked = true
  M.sweep()
  engine.write_private(M.path(), "")
end

--- Removes this process's mark (once it holds no sandbox).
function M.release()
  if not marked then return end
  os.remove(M.path())
  marked = false
end

return M
