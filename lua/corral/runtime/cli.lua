--- `corral-runtime`: an OCI runtime with runc's command line (the host run under that
-- name, core/host/main.c), which hands the container's life cycle to crun or runc
-- (corral.runtime.delegate) and adds corral's egress plane to a container whose
-- `corral.dev/*` annotations ask for one (corral.runtime.annotations). `create` (and
-- `run`) of such a container starts its keeper (corral.runtime.keeper), joins the
-- keeper's netns in the bundle's config.json (corral.runtime.bundle), then execs the
-- delegate; `delete` ends the keeper after the delegate's delete. Every other
-- subcommand, and a container without `corral.dev/` annotations, is the delegate's
-- alone: corral-runtime adds nothing where nothing was asked of it, so a node's other
-- containers run exactly as they would under the delegate.
-- @module corral.runtime.cli
local core = require "corral.core"
local errors = require "corral.errors"
local annotations = require "corral.runtime.annotations"
local bundle = require "corral.runtime.bundle"
local delegate = require "corral.runtime.delegate"
local state = require "corral.runtime.state"

local M = {}

-- Global flags that take a value (runc's and crun's), as `--flag value` or `--flag=value`.
local VALUED = { ["--root"] = true, ["--log"] = true, ["--log-format"] = true, ["--criu"] = true,
  ["--rootless"] = true, ["--cgroup-manager"] = true, ["--delegate"] = true }

--- Seconds `create` waits for the keeper's plane.
M.KEEPER_WAIT = 10

-- The option at words[i]: its name, its value (`--flag=value`, or the next word when
-- `valued[name]`), whether the value was inline, and the index after it.
local function option_at(words, i, valued)
  local name, value = words[i]:match("^(%-%-?[%w-]+)=(.*)$")
  if name then return name, value, true, i + 1 end
  name = words[i]
  if valued[name] then return name, words[i + 1], false, i + 2 end
  return name, nil, false, i + 1
end

