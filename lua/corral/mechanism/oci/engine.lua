--- The `oci` mechanism's engine client: which engine (podman or docker) it drives, with
-- what configuration, and every call to it as an argv with a timeout, never a shell. An
-- engine's failure is returned verbatim with the command that failed.
--
-- Configuration: `M.config` (engine, image, timeout) and `M.config.engines[NAME]` (global
-- flags, ulimits, extra run flags per engine), which the operator's Lua may change (as
-- corral.mechanism.oci's `config`). The defaults are what this host's podman needs:
-- `--runtime runc`, the cgroupfs manager, and explicit nofile and nproc ulimits (its
-- default nofile exceeds the hard limit).
-- @module corral.mechanism.oci.engine
local core = require "corral.core"
local file = require "corral.file"
local errors = require "corral.errors"
local shell = require "corral.shell"
local leftovers = require "corral.leftovers"

local M = {}

--- What the operator may change (before the first provision).
M.config = {
  engine = nil,  -- "podman", "docker" or a path; nil: the first of them on PATH
  image = nil,   -- an image to run instead of corral's own (it then supplies the runtime)
  timeout = 60,  -- seconds for each engine call that is not the tenant's own command
  runtime = nil, -- podman's OCI runtime instead of the one in `engines.podman.global`: a path to
                 -- corral-runtime, which then builds the egress plane (corral.mechanism.oci.annotate)
  engines = {
    podman = { global = { "--runtime", "runc", "--cgroup-manager", "cgroupfs" },
               ulimits = { nofile = "1024:1024", nproc = "1024:1024" }, run = {} },
    docker = { global = {}, ulimits = { nofile = "1024:1024", nproc = "1024:1024" }, run = {} },
  },
}

--- The environment of every engine process (its client included).
M.ENV = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }

local engine_cache, scratch = nil, nil

--- The engine to drive: `{path =, kind = "podman"|"docker", conf =}`, or nil and why.
-- @tparam[opt] string name overrides `M.config.engine`
function M.engine(name)
  name = name or M.config.engine
  if engine_cache and engine_cache.name == name then return engine_cache end
  for _, cand in ipairs(name and { name } or { "podman", "docker" }) do
    local path = cand:sub(1, 1) == "/" and cand or core.path.resolve_executable(cand)
    if path and path:sub(1, 1) == "/" and core.fs.lstat(path) then
      local kind = path:match("docker[^/]*$") and "docker" or "podman"
      engine_cache = { name = name, path = path, kind = kind, conf = M.config.engines[kind] or {} }
      return engine_cache
    end
  end
  return nil, name and (name .. " not found") or "neither podman nor docker is on PATH"
end

-- corral's own files for the engine (the seccomp profile, env files): a root-only
-- directory, never a name in a shared directory another user could have made.
local function scratch_dir()
  if scratch then return scratch end
  if core.proc.geteuid() == 0 then
    local dir = "/run/corral-oci"
    core.fs.mkdir(dir, tonumber("700", 8))
    local st = core.fs.lstat(dir)
    if st and st.type == "dir" and st.uid == 0 then scratch = dir return dir end
  end
  scratch = assert(core.fs.mkdtemp(leftovers.base() .. "/corral-oci-"))
  return scratch
end
M.scratch_dir = scratch_dir

--- Writes text to a new file only its owner may read (0600).
-- @treturn[1] string path
-- @return[2] nil
-- @treturn[2] string why
function M.write_private(path, text)
  local f, err = io.open(path, "wb")
  if not f then return nil, err end
  core.fs.chmod(path, tonumber("600", 8))
  f:write(text)
  f:close()
  return path
end

--- What the engine wrote to path ("" when it wrote nothing).
function M.read_all(path) return file.read(path) or "" end

