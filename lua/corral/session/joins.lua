--- How an exec enters a live sandbox whose mechanism has no `join` of its own
-- (corral.session.exec calls `mech.join`): under oci, the engine's `exec` into the
-- container the keeper started; under a custom mechanism, its `exec` callback in a
-- watched child (corral.mechanism.watch, as `corral run` runs it). Each returns the
-- process the keeper watches (its status is the command's) and, for oci, the control
-- of the command's processes inside the container, which the engine's client does not
-- hand signals to and leaves running when it is killed.
-- @module corral.session.joins
local core = require "corral.core"
local errors = require "corral.errors"
local proctree = require "corral.proctree"

local M = {}

--- The signals a custom mechanism's watched child forwards to what its exec started.
M.FORWARDED = { "INT", "TERM", "HUP", "QUIT", "USR1", "USR2" }

-- ---- oci: the engine's exec ---------------------------------------------------------------

local seq = 0

-- The env file of one exec: its environment as NAME=VALUE lines, the exec's tag last
-- (how its processes are found in the container). A newline would start another line.
local function env_lines(env, tag)
  local names = {}
  for k, v in pairs(env or {}) do
    if tostring(v):find("\n", 1, true) then return nil, "--env " .. k .. ": a value with a newline cannot pass " ..
      "through the engine's env file" end
    names[#names + 1] = k
  end
  table.sort(names)
  local out = {}
  for i, k in ipairs(names) do out[i] = k .. "=" .. env[k] end
  out[#out + 1] = "CORRAL_EXEC=" .. tag
  return table.concat(out, "\n") .. "\n"
end

-- The host pids in pid namespace ns whose environment holds the exec's tag.
local function tagged(ns, tag)
  local want, out = "\0CORRAL_EXEC=" .. tag .. "\0", {}
  for _, name in ipairs(core.fs.listdir("/proc") or {}) do
    if name:match("^%d+$") and proctree.pid_ns(name) == ns then
      local f = io.open("/proc/" .. name .. "/environ", "rb")
      local env = f and f:read("a")
      if f then f:close() end
      if env and ("\0" .. env):find(want, 1, true) then out[#out + 1] = tonumber(name) end
    end
  end
  return out
end

-- Process pid's process group (/proc/PID/stat's fifth field), or nil.
local function group_of(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  local stat = f and f:read("a")
  if f then f:close() end
  return tonumber(stat and stat:match("%) %S+ %d+ (%d+)"))
end

-- The control of one exec's processes inside the container: `signal(sig)` to its
-- command's process groups (those a process of the exec leads), `kill()` its whole
-- tree (stopped until it stops growing); `finish()` removes its env file.
local function control_of(ns, tag)
  local c = {}
  function c.signal(sig)
    local mine = {}
    for _, pid in ipairs(tagged(ns, tag)) do mine[pid] = true end
    for pid in pairs(mine) do
      if mine[group_of(pid)] then core.proc.kill(pid, sig) end
    end
  end
  function c.kill()
    local stopped = {}
    for _ = 1, 50 do
      local grew = false
      for _, root in ipairs(tagged(ns, tag)) do
        for _, pid in ipairs({ root, table.unpack(proctree.descendants(root)) }) do
          if not stopped[pid] and proctree.pid_ns(pid) == ns then
            stopped[pid], grew = true, true
            core.proc.kill(pid, 19) -- SIGSTOP: it can neither fork nor exit meanwhile
          end
        end
      end
      if not grew then break end
    end
    for pid in pairs(stopped) do core.proc.kill(pid, 9) end
  end
  return c
end

--- A join through the oci engine's `exec` into the container `start` left running: the
-- sandbox's user and working directory (or `opts.cwd`), the exec's environment through
-- an env file, `--interactive` on the client's fds, `-t` when they are a pty's slave (the
-- engine then gives the command a terminal of the container's own devpts).
-- @tparam table oci the oci mechanism
-- @treturn function join(sb, argv, opts, root_pid) (root_pid: the container's first
--   process, on the host) → process, or nil and why; and the control of
--   its processes in the container (`signal`, `kill`)
function M.oci(oci)
  local engine = require "corral.mechanism.oci.engine"
  local tenant_root = require "corral.tenant_root"
  return function(sb, argv, opts, root_pid)
    local name = oci.containers(sb)[1]
    local eng, why = engine.engine()
    if not (name and eng) then return nil, errors.cannot_enforce("oci", why or "the sandbox's container is gone") end
    local ns = root_pid and proctree.pid_ns(root_pid)
    if not ns then return nil, errors.cannot_enforce("oci", "the container " .. name .. " has no process to join") end
    seq = seq + 1
    local tag = core.proc.getpid() .. "." .. seq
    local text, terr = env_lines(opts.env, tag)
    if not text then return nil, terr end
    local dir, derr = engine.private_dir()
    if not dir then return nil, errors.cannot_enforce("oci", tostring(derr)) end
    local ok, werr = engine.write_private(dir .. "/env", text)
    local root = tenant_root.plan(sb)
    local args = { "exec", "--interactive", "--user", root.uid .. ":" .. root.gid, "--workdir", opts.cwd or root.cwd,
      "--env-file", dir .. "/env" }
    if opts.ctty then args[#args + 1] = "--tty" end
    args[#args + 1] = name
    table.move(argv, 1, #argv, #args + 1, args)
    local full = engine.argv_of(eng, args)
    local proc, err
    if ok then
      proc, err = core.spawn.start({ plain = true, new_session = true, path = full[1], argv = full,
        env = engine.ENV, cwd = dir, stdin = opts.stdin, stdout = opts.stdout, stderr = opts.stderr })
    end
    if not proc then
      core.fs.remove_tree(dir)
      return nil, errors.cannot_enforce("oci", "cannot start the engine's exec: " .. tostring(err or werr))
    end
    local control = control_of(ns, tag)
    function control.finish() core.fs.remove_tree(dir) end
    return proc, nil, nil, control
  end
end

-- ---- a custom mechanism: its exec in a watched child ---------------------------------

-- The child: the client's fds as its own stdio, the keeper's loop forgotten, the
-- mechanism's exec watched (corral.mechanism.watch) with the forwarded signals; exits
-- with the command's status, or says why on the client's stderr and exits 125 (2 for a
-- refused argument).
local function child_main(mech, sb, argv, opts)
  require("corral.egress.loop").forget()
  core.io.dup_stdio(opts.stdin, opts.stdout, opts.stderr)
  local signals = core.signal.fd(M.FORWARDED)
  sb.env = opts.env or sb.env
  local ok, r, err = pcall(require("corral.mechanism.watch").exec, mech, sb, argv, { env = opts.env, cwd = opts.cwd },
    signals)
  if ok and r then core.proc.exit(math.tointeger(r.code) or 1) end
  err = ok and err or r
  io.stderr:write("corral exec: ", tostring(err), "\n")
  io.stderr:flush()
  core.proc.exit(type(err) == "table" and err.code == "invalid_argument" and core.exit.USAGE or core.exit.SETUP)
end

--- A join through a custom mechanism's `exec` (docs/mechanisms.md): a child per exec,
-- which runs it on the client's fds as `corral run` runs it, bounded by the host's
-- promises (corral.mechanism.watch). `opts.env` and `opts.cwd` are handed to the
-- callback (a mechanism built on a built-in one honours them).
-- @tparam table mech the loaded mechanism
-- @treturn function join(sb, argv, opts) → process, or nil and why
function M.watched(mech)
  return function(sb, argv, opts)
    if opts.ctty then
      return nil, errors.invalid_argument("-t", "a custom mechanism's exec has no terminal of the sandbox's own")
    end
    local child, pipe = core.spawn.fork()
    if child == false then child_main(mech, sb, argv, opts) end
    if not child then return nil, errors.cannot_enforce("process_isolation", "cannot fork: " .. tostring(pipe)) end
    pipe:close()
    return child
  end
end

-- ---- the mechanism a keeper uses --------------------------------------------------------

--- The mechanism a keeper holds its sandbox with: `mech` itself when it joins a running
-- sandbox (native, bwrap); oci with the engine's exec as `join`, the container's first
-- process as `root_pid` (a session is ready once it runs; -t's pty is of its devpts);
-- a custom mechanism with its watched exec as `join`, and no init (`start` is not
-- called: each exec is the callback's own).
-- @tparam table mech a loaded mechanism
-- @treturn table the mechanism, or a view of it
-- @treturn boolean whether the keeper starts a waiting init in it
function M.view(mech)
  local builtin = require("corral.mechanism").is_builtin(mech)
  if builtin and mech.join then return mech, true end
  local view = setmetatable({}, { __index = mech })
  if builtin and mech.name == "oci" then
    local join, pids = M.oci(mech), {}
    view.ready_timeout = require("corral.mechanism.oci.engine").config.timeout
    function view.join(sb, argv, opts) return join(sb, argv, opts, view.root_pid(sb)) end
    function view.root_pid(sb)
      if pids[sb.id] then return pids[sb.id] end
      local name = mech.containers(sb)[1]
      local out = name and require("corral.mechanism.oci.engine").call({ "inspect", "--format", "{{.State.Pid}}",
        name })
      local pid = math.tointeger(tonumber(out and out:match("%d+")))
      pids[sb.id] = pid and pid > 1 and pid or nil
      return pids[sb.id]
    end
    return view, true
  end
  view.join = M.watched(mech)
  function view.root_pid() return core.proc.getpid() end
  return view, false
end

return M