--- Splits runc's command line: `{root =, log =, log_format =, passed = {global flags but
-- --root}, words = {subcommand, ...}}`.
function M.globals(argv)
  local g = { root = state.DEFAULT_ROOT, log_format = "text", passed = {}, words = {} }
  local i = 1
  while argv[i] and argv[i]:sub(1, 1) == "-" and argv[i] ~= "--version" and argv[i] ~= "-v"
      and argv[i] ~= "--help" and argv[i] ~= "-h" do
    local at = i
    local name, value, inline
    name, value, inline, i = option_at(argv, i, VALUED)
    if name == "--root" then
      g.root = value
    elseif name == "--delegate" then
      g.delegate = value -- corral-runtime's own: podman's --runtime-flag delegate=runc
    else
      if name == "--log" then g.log = value elseif name == "--log-format" then g.log_format = value end
      table.move(argv, at, inline and at or i - 1, #g.passed + 1, g.passed)
    end
  end
  table.move(argv, i, #argv, 1, g.words)
  return g
end

-- A subcommand's options that take a value (runc's create, run, exec, delete).
local SUB_VALUED = { ["--bundle"] = true, ["-b"] = true, ["--pid-file"] = true,
  ["--console-socket"] = true, ["--preserve-fds"] = true, ["--process"] = true, ["-p"] = true,
  ["--cwd"] = true, ["--env"] = true, ["-e"] = true, ["--user"] = true, ["-u"] = true,
  ["--process-label"] = true, ["--apparmor"] = true, ["--cap"] = true, ["-c"] = true }

--- A subcommand's bundle (default ".") and container id (its first word that is neither
-- an option nor an option's value).
function M.sub_options(words)
  local o = { bundle = "." }
  local i = 2
  while words[i] do
    local w = words[i]
    local name, value, _
    name, value, _, i = option_at(words, i, SUB_VALUED)
    if name == "--bundle" or name == "-b" then
      o.bundle = value
    elseif w:sub(1, 1) ~= "-" then
      o.id = o.id or w
    end
  end
  return o
end

-- A refusal: stderr and the engine's log; exit 2 for a malformed request, 3 for what
-- this node cannot enforce (docs/boundary.md, exit statuses).
local function refuse(g, err)
  local msg = "corral-runtime: " .. tostring(err)
  io.stderr:write(msg, "\n")
  state.log(g, "error", msg)
  if errors.is(err, "invalid_argument") then return core.exit.USAGE end
  if errors.is(err, "resource") then return core.exit.START_REFUSED end
  return errors.is(err, "cannot_enforce") and core.exit.CANNOT or 1
end

local function read_line(rd, seconds)
  local deadline, buf = core.clock.monotime() + seconds, ""
  while not buf:find("\n", 1, true) do
    local left = deadline - core.clock.monotime()
    if left <= 0 then return nil, "no answer within " .. seconds .. " s" end
    core.io.poll({ rd }, left)
    local chunk = core.io.read(rd, 4096)
    if chunk == "" then return nil, "it ended without a word" end
    buf = buf .. (chunk or "")
  end
  return buf:match("^[^\n]*")
end

-- Starts the keeper through `setsid -f`: a new session, a grandchild of this process,
-- no parent-death signal, so it outlives the runtime as conmon does.
local function start_keeper(argv0, g, id, dir)
  local setsid = core.path.resolve_executable("setsid")
  if not setsid or setsid:sub(1, 1) ~= "/" then
    return nil, errors.cannot_enforce("network_restriction", "setsid (util-linux) is not installed: the keeper "
      .. "could not outlive corral-runtime")
  end
  local rd, wr = core.io.pipe()
  local null, log = io.open("/dev/null"), io.open(dir .. "/keeper.log", "a")
  local proc, err = core.spawn.start({ plain = true, new_session = true, path = setsid,
    argv = { "setsid", "-f", argv0, "keeper", g.root, id }, env = delegate.environ(),
    stdin = null, stdout = wr, stderr = log })
  null:close()
  log:close()
  wr:close()
  if not proc then
    return nil, errors.cannot_enforce("network_restriction", "starting the keeper: " .. tostring(err))
  end
  proc:wait()
  proc:close()
  local line, why = read_line(rd, M.KEEPER_WAIT)
  rd:close()
  local pid, fd = (line or ""):match("^ready (%d+) (%d+)$")
  if pid then return "/proc/" .. pid .. "/fd/" .. fd, math.tointeger(tonumber(pid)) end
  local said = line and line:match("^error (.*)$") or why or line
  return nil, errors.cannot_enforce("network_restriction", "the container's egress plane: " .. tostring(said))
end

-- Removes what dead keepers left of containers the delegate no longer knows.
local function sweep(g)
  state.sweep(g.root, function(id) return delegate.knows(g, id) end)
  state.sweep_summaries(annotations.log_dir())
end

local function end_keeper(root, id)
  local k = state.keeper(root, id)
  if k and state.alive(k) then
    core.proc.kill(k.pid, 15)
    local deadline = core.clock.monotime() + 5
    while state.alive(k) and core.clock.monotime() < deadline do core.io.poll({}, 0.01) end
    if state.alive(k) then core.proc.kill(k.pid, 9) end
  end
  core.fs.remove_tree(state.dir(root, id))
end

-- Kubernetes (containerd's CRI): a pod's containers share its sandbox's network
-- namespace, and `pod_annotations` hands the pod's corral.dev/ keys to each of them. The
-- sandbox container (`io.kubernetes.cri.container-type` "sandbox") gets the keeper; each
-- other container of the pod joins that keeper's netns, or is refused when there is none.
local function pod_sandbox(ann)
  if ann["io.kubernetes.cri.container-type"] == "container" then
    return ann["io.kubernetes.cri.sandbox-id"] or ""
  end
end

local function join_pod(g, path, o, config, sandbox)
  local k = state.valid_id(sandbox) and state.keeper(g.root, sandbox) or nil
  if not (k and state.alive(k)) then
    return refuse(g, errors.cannot_enforce("network_restriction", "container " .. tostring(o.id) .. " of pod "
      .. "sandbox " .. sandbox .. ": the sandbox has no live corral keeper to join (it was not started by "
      .. "corral-runtime, or its keeper died)"))
  end
  local netns = "/proc/" .. k.pid .. "/fd/" .. k.fd
  bundle.confine(config, netns)
  local ok, err = bundle.write(o.bundle, config)
  if not ok then return refuse(g, err) end
  state.log(g, "info", string.format("corral-runtime: %s joins the egress plane of its pod's sandbox %s (keeper %d)",
    o.id, sandbox, k.pid))
  local _, xerr = delegate.exec(path, g, g.words)
  return refuse(g, errors.cannot_enforce("oci_runtime", tostring(xerr)))
end

local function create(argv0, g, path)
  local o = M.sub_options(g.words)
  local config, err = bundle.read(o.bundle)
  if not config then return refuse(g, err) end
  local network, opts = annotations.network(config.annotations)
  if network == nil then return refuse(g, opts) end
  -- a container of a pod whose sandbox has a keeper joins it, annotated or not
  local sandbox = pod_sandbox(config.annotations or {})
  if sandbox and (network or state.keeper(g.root, sandbox)) then return join_pod(g, path, o, config, sandbox) end
  if network == false then return delegate.exec(path, g, g.words) and 1 end
  if not state.valid_id(o.id) then
    return refuse(g, errors.invalid_argument("container id", tostring(o.id) .. ": letters, digits, _ + - . "
      .. "(not first)"))
  end
  sweep(g)
  local dir
  dir, err = state.make(g.root, o.id)
  if not dir then return refuse(g, errors.cannot_enforce("network_restriction", err)) end
  local req = { id = o.id, network = network, log = g.log, log_format = g.log_format,
    delegate_dir = g.root .. "/" .. delegate.SUBDIR, log_json = opts["log-json"], learn = opts.learn,
    summary = annotations.log_dir() .. "/" .. o.id .. ".summary.json" }
  local f = io.open(dir .. "/keeper.json", "w")
  f:write(require("corral.json").encode(req))
  f:close()
  local netns, pid = start_keeper(argv0, g, o.id, dir)
  if not netns then
    end_keeper(g.root, o.id)
    return refuse(g, pid)
  end
  local removed = bundle.confine(config, netns)
  local ok, werr = bundle.write(o.bundle, config)
  if not ok then
    end_keeper(g.root, o.id)
    return refuse(g, werr)
  end
  local caps = {}
  for c in pairs(removed.caps) do caps[#caps + 1] = c end
  table.sort(caps)
  state.log(g, "info", string.format("corral-runtime: %s joins the egress plane of keeper %d (%s)%s%s", o.id, pid,
    netns, #caps > 0 and "; capabilities dropped: " .. table.concat(caps, " ") or "",
    #removed.sysctls > 0 and "; sysctls dropped: " .. table.concat(removed.sysctls, " ") or ""))
  local _, xerr = delegate.exec(path, g, g.words)
  end_keeper(g.root, o.id)
  return refuse(g, errors.cannot_enforce("oci_runtime", tostring(xerr)))
end

local function delete(g, path)
  local o = M.sub_options(g.words)
  if not o.id or not state.valid_id(o.id) or not core.fs.lstat(state.dir(g.root, o.id)) then
    sweep(g)
    return delegate.exec(path, g, g.words) and 1
  end
  local code = delegate.call(path, g, g.words)
  if code ~= 0 and delegate.knows(g, o.id) then return code end
  end_keeper(g.root, o.id)
  sweep(g)
  return code
end

local USAGE = [[
usage: corral-runtime [--root DIR] [--log FILE] [--log-format text|json] [--delegate NAME|PATH] COMMAND ...

An OCI runtime with runc's command line: crun or runc (--delegate, CORRAL_RUNTIME_DELEGATE) runs the
container; a container annotated corral.dev/allow (internal, resolve, sni, idle, log-json,
learn) gets corral's egress plane. See docs/kubernetes.md.
]]

--- The entry point: `argv[0]` how the host was called, then runc's command line.
-- @treturn integer exit status
function M.main(argv)
  local g = M.globals(argv)
  local cmd = g.words[1]
  if cmd == "keeper" then return require("corral.runtime.keeper").main(g.words[2], g.words[3]) end
  if cmd == "--help" or cmd == "-h" or cmd == "help" or cmd == nil then
    io.stdout:write(USAGE)
    return cmd == nil and core.exit.USAGE or 0
  end
  local path, err = delegate.path(g.delegate)
  if not path then return refuse(g, err) end
  if cmd == "--version" or cmd == "-v" then
    io.stdout:write("corral-runtime ", core._VERSION or "", " (delegate: ", path, ")\n")
    io.stdout:flush()
    return delegate.exec(path, { root = g.root, passed = {} }, { "--version" }) and 1
  end
  if cmd == "create" or cmd == "run" then return create(argv[0], g, path) end
  if cmd == "delete" then return delete(g, path) end
  return delegate.exec(path, g, g.words) and 1
end

return M
