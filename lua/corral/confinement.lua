--- Control-plane confinement: a *trusted* process that holds a credential, confined to
-- one directory.
--
-- The mirror image of a tenant sandbox, not a smaller one: the environment passes
-- through (credential included) and egress is permitted. A distinct entry point on
-- purpose: no option here reaches the tenant profile, nor the reverse. `confine`
-- returns a launch spec or `cannot_enforce`, never a spec with the confinement omitted
-- (docs/architecture.md, invariant 1).
-- @module corral.confinement
local core = require "corral.core"
local confine_wrapper = require "corral.confine_wrapper"
local errors = require "corral.errors"
local protected = require "corral.confinement.protected"
local state_dir = require "corral.state_dir"
local probe = require "corral.probe"

local M = {}

local KNOWN_OPTS = { permit_path = true, env = true, cd = true, permit_extra_subpaths = true, layers = true,
                     read_only = true, writable = true }

-- Each layer the caller may name, and the probe that establishes it.
local LAYER_PROBES = { ns = "confinement.namespace", bwrap = "confinement.bwrap", landlock = "confinement.landlock" }

local function has_nul(s)
  return s:find("\0", 1, true) ~= nil
end

-- An absolute path argument as text, or the error naming the argument.
local function check_path_text(name, value)
  if type(value) ~= "string" then
    return errors.invalid_argument(name, "must be a string path, got " .. type(value))
  end
  if value == "" then return errors.invalid_argument(name, "is empty") end
  if has_nul(value) then return errors.invalid_argument(name, "contains a NUL byte") end
  if value:find("[\n\r]") then
    return errors.invalid_argument(name, "contains a newline")
  end
  if value:sub(1, 1) ~= "/" then
    return errors.invalid_argument(name, "must be absolute, got " .. value)
  end
end