--- A private directory (0700, in corral's root-only one) for one engine call: its working
-- directory, and its files (output, env file). conmon writes files such as `oom` into
-- its working directory, which must never be the caller's.
function M.private_dir()
  return leftovers.make(scratch_dir(), "call-")
end

--- The engine's argv for a subcommand: its path, the configured global flags, args.
function M.argv_of(eng, args)
  local full = { eng.path }
  local runtime, replaced = eng.kind == "podman" and M.config.runtime, false
  for _, v in ipairs(eng.conf.global or {}) do
    if runtime and full[#full] == "--runtime" then v, replaced = runtime, true end
    full[#full + 1] = v
  end
  if runtime and not replaced then
    full[#full + 1] = "--runtime"
    full[#full + 1] = runtime
  end
  for _, v in ipairs(args) do full[#full + 1] = v end
  return full
end

--- The argv of podman's OCI runtime (the one its global flags or `M.config.runtime` name,
-- at its default root, as podman's conmon runs it) for args; nil when the engine is not
-- podman or the runtime is not found.
function M.runtime_argv(args)
  local eng = M.engine()
  if not eng or eng.kind ~= "podman" then return nil end
  local runtime = M.config.runtime
  for i, v in ipairs(eng.conf.global or {}) do
    if not runtime and v == "--runtime" then runtime = eng.conf.global[i + 1] end
  end
  local path = runtime and (runtime:sub(1, 1) == "/" and runtime or core.path.resolve_executable(runtime))
  if not path or path:sub(1, 1) ~= "/" then return nil end
  local full = { path }
  table.move(args, 1, #args, 2, full)
  return full
end

-- Runs full (an engine's or its runtime's argv) to completion, at most
-- `M.config.timeout` seconds, in a private directory: as `call`.
local function run(full)
  local dir, derr = M.private_dir()
  if not dir then return nil, errors.cannot_enforce("oci", "a private directory for the engine: " .. tostring(derr)) end
  local out_path = dir .. "/out"
  local out, err_f = io.open(out_path, "w"), io.open(out_path .. ".err", "w")
  local devnull = io.open("/dev/null")
  local proc, serr = core.spawn.start({ plain = true, new_session = true, path = full[1], argv = full,
    env = M.ENV, cwd = dir, stdin = devnull, stdout = out, stderr = err_f })
  devnull:close()
  out:close()
  err_f:close()
  local code = 125
  if proc then
    code = proc:wait(M.config.timeout)
    if not code then
      proc:kill()
      proc:wait()
      code = nil
    end
    proc:close()
  end
  local stdout, stderr = M.read_all(out_path), M.read_all(out_path .. ".err")
  core.fs.remove_tree(dir)
  if code == 0 then return stdout end
  local what = not proc and ("cannot start: " .. tostring(serr))
    or not code and string.format("no answer within %d s", M.config.timeout)
    or string.format("status %d: %s", code, (stderr:gsub("%s+$", "")))
  return nil, errors.cannot_enforce("oci", "`" .. shell.join(full) .. "` failed (" .. what .. ")"), code
end

--- Runs an engine subcommand to completion (at most `M.config.timeout` seconds).
-- @tparam {string,...} args the subcommand and its arguments
-- @treturn[1] string its stdout
-- @return[2] nil
-- @treturn[2] table cannot_enforce("oci", the command and the engine's own words)
-- @treturn[2] integer the exit status
function M.call(args)
  local eng, why = M.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  return run(M.argv_of(eng, args))
end

--- Runs a subcommand of podman's OCI runtime (`runtime_argv`), as `call`.
function M.runtime_call(args)
  local full = M.runtime_argv(args)
  if not full then return nil, errors.cannot_enforce("oci", "no OCI runtime of podman's to call") end
  return run(full)
end

--- Removes a container at once (SIGKILL to what runs in it: podman's `rm --force`
-- otherwise sends SIGTERM first, which a tenant's init ignores, and waits).
-- @tparam string name
-- @return as `call`
function M.remove(name)
  local eng = M.engine()
  if eng and eng.kind == "podman" then return M.call({ "rm", "--force", "--time", "0", name }) end
  return M.call({ "rm", "--force", name })
end

return M
