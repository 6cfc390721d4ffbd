--- The `oci` mechanism: tenant sandboxes run as containers of an OCI engine (podman or
-- docker), for hosts whose own kernel cannot construct what native needs.
--
-- Every engine call is an argv with a timeout, never a shell; an engine's failure is
-- returned verbatim with the command that failed. The container's root is the tenant
-- root plan (corral.tenant_root) rendered into engine flags: the runtime bound read-only
-- at the same paths, the storage read-write at /storage, the workspace at /workspace
-- when set, a 64 MiB tmpfs /tmp, the plan's environment (through an env file, never the
-- engine's command line) and rlimits; the root read-only, `--cap-drop ALL`,
-- no-new-privileges, the tenant seccomp filter as a profile
-- (corral.mechanism.oci.seccomp), the plan's unprivileged host id as the user, and
-- memory, cpu and pids caps at create time. The image is corral's own, imported once and
-- cached by content (corral.mechanism.oci.image), or one the operator names.
--
-- Network: `--network none`; with an egress allowlist or a service_port the container
-- joins corral's own sandbox netns (`--network ns:PATH`, podman), made and programmed
-- before the container exists, as native's: the same acceptor, DNS responder and ruleset
-- apply, and a service_port is corral's inbound relay from 127.0.0.1:N on the host to the
-- port inside. The engine's own networks are never joined (a bridge would route the
-- sandbox to every other container on it, and out).
--
-- Constructed: resource_limits, filesystem_confinement, network_restriction. Stated
-- omissions (`M.OMITTED`, which the conformance suite reports):
--
-- * disk_quota: the engine's size option is refused by the overlay driver over ext4
--   (status 125, "… only supported for backingFS XFS"; tests/oci_spec.lua measures it on
--   each run); where it is accepted it bounds only the container's own layer, which is
--   read-only here, and /storage is a plain host directory.
-- * privilege_separation: the tenant runs as an unprivileged host id with no capability,
--   but in the host's user namespace and beside an engine that runs as root; corral
--   does not build the separation native does.
--
-- With `config.runtime` (a path to corral-runtime) podman runs every container under it,
-- and an allowlist goes to it as `corral.dev/` annotations (corral.mechanism.oci.annotate):
-- the plane is then the runtime's keeper's, one per container, and none is made here.
--
-- The pieces: the engine client and its configuration (corral.mechanism.oci.engine,
-- `M.config`), corral's image (corral.mechanism.oci.image), the root plan rendered into
-- engine flags (corral.mechanism.oci.render), runs and their signals
-- (corral.mechanism.oci.run), and the sweep of a dead corral's containers
-- (corral.mechanism.oci.marks). provision, status, address and serve are the shared life
-- cycle's (corral.mechanism.lifecycle).
-- @module corral.mechanism.oci
local errors = require "corral.errors"
local annotate = require "corral.mechanism.oci.annotate"
local lifecycle = require "corral.mechanism.lifecycle"
local resources = require "corral.resources"
local tenant_root = require "corral.tenant_root"
local engine = require "corral.mechanism.oci.engine"
local image = require "corral.mechanism.oci.image"
local marks = require "corral.mechanism.oci.marks"
local render = require "corral.mechanism.oci.render"
local run = require "corral.mechanism.oci.run"

local M = { name = "oci" }

--- The capabilities oci does not construct, each with why.
M.OMITTED = {
  disk_quota = "not constructed: the engine's size option (--storage-opt size=) is refused by the overlay " ..
    "driver unless it is backed by XFS (measured: tests/oci_spec.lua, \"the engine's size option\"), and " ..
    "where accepted bounds only the container's read-only layer; /storage is a plain host directory",
  privilege_separation = "not constructed: the tenant is an unprivileged host id without capabilities, but in " ..
    "the host's user namespace, beside an engine running as root",
}

--- What the operator may change (before the first provision): corral.mechanism.oci.engine's.
M.config = engine.config

M.engine, M.call, M.remove = engine.engine, engine.call, engine.remove
M.image = image.ensure
M.sweep = marks.sweep
M.SIGNAL_GRACE, M.EXEC_GRACE = run.SIGNAL_GRACE, run.EXEC_GRACE

local state = {} -- sandbox id → {storage_lock =, plane =, process =, name =, run =, ...}

