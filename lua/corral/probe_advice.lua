--- What to change when a probe does not hold because corral itself runs in a container.
--
-- A container engine's defaults withhold exactly what corral builds with: capabilities
-- (CAP_SYS_ADMIN for mounts, network namespaces and the tenant's id maps; CAP_NET_ADMIN
-- for nftables), a fresh /proc (refused while parts of the container's own are masked),
-- a writable cgroupfs, and, under some seccomp or AppArmor profiles, user namespaces and
-- Landlock. Each such piece is established here from what this process can see
-- (/proc/self/status, /proc/self/mountinfo, an unshare(1) attempt, the Landlock ABI
-- call's errno), never assumed from being in a container, and is named with the engine
-- flag that provides it. Container advice is given only when a container is detected
-- (`M.container`), with the evidence that detected it.
--
-- Measured with podman (tests/container_spec.lua): under its defaults the native tenant
-- lacks CAP_SYS_ADMIN (id maps, then mounts refused), the unmasked /proc (a fresh /proc
-- mount refused), CAP_NET_ADMIN (nftables) and a writable cgroupfs; `--cap-add
-- SYS_ADMIN,NET_ADMIN --security-opt unmask=ALL -v /sys/fs/cgroup:/sys/fs/cgroup:rw`
-- makes every probe but disk_quota hold. The docker and Kubernetes forms are those
-- engines' own equivalents of the same settings.
-- @module corral.probe_advice
local core = require "corral.core"
local shell = require "corral.shell"

local M = {}

local read = require("corral.file").read

local function trim(s) return (tostring(s or ""):gsub("%s+$", "")) end

--- Whether this process runs in a container, and the evidence.
-- The marker files the engines write (/run/.containerenv by podman, /.dockerenv by
-- docker), Kubernetes' service variables, or an engine's name in our cgroup path; PID 1's
-- name is reported beside them but never decides alone (a minimal init is not a container).
-- @treturn[1] table `{engine = "podman"|"docker"|"kubernetes"|"container", evidence = string}`
-- @treturn[2] nil not detected
function M.container()
  local pid1 = trim(read("/proc/1/comm"))
  local function found(engine, evidence)
    return { engine = engine, evidence = evidence .. (pid1 ~= "" and ", PID 1 " .. pid1 or "") }
  end
  if os.getenv("KUBERNETES_SERVICE_HOST") then return found("kubernetes", "KUBERNETES_SERVICE_HOST is set") end
  if core.fs.lstat("/run/.containerenv") then return found("podman", "/run/.containerenv") end
  if core.fs.lstat("/.dockerenv") then return found("docker", "/.dockerenv") end
  local cg = read("/proc/self/cgroup") or ""
  if cg:find("kubepods", 1, true) then return found("kubernetes", "cgroup path kubepods") end
  if cg:find("libpod", 1, true) then return found("podman", "cgroup path libpod") end
  for _, name in ipairs({ "docker", "containerd", "lxc" }) do
    if cg:find("/" .. name, 1, true) then
      return found(name == "docker" and "docker" or "container", "cgroup path " .. name)
    end
  end
  return nil
end

-- A capability bit of CapEff in /proc/self/status.
local function has_cap(status, bit)
  local eff = status:match("CapEff:%s*(%x+)")
  return eff ~= nil and ((tonumber(eff, 16) or 0) >> bit) & 1 == 1
end

local CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21

local SECCOMP_OFF = { any = "--security-opt seccomp=unconfined",
                      kubernetes = "securityContext.seccompProfile.type: Unconfined" }

-- Why an unprivileged user namespace is refused here, and the cause's key; nil when it is made.
local function userns_missing(f)
  local unshare = core.path.resolve_executable("unshare")
  if not unshare or unshare:sub(1, 1) ~= "/" then return nil end
  local out, code = shell.capture({ unshare, "-U", "/bin/true" })
  if code == 0 then return nil end
  local why = "unshare(CLONE_NEWUSER) is refused (" .. trim(out):gsub("^unshare: ", "") .. ")"
  if trim(read("/proc/sys/user/max_user_namespaces")) == "0" then
    return why .. ": user.max_user_namespaces is 0", "sysctl"
  end
  if f.euid ~= 0 and trim(read("/proc/sys/kernel/unprivileged_userns_clone")) == "0" then
    return why .. ": kernel.unprivileged_userns_clone is 0", "sysctl"
  end
  if f.euid ~= 0 and trim(read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")) == "1" then
    return why .. ": kernel.apparmor_restrict_unprivileged_userns is 1", "sysctl"
  end
  local aa = trim(read("/proc/self/attr/apparmor/current") or read("/proc/self/attr/current"))
  if aa ~= "" and not aa:find("^unconfined") then return why .. " under the AppArmor profile " .. aa, "apparmor" end
  if f.status:match("Seccomp:%s*2") then return why .. " under a seccomp filter", "seccomp" end
  return why
end

-- Each piece: `missing(facts)` returns why it is missing (a phrase) or nil, and `flag`
-- what provides it, per engine (`any` when every engine spells it alike; nil when no
-- container setting can).
local PIECES = {
  userns = {
    missing = userns_missing,
    flag = {
      seccomp = SECCOMP_OFF,
      apparmor = { any = "--security-opt apparmor=unconfined",
                   kubernetes = "securityContext.appArmorProfile.type: Unconfined" },
      sysctl = { host = "raise it on the host (a container shares the host kernel's setting)" },
    },
  },
  -- Without root, the egress plane's netns is made in a user namespace of the caller's
  -- own (corral.egress.plane.new_netns): it must be allowed, and hold its capabilities.
  -- Ubuntu's restriction makes the namespace but gives it none (AppArmor's
  -- unprivileged_userns profile denies every capability), which unshare -U alone passes.
  userns_caller = {
    missing = function(f)
      if f.euid == 0 then return nil end
      local why, cause = userns_missing(f)
      if why then return why, cause end
      if trim(read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")) == "1" then
        return "kernel.apparmor_restrict_unprivileged_userns is 1: a user namespace of the caller's own is made, "
          .. "but AppArmor gives it no capability, so its network namespace cannot be programmed", "apparmor_userns"
      end
    end,
    flag = {
      seccomp = SECCOMP_OFF,
      apparmor = { any = "--security-opt apparmor=unconfined",
                   kubernetes = "securityContext.appArmorProfile.type: Unconfined" },
      sysctl = { host = "raise it on the host (a container shares the host kernel's setting)" },
      apparmor_userns = { host = "an AppArmor profile granting userns to the corral executable (as the "
        .. "distribution ships for bwrap), or kernel.apparmor_restrict_unprivileged_userns=0 on the host" },
    },
  },
  cap_sys_admin = {
    missing = function(f)
      if f.euid == 0 and not has_cap(f.status, CAP_SYS_ADMIN) then
        return "no CAP_SYS_ADMIN (mounts, network namespaces and the tenant's id maps need it)"
      end
    end,
    flag = { { any = "--cap-add SYS_ADMIN", kubernetes = "securityContext.capabilities.add: [SYS_ADMIN]" } },
  },
  proc_masked = {
    missing = function(f)
      -- The kernel refuses a fresh proc mount in a new user namespace while a mount
      -- covers something inside the visible one (fs/namespace.c, mnt_already_visible);
      -- an automount point such as binfmt_misc covers an empty directory and is allowed.
      local n = 0
      for _, m in ipairs(f.mounts) do
        if m.point:find("^/proc/") and m.fstype ~= "binfmt_misc" and m.fstype ~= "autofs" then n = n + 1 end
      end
      if n > 0 then return n .. " paths of /proc are masked or read-only, so a fresh /proc mount is refused" end
    end,
    flag = { { podman = "--security-opt unmask=ALL", docker = "--security-opt systempaths=unconfined",
               kubernetes = "securityContext.procMount: Unmasked" } },
  },
  cap_net_admin = {
    missing = function(f)
      if f.euid == 0 and not has_cap(f.status, CAP_NET_ADMIN) then return "no CAP_NET_ADMIN (nftables)" end
    end,
    flag = { { any = "--cap-add NET_ADMIN", kubernetes = "securityContext.capabilities.add: [NET_ADMIN]" } },
  },
  cgroup_ro = {
    missing = function(f)
      for _, m in ipairs(f.mounts) do
        if m.point:find("^/sys/fs/cgroup") and m.fstype:find("^cgroup") and ("," .. m.opts .. ","):find(",ro,") then
          return "cgroupfs is read-only (" .. m.point .. "), so no cgroup can be made for resource limits"
        end
      end
    end,
    flag = { { podman = "-v /sys/fs/cgroup:/sys/fs/cgroup:rw",
               docker = "--cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw",
               kubernetes = "securityContext.privileged: true" } },
  },
  landlock = {
    missing = function(f)
      local abi, err, errno = core.landlock.abi()
      if abi then return nil end
      if errno == 95 then
        return "Landlock is built into the kernel but not enabled (" .. tostring(err) .. ")", "lsm"
      end
      if f.status:match("Seccomp:%s*2") then
        return "landlock_create_ruleset fails under a seccomp filter (" .. tostring(err) .. ")", "seccomp"
      end
      return "the kernel has no Landlock (" .. tostring(err) .. ")", "kernel"
    end,
    flag = {
      seccomp = SECCOMP_OFF,
      lsm = { host = "add landlock to the host's lsm= boot parameter (no container setting enables it)" },
      kernel = { host = "a kernel built with CONFIG_SECURITY_LANDLOCK (5.13 or later)" },
    },
  },
}

local TENANT = { "userns", "cap_sys_admin", "proc_masked" }
local WRAPPER = { "userns", "proc_masked" }

-- The pieces each probe needs, in the order a fix should name them.
local NEEDS = {
  filesystem_confinement = TENANT, network_restriction = TENANT, privilege_separation = TENANT,
  user_namespaces = TENANT, seccomp = TENANT,
  resource_limits = { "userns", "cap_sys_admin", "proc_masked", "cgroup_ro" },
  cgroups = { "cgroup_ro" },
  nftables = { "userns_caller", "cap_sys_admin", "cap_net_admin" },
  ["confinement.namespace"] = WRAPPER, ["confinement.bwrap"] = WRAPPER,
  ["confinement.landlock"] = { "landlock" }, tier = { "landlock" },
}

local facts_cache, piece_cache = nil, {}

local function facts()
  if not facts_cache then
    local mounts = {}
    for line in (read("/proc/self/mountinfo") or ""):gmatch("[^\n]+") do
      local point, opts, fstype = line:match("^%S+ %S+ %S+ %S+ (%S+) (%S+) .-%- (%S+)")
      if point then mounts[#mounts + 1] = { point = point, opts = opts, fstype = fstype } end
    end
    facts_cache = { euid = core.proc.geteuid(), status = read("/proc/self/status") or "", mounts = mounts,
                    container = M.container() }
  end
  return facts_cache
end

-- A piece's verdict, once per process: false when present, else `{why =, cause =}`.
local function piece(name)
  if piece_cache[name] == nil then
    local why, cause = PIECES[name].missing(facts())
    piece_cache[name] = why and { why = why, cause = cause or 1 } or false
  end
  return piece_cache[name]
end

local function flag_for(name, cause, engine)
  local forms = PIECES[name].flag[cause]
  if not forms then return nil end
  if forms.host then return nil, forms.host end
  return forms[engine] or forms.any or (forms.podman and ("podman: " .. forms.podman .. "; docker: " .. forms.docker))
end

--- The missing pieces behind a probe that did not hold, each with what would provide it.
-- @tparam string name a probe name (corral.probe)
-- @treturn {table,...} `{piece =, why =, flag =}` (`flag` nil when no container setting
--   provides it, `host` then saying what would); empty when nothing is known to be missing
function M.missing(name)
  local out = {}
  local c = facts().container
  for _, p in ipairs(NEEDS[name] or {}) do
    local m = piece(p)
    if m then
      local flag, host = flag_for(p, m.cause, c and c.engine or "any")
      out[#out + 1] = { piece = p, why = m.why, flag = c and flag or nil, host = host }
    end
  end
  return out
end

--- The sentence appended to an absent probe's detail, or nil when there is none to give.
-- Container flags only when a container was detected; a host-level fix (a sysctl, the
-- kernel's LSM list) wherever it is the cause.
-- @tparam string name a probe name
-- @treturn[1] string e.g. " (in a container (podman: /run/.containerenv): no CAP_NET_ADMIN
--   (nftables): run it with --cap-add NET_ADMIN)"
-- @treturn[1] table the pieces (`M.missing`)
-- @treturn[2] nil
function M.advice(name)
  local pieces = M.missing(name)
  if #pieces == 0 then return nil end
  local whys, flags, hosts = {}, {}, {}
  for _, p in ipairs(pieces) do
    whys[#whys + 1] = p.why
    if p.flag then flags[#flags + 1] = p.flag end
    if p.host then hosts[#hosts + 1] = p.host end
  end
  local c = facts().container
  local fixes = {}
  if #flags > 0 then fixes[#fixes + 1] = "run it with " .. table.concat(flags, " ") end
  if #hosts > 0 then fixes[#fixes + 1] = table.concat(hosts, "; ") end
  if #fixes == 0 then return nil end
  local where = c and string.format("in a container (%s: %s)", c.engine, c.evidence) or "on this host"
  return string.format(" (%s: %s: %s)", where, table.concat(whys, "; "), table.concat(fixes, "; ")), pieces
end

--- Forgets what was established (tests that change the host use it).
function M.reset()
  facts_cache, piece_cache = nil, {}
end

return M
