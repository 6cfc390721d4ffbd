--- The `oci` mechanism's rendering of the tenant root plan (corral.tenant_root) into an
-- engine's argv: the runtime bound read-only at the same paths, the storage read-write
-- at /storage, the workspace at /workspace when set, a 64 MiB tmpfs /tmp, the plan's
-- environment (through an env file, never the engine's command line) and rlimits; the
-- root read-only, `--cap-drop ALL`, no-new-privileges, the tenant seccomp filter as a
-- profile (corral.mechanism.oci.seccomp), the plan's unprivileged host id as the user,
-- memory, cpu and pids caps, and the network: corral's own sandbox netns when it has an
-- egress plane (`--network ns:PATH`), else none (with, under corral-runtime, the
-- annotations asking it for its plane).
-- @module corral.mechanism.oci.render
local core = require "corral.core"
local errors = require "corral.errors"
local sandbox = require "corral.sandbox"
local tenant_root = require "corral.tenant_root"
local engine = require "corral.mechanism.oci.engine"
local image = require "corral.mechanism.oci.image"
local seccomp = require "corral.mechanism.oci.seccomp"

local M = {}

local seq = 0

-- The seccomp profile's file, named by its content.
local function profile_path()
  local text = seccomp.json()
  local path = engine.scratch_dir() .. "/seccomp-" .. core.digest.sha256(text):sub(1, 16) .. ".json"
  if not core.fs.lstat(path) then assert(engine.write_private(path, text)) end
  return path
end

-- One bind's --mount value. The engine reads it as a CSV record (podman and docker both),
-- so a path holding a comma would otherwise add options of its own (`DIR,src=/var/log`
-- mounted /var/log): each field that needs it is quoted, its quotes doubled.
local function mount_value(src, dest, ro)
  local function field(k, v)
    local f = k .. "=" .. v
    if f:find('[,"\r\n]') then f = '"' .. f:gsub('"', '""') .. '"' end
    return f
  end
  return table.concat({ "type=bind", field("src", src), field("dst", dest), ro and "ro=true" or nil }, ",")
end

-- The engine flags that build sb's root (everything between `run` and the image).
local function root_flags(sb, st, root, eng)
  local a = {}
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  add("--label", "corral.sandbox=" .. sb.id, "--label", "corral.owner=" .. core.proc.getpid(),
      "--user", root.uid .. ":" .. root.gid, "--hostname", root.hostname, "--workdir", root.cwd,
      "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
      "--security-opt", "seccomp=" .. profile_path(),
      "--tmpfs", string.format("/tmp:rw,nosuid,nodev,size=%dm,mode=1777", root.tmp_mib),
      -- the engine would also copy all the tenant prints into a log file on the host, with
      -- no bound (conmon's k8s-file: 192 MB for a 200 MB print); the attached streams stay
      "--log-driver", "none")
  if eng.kind == "podman" then
    -- the owner also as an annotation: podman hands annotations to its OCI runtime, whose
    -- own list then names the owner of a container podman has forgotten (marks.sweep)
    add("--read-only-tmpfs=false", "--pull", "never", "--annotation", "corral.owner=" .. core.proc.getpid())
  end
  if not engine.config.image then
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and (not m.optional or core.fs.lstat(m.src)) then
        add("--mount", mount_value(m.src, m.dest, not m.rw))
      end
    end
  else
    -- the operator's image shows its own runtime, with the sandbox's own name files over it
    for _, m in ipairs(root.mounts) do
      if m.type == "bind" and (m.rw or m.own) then add("--mount", mount_value(m.src, m.dest, not m.rw)) end
    end
  end
  local lim = sb.limits or {}
  if lim.memory then add("--memory", tostring(lim.memory), "--memory-swap", tostring(lim.memory)) end
  if lim.cpu then add("--cpus", tostring(lim.cpu)) end
  if lim.pids then add("--pids-limit", tostring(lim.pids)) end
  local ulimits = {}
  for k, v in pairs(eng.conf.ulimits or {}) do ulimits[k] = v end
  -- a table is a limit the host only hands down as it found it (corral.egress.fdlimit):
  -- the engine's own explicit ulimit stands for a container
  for k, v in pairs(root.rlimits) do
    if type(v) == "number" then ulimits[k] = v .. ":" .. v end
  end
  local names = {}
  for k in pairs(ulimits) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add("--ulimit", k .. "=" .. ulimits[k]) end
  if st.plane then
    add("--network", "ns:/proc/" .. core.proc.getpid() .. "/fd/" .. st.plane.netns:fileno())
  else
    -- a runtime that ignores the annotations leaves the container this new, empty netns
    add("--network", "none")
    for _, v in ipairs(st.annotations or {}) do a[#a + 1] = v end
  end
  for _, v in ipairs(eng.conf.run or {}) do a[#a + 1] = v end
  return a
end

-- The environment as an env file in a run's private directory (values on the engine's
-- command line would show in every host user's `ps`).
local function env_file(root, dir)
  for _, kv in ipairs(root.env) do
    if kv:find("[\n\r]") then
      return nil, errors.invalid_argument("env", kv:match("^[^=]*") .. ": a value with a newline cannot be passed " ..
        "to the engine")
    end
  end
  return engine.write_private(dir .. "/env", table.concat(root.env, "\n") .. "\n")
end

local function container_name(sb)
  seq = seq + 1
  local key = core.digest.sha256(sandbox.storage_path(sb)):sub(1, 12)
  return string.format("corral-%s-%d-%d", key, core.proc.getpid(), seq)
end

--- The argv (engine path first) running argv in sb: `run` of a new container, or `exec`
-- in the started one (`st.name`, while `st.process` runs). Its env file is written into
-- `dir`.
-- @tparam table sb
-- @tparam table st the mechanism's state for sb
-- @tparam {string,...} argv
-- @tparam table opts `stdout` (nil: the client is interactive)
-- @tparam string dir
-- @treturn[1] {string,...} the argv
-- @treturn[1] string the container's name
-- @treturn[1] boolean whether it joins the started container
-- @return[2] nil
-- @treturn[2] table the error
function M.command(sb, st, argv, opts, dir)
  local eng, why = engine.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  local root = tenant_root.plan(sb, st)
  local env, eerr = env_file(root, dir)
  if not env then return nil, eerr end
  local interactive = opts.stdout == nil and { "--interactive" } or {}
  if st.process and st.process:running() and st.name then
    local args = { "exec", "--user", root.uid .. ":" .. root.gid, "--workdir", root.cwd, "--env-file", env }
    table.move(interactive, 1, #interactive, #args + 1, args)
    args[#args + 1] = st.name
    table.move(argv, 1, #argv, #args + 1, args)
    return engine.argv_of(eng, args), st.name, true
  end
  local img, ierr = image.ensure(root)
  if not img then return nil, ierr end
  local name = container_name(sb)
  -- The engine's client forwards no signal (--sig-proxy=false): corral delivers them
  -- itself (see `deliver`), since a client signalled before its proxy is up exits 0
  -- and leaves the container running.
  local args = { "run", "--rm", "--sig-proxy=false", "--name", name, "--env-file", env }
  table.move(interactive, 1, #interactive, #args + 1, args)
  local flags = root_flags(sb, st, root, eng)
  table.move(flags, 1, #flags, #args + 1, args)
  args[#args + 1] = img
  -- In corral's own image the command goes through the tenant's /bin/sh (runc's own
  -- failure is status 1, or the engine's 125: tenant_root.shell_argv). An operator's
  -- image need not hold a shell: the command is its first process as given.
  local cmd = engine.config.image and argv or tenant_root.shell_argv(argv)
  table.move(cmd, 1, #cmd, #args + 1, args)
  return engine.argv_of(eng, args), name, false
end

return M