--- What a sandbox under oci requires: the guarantees it constructs, plus nftables for an
-- egress plane (an allowlist or a service_port: corral programs it, as for native).
-- @tparam table sb
-- @treturn {string,...}
function M.required_capabilities(sb)
  local req = { "filesystem_confinement", "network_restriction" }
  if sb.limits and (sb.limits.memory or sb.limits.pids or sb.limits.cpu) then req[#req + 1] = "resource_limits" end
  if sb.network or sb.service_port then req[#req + 1] = "nftables" end
  return req
end

--- What oci constructs, for every sandbox (a service_port too: it is corral's relay
-- into corral's netns, never an engine network).
-- @treturn {string,...}
function M.constructed_capabilities()
  return { "resource_limits", "filesystem_confinement", "network_restriction", "workspace" }
end

--- What a sandbox gives up under oci, as `{capability = why}`: `OMITTED`, whatever the
-- sandbox asks for.
-- @treturn table
function M.reductions()
  local r = {}
  for k, v in pairs(M.OMITTED) do r[k] = v end
  return r
end

--- The engine's argv running argv in a new container of provisioned sandbox sb, as
-- `exec` spawns it when nothing was started (scripts/bench/launch times it bare beside
-- `corral run --mechanism oci`). Its env file is written into `dir`, the caller's.
-- @tparam table sb
-- @tparam {string,...} argv
-- @tparam string dir
-- @treturn[1] {string,...} the argv, the engine's path first
-- @return[2] nil
-- @treturn[2] table the error
function M.run_argv(sb, argv, dir)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  if st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is running: its commands join it")
  end
  local full, err = render.command(sb, st, argv, {}, dir)
  if not full then return nil, err end
  return full
end

-- Before anything is held: the engine, the sweep of a dead corral's containers, and the
-- sandbox as acquired (the engine's caps instead of corral's cgroup).
local function prepare(sb)
  local eng, why = engine.engine()
  if not eng then return nil, errors.cannot_enforce("oci", why) end
  marks.begin()
  if (sb.network or sb.service_port) and eng.kind ~= "podman" then
    return nil, errors.cannot_enforce("network_restriction", (sb.network and "an egress allowlist" or
      "a service_port") .. " under oci needs podman (--network ns:PATH joins corral's own netns); " .. eng.path ..
      " cannot join it, and corral does not put a sandbox on an engine network")
  end
  -- the engine binds the storage by its path: no idmapped mount (runc and podman here take
  -- no idmap option), so an operator-made storage is refused, saying so
  local view = {}
  for k, v in pairs(sb) do view[k] = v end
  view.limits = nil
  if engine.config.runtime then
    -- under corral-runtime the plane is its keeper's, one per container, from annotations
    if sb.service_port then
      return nil, errors.cannot_enforce("network_restriction", "a service_port under oci with config.runtime: " ..
        "corral-runtime has no inbound relay")
    end
    view.network = nil
  end
  return setmetatable(view, getmetatable(sb))
end

-- The image, once the storage and the egress plane are held; under corral-runtime, the
-- annotations that ask it for the plane.
local function ready(sb, st)
  if engine.config.runtime and sb.network then
    local flags, err = annotate.flags(sb.network)
    if not flags then return nil, err end
    st.annotations = flags
  end
  return image.ensure(tenant_root.plan(sb, st))
end

-- provision (the storage, owned by the sandbox's host id, and for an allowlist or a
-- service_port corral's egress plane, before any container exists), status, address, serve.
lifecycle.share(M, state, { prepare = prepare, ready = ready })

--- Starts argv as the sandbox's long-running container.
function M.start(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  if st.process and st.process:running() then
    return nil, errors.invalid_argument("sandbox", sb.id .. " is already running")
  end
  local r, err = run.spawn(sb, st, argv, opts or {})
  if not r then return nil, err end
  st.run, st.process, st.name, st.status = r, r.proc, r.name, "running"
  return true
end

--- Runs argv in the sandbox to completion (bounded by limits.wall), in the started
-- container when there is one.
-- @treturn table `{code =, how = "exited", limit = nil|"wall"|"memory"}`
function M.exec(sb, argv, opts)
  local st = state[sb.id]
  if not st then return nil, errors.invalid_argument("sandbox", sb.id .. " is not provisioned") end
  opts = opts or {}
  local r, err = run.spawn(sb, st, argv, opts, true)
  if not r then return nil, err end
  local code, how, _, signalled = require("corral.egress.loop").wait(r.proc, { serve = st.plane ~= nil,
    wall = sb.limits and sb.limits.wall, signals = opts.signals, grace = run.SIGNAL_GRACE, feeds = { r.feed },
    deliver = not r.joined and function(sig) return run.deliver(r, sig) end or nil })
  if not code then
    run.finish(r, true)
    if signalled then return { code = 128 + signalled, how = "killed" } end
    return { code = 128 + 9, how = "killed", limit = "wall" }
  end
  local result, cerr = run.classify(sb, r, code)
  -- The client itself killed by a signal (SIGPIPE when the reader of its output went
  -- away: `corral run … | head -1`) left its container running: it goes too.
  run.finish(r, how == "killed")
  return result, cerr
end

--- Waits for the container started by `start`.
function M.wait(sb, timeout)
  local st = state[sb.id]
  if not (st and st.run) then return nil, errors.invalid_argument("sandbox", "not started") end
  local code, how = st.process:wait(timeout)
  if not code then return nil, how end
  local result, err = run.classify(sb, st.run, code)
  run.finish(st.run, false)
  st.run, st.process, st.name, st.status = nil, nil, nil, "stopped"
  return result, err
end

--- Stops the started container (removed at once: the engine kills what runs in it).
function M.stop(sb)
  local st = state[sb.id]
  if not st then return true end
  if st.run then
    run.finish(st.run, true)
    st.run, st.process, st.name = nil, nil, nil
  end
  st.status = "stopped"
  return true
end

--- Stops and removes everything the sandbox holds but its storage.
function M.destroy(sb)
  local st = state[sb.id]
  if not st then return true end
  M.stop(sb)
  local ok, err = resources.release(st)
  state[sb.id] = nil
  if next(state) == nil then marks.release() end
  if not ok then return nil, err end
  return true
end

--- The engine's client of the container `start` left running (a live session's init), or nil.
function M.process_of(sb)
  local st = state[sb.id]
  return st and st.process or nil
end

--- The names of the containers a provisioned sandbox holds (for leak checks).
function M.containers(sb)
  local st = state[sb.id]
  local out = {}
  if st and st.name then out[#out + 1] = st.name end
  return out
end

return M