-- The refusal of a resolved path `check` (one of core.rootplan's rules) refuses, or that
-- holds corral's host key (corral.state_dir); nil when it may be granted.
local function unfit(name, resolved, check)
  local ok, why = check(resolved)
  local reason = (not ok and why) or state_dir.refusal(resolved)
  if reason then return errors.invalid_argument(name, resolved .. " " .. reason) end
end

-- Resolves an absolute directory argument, or explains which argument is wrong.
local function resolve_dir(name, value)
  local bad = check_path_text(name, value)
  if bad then return nil, bad end
  local resolved, err = core.path.resolve(value)
  if not resolved then return nil, errors.invalid_argument(name, err) end
  -- exec-confined's own boundary rules: not /, not on the kernel's and devices'
  -- filesystems, not inside the runtime read set
  local refused = unfit(name, resolved, core.rootplan.check_boundary)
  if refused then return nil, refused end
  return resolved
end

-- An extra grant: a directory (read-write, as the boundary), or one regular file
-- (read-only) or unix socket (to connect to) granted alone. Returns the resolved path
-- and "dir", "file" or "socket", or nil and the error.
local function resolve_extra(name, value)
  local bad = check_path_text(name, value)
  if bad then return nil, bad end
  local resolved, err = core.path.resolve_file(value)
  if not resolved then return nil, errors.invalid_argument(name, err) end
  local st, serr = core.fs.lstat(resolved)
  if not st then return nil, errors.invalid_argument(name, serr) end
  if st.type == "dir" then
    local dir, derr = resolve_dir(name, value)
    return dir, dir and "dir" or derr
  end
  if st.type ~= "file" and st.type ~= "socket" then
    return nil, errors.invalid_argument(name, resolved .. " is neither a directory, a regular file nor a unix socket")
  end
  -- the wrapper's own rules for a file granted alone: no credential store, nothing the
  -- runtime read set shows already, nothing on the kernel's filesystems
  local refused = unfit(name, resolved, core.rootplan.check_file)
  if refused then return nil, refused end
  -- another name of a file (a hard link) may be a credential store's: only the path the
  -- rules above judged is shown
  if st.nlink and st.nlink > 1 then
    return nil, errors.invalid_argument(name, string.format("%s has %d hard links: another of its names may be " ..
      "a file that is never handed (a credential store); give a file with one name", resolved, st.nlink))
  end
  return resolved, st.type
end

-- The environment as {name, value} pairs: the caller's order for a list, sorted by
-- name for a map; values unmodified.
local function normalise_env(env)
  if env == nil then return {} end
  if type(env) ~= "table" then
    return nil, errors.invalid_argument("env", "must be a table, got " .. type(env))
  end
  local out = {}
  local function add(name, value)
    if type(name) ~= "string" or name == "" or name:find("[=%z]") then
      return errors.invalid_argument("env", "bad variable name " .. string.format("%q", name))
    end
    if type(value) ~= "string" or has_nul(value) then
      return errors.invalid_argument("env", "value of " .. name .. " must be a string without NUL")
    end
    out[#out + 1] = { name, value }
  end
  if #env > 0 then
    for _, pair in ipairs(env) do
      if type(pair) ~= "table" then
        return nil, errors.invalid_argument("env", "list entries must be {name, value} pairs")
      end
      local e = add(pair[1], pair[2])
      if e then return nil, e end
    end
  else
    local names = {}
    for k in pairs(env) do names[#names + 1] = k end
    table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(names) do
      local e = add(k, env[k])
      if e then return nil, e end
    end
  end
  return out
end

local function check_command(command)
  if type(command) ~= "table" then
    return nil, nil, errors.invalid_argument("command", "must be {cmd, args}")
  end
  local cmd = command.cmd or command[1]
  local args = command.args or command[2] or {}
  if type(cmd) ~= "string" or cmd == "" or has_nul(cmd) then
    return nil, nil, errors.invalid_argument("cmd", "must be a non-empty string without NUL")
  end
  if type(args) ~= "table" then
    return nil, nil, errors.invalid_argument("args", "must be a list of strings")
  end
  for i, a in ipairs(args) do
    if type(a) ~= "string" or has_nul(a) then
      return nil, nil, errors.invalid_argument("args", "entry " .. i .. " must be a string without NUL")
    end
  end
  return cmd, args
end

local function check_opts(opts)
  if type(opts) ~= "table" then
    return nil, errors.invalid_argument("opts", "must be a table")
  end
  for k in pairs(opts) do
    if not KNOWN_OPTS[k] then
      return nil, errors.invalid_argument(tostring(k), "unknown option")
    end
  end
  if opts.permit_path == nil then
    return nil, errors.invalid_argument("permit_path", "is required")
  end
  local permit, err = resolve_dir("permit_path", opts.permit_path)
  if not permit then return nil, err end
  local extras, kinds = {}, {}
  local list = opts.permit_extra_subpaths or {}
  if type(list) ~= "table" then
    return nil, errors.invalid_argument("permit_extra_subpaths", "must be a list of paths")
  end
  for i, p in ipairs(list) do
    local r, kind = resolve_extra("permit_extra_subpaths[" .. i .. "]", p)
    if not r then return nil, kind end
    extras[i], kinds[i] = r, kind
  end
  -- a file inside a granted directory is granted already: bound alone it would only turn
  -- read-only (or, a socket, fail to bind)
  for i, x in ipairs(extras) do
    local inside = core.path.is_beneath(x, permit)
    for k, d in ipairs(extras) do inside = inside or (kinds[k] == "dir" and core.path.is_beneath(x, d)) end
    if kinds[i] ~= "dir" and inside then
      return nil, errors.invalid_argument("permit_extra_subpaths[" .. i .. "]", x ..
        " is inside the boundary (permit_path or a directory extra) already")
    end
  end
  local roots = { permit }
  for i, x in ipairs(extras) do
    if kinds[i] == "dir" then roots[#roots + 1] = x end
  end
  local lists = { read_only = {}, writable = {} }
  for _, field in ipairs({ "read_only", "writable" }) do
    if type(opts[field] or {}) ~= "table" then return nil, errors.invalid_argument(field, "must be a list of paths") end
    for i, p in ipairs(opts[field] or {}) do
      local r, rerr = protected.resolve(field .. "[" .. i .. "]", p, field == "read_only", roots, check_path_text)
      if not r then return nil, rerr end
      lists[field][i] = r
    end
  end
  local cd = permit
  if opts.cd ~= nil then
    local e
    cd, e = resolve_dir("cd", opts.cd)
    if not cd then return nil, e end
    local inside = core.path.is_beneath(cd, permit)
    for _, x in ipairs(extras) do inside = inside or core.path.is_beneath(cd, x) end
    if not inside then
      -- a child started outside the boundary resolves every relative path outside it and
      -- cannot even getcwd
      return nil, errors.invalid_argument("cd", cd .. " is outside the boundary " .. permit)
    end
  end
  local env, e = normalise_env(opts.env)
  if not env then return nil, e end
  local layers
  if opts.layers ~= nil then
    local names = type(opts.layers) == "string" and {} or opts.layers
    if type(opts.layers) == "string" then
      for l in opts.layers:gmatch("[^,]+") do names[#names + 1] = l end
    end
    if type(names) ~= "table" or #names == 0 or #names > 2 then
      return nil, errors.invalid_argument("layers", "must name one or two layers: ns or bwrap, and landlock")
    end
    local seen = {}
    for _, l in ipairs(names) do
      if not LAYER_PROBES[l] or seen[l] then
        return nil, errors.invalid_argument("layers", tostring(l) .. ": not a layer (ns, bwrap, landlock), or " ..
          "named twice")
      end
      seen[l] = true
    end
    if seen.ns and seen.bwrap then
      return nil, errors.invalid_argument("layers", "ns and bwrap are two builders of one layer: name one")
    end
    layers = names
  end
  return { permit = permit, extras = extras, kinds = kinds, cd = cd, env = env, layers = layers, roots = roots,
           read_only = lists.read_only, writable = lists.writable }
end

--- The confinement layers that hold on this host (probed once per process).
-- @treturn {string,...} layer names in order, a subset of {"ns", "landlock"}
-- @treturn string what the probes saw
-- @return[2] nil when a probe is not known (a resource ran out while probing: never
--   fewer layers for it)
-- @treturn[2] table the `resource` refusal
function M.layers()
  local ns = probe.check("confinement.namespace")
  local ll = probe.check("confinement.landlock")
  for _, r in ipairs({ ns, ll }) do
    if r.ran_out then return nil, probe.refusal(r) end
  end
  local layers = {}
  local detail = string.format("namespace: %s; landlock: %s", ns.detail, ll.detail)
  if ns.holds then
    layers[#layers + 1] = "ns"
  else
    -- bubblewrap builds the namespace layer where corral cannot
    local bw = probe.check("confinement.bwrap")
    if bw.ran_out then return nil, probe.refusal(bw) end
    if bw.holds then layers[#layers + 1] = "bwrap" end
    detail = detail .. "; bwrap layer: " .. bw.detail
  end
  if ll.holds then layers[#layers + 1] = "landlock" end
  return layers, detail
end

-- The layers the caller named, each of which must hold here (ns first, as the wrapper
-- builds them), or nil and cannot_enforce naming the first that does not.
local function chosen_layers(names)
  local layers = {}
  for _, want in ipairs({ "ns", "bwrap", "landlock" }) do
    for _, l in ipairs(names) do
      if l == want then
        local r = probe.check(LAYER_PROBES[l])
        if not r.holds then return nil, probe.refusal(r) end
        layers[#layers + 1] = l
      end
    end
  end
  return layers
end

local function linux_spec(cmd, args, o)
  local layers, detail
  if o.layers then
    layers, detail = chosen_layers(o.layers)
    if not layers then return nil, detail end
  else
    layers, detail = M.layers()
    if not layers then return nil, detail end
  end
  if #layers == 0 then
    return nil, errors.cannot_enforce("filesystem_confinement",
      "neither the namespace layer nor Landlock holds here: " .. detail)
  end
  local host, why = core.proc.host_executable()
  if not host then return nil, errors.cannot_enforce("filesystem_confinement", why) end
  local resolved, err = core.path.resolve_executable(cmd)
  if not resolved then return nil, errors.invalid_argument("cmd", cmd .. ": " .. err) end
  local plan, perr = protected.plan(o.roots, o.read_only, o.writable)
  if not plan then return nil, perr end
  local read_only, ro_args = protected.for_layers(plan, layers, #o.read_only)
  if not read_only then return nil, ro_args end
  local wargs = { "exec-confined", "--layers", table.concat(layers, ","), "--permit", o.permit }
  for _, x in ipairs(o.extras) do
    wargs[#wargs + 1] = "--extra"
    wargs[#wargs + 1] = x
  end
  table.move(ro_args, 1, #ro_args, #wargs + 1, wargs)
  wargs[#wargs + 1] = "--cd"
  wargs[#wargs + 1] = o.cd
  -- a wrapper whose layer fails drops the probe results that chose it (corral.probe_cache)
  local kept = require("corral.probe_cache").path()
  if kept then
    wargs[#wargs + 1] = "--probe-cache"
    wargs[#wargs + 1] = kept
  end
  wargs[#wargs + 1] = "--"
  wargs[#wargs + 1] = resolved
  for _, a in ipairs(args) do wargs[#wargs + 1] = a end
  return { cmd = confine_wrapper.beside(host), args = wargs, env = o.env, cd = o.cd, layers = layers,
           read_only = read_only }
end

--- The macOS launch spec: `sandbox-exec -p <profile> <resolved cmd> args…`, public so
-- that the profile can be checked on any host.
-- @tparam table command `{cmd, args}`
-- @tparam table opts as for `confine`
-- @treturn table the spec, `profile` holding the SBPL text; or nil and an error
function M.sandbox_exec_spec(command, opts)
  local cmd, args, err = check_command(command)
  if not cmd then return nil, err end
  local o, e = check_opts(opts)
  if not o then return nil, e end
  if #o.read_only > 0 then
    return nil, errors.cannot_enforce("read_only_paths", "not rendered for sandbox-exec")
  end
  local sbpl = require "corral.sbpl"
  local dirs, files, sockets = {}, {}, {}
  local by_kind = { dir = dirs, file = files, socket = sockets }
  for i, x in ipairs(o.extras) do
    local list = by_kind[o.kinds[i]]
    list[#list + 1] = x
  end
  local profile, perr = core.sbpl.emit(o.permit, dirs, sbpl.runtime_read_paths(), files, sockets)
  if not profile then return nil, errors.invalid_argument("permit_path", perr) end
  local resolved = core.path.resolve_executable(cmd) or cmd
  local sargs = { "-p", profile, resolved }
  for _, a in ipairs(args) do sargs[#sargs + 1] = a end
  return { cmd = "/usr/bin/sandbox-exec", args = sargs, env = o.env, cd = o.cd,
           layers = { "seatbelt" }, profile = profile }
end

--- Builds a launch spec confining `command` to `opts.permit_path`.
-- @tparam table command `{cmd, args}` (or `{cmd = , args = }`)
-- @tparam table opts `permit_path` (an existing directory), `env` (a map or a list of
--   pairs, passed through), `cd` (inside the boundary; default permit_path),
--   `permit_extra_subpaths` (default `{}`: each a directory, read-write, or one regular
--   file, read-only, or unix socket, to connect to, granted alone), `layers` (Linux: the layers to build, a list
--   or "ns,landlock"; each must hold. Default: every one that holds. A command that makes
--   its own mount namespace inside (bubblewrap) needs one without landlock: the kernel
--   refuses mount(2) to a process Landlock restricts), `read_only` (paths inside the
--   boundary kept read-only besides the defaults, corral.confinement.protected),
--   `writable` (paths whose default protection is dropped, with everything beneath them)
-- @treturn table `{cmd, args, env, cd, layers, read_only}`, `cmd` the confinement
--   wrapper, `read_only` what is kept read-only and what is not; or nil
--   and `cannot_enforce`/`invalid_argument`
function M.confine(command, opts)
  local cmd, args, err = check_command(command)
  if not cmd then return nil, err end
  local o, e = check_opts(opts)
  if not o then return nil, e end
  local sys = core.proc.uname()
  if sys == "Linux" then return linux_spec(cmd, args, o) end
  if sys == "Darwin" then return M.sandbox_exec_spec(command, opts) end
  return nil, errors.cannot_enforce("filesystem_confinement",
    "no confinement backend for " .. tostring(sys))
end

--- Launches a spec in place of this process (`execve`); returns only on failure.
-- @tparam table spec a launch spec from `confine`
-- @return nil, message, errno
function M.exec(spec)
  local envp = {}
  for i, pair in ipairs(spec.env) do envp[i] = pair[1] .. "=" .. pair[2] end
  -- In the corral host whose wrapper the spec names (itself, or the wrapper program beside
  -- it: the same code), become that wrapper here: the same arguments, environment and
  -- directory, one start-up fewer (core/host/main.c).
  local ok, host = pcall(require, "corral.host")
  local self = ok and core.proc.host_executable()
  if self and spec.args[1] == "exec-confined" and (spec.cmd == self or spec.cmd == confine_wrapper.beside(self)) then
    return host.exec_confined(spec.args, envp, spec.cd)
  end
  local argv = { spec.cmd }
  for _, a in ipairs(spec.args) do argv[#argv + 1] = a end
  return core.proc.execve(spec.cmd, argv, envp, spec.cd)
end

return M
