--- Sandboxes: a plain table, validated once, with clear errors naming the field.
--
-- `corral.sandbox{ id, storage_root?, workspace_path?, service_port?, env?, limits?,
-- network? }`. A sandbox's storage is `storage_root/id`; ids are checked so that no id
-- can name `..` or a sibling. Making, locking and marking the storage directory is
-- `corral.storage`'s.
-- @module corral.sandbox
local core = require "corral.core"
local file = require "corral.file"
local errors = require "corral.errors"
local hardening = require "corral.hardening"
local storage_mark = require "corral.storage_mark"
local state_dir = require "corral.state_dir"
local storage = require "corral.storage"
local disk = require "corral.disk"

local M = {}

M.DEFAULT_STORAGE_ROOT = "/var/lib/corral/sandboxes"

local FIELDS = { id = true, storage_root = true, workspace_path = true, service_port = true,
                 env = true, limits = true, network = true }
local LIMITS = { memory = true, pids = true, cpu = true, fsize = true, nofile = true, wall = true, disk = true }

local UNITS = { [""] = 1, K = 1024, M = 1024 ^ 2, G = 1024 ^ 3, T = 1024 ^ 4 }

--- Parses a size: a whole number of bytes, or one with a unit: "256M", "1.5G", "512K".
-- @param v number or string
-- @treturn integer|nil bytes
function M.parse_size(v)
  if math.type(v) == "integer" and v > 0 then return v end
  if type(v) ~= "string" then return nil end
  local n, unit = v:upper():match("^(%d+%.?%d*)%s*([KMGT]?)I?B?$")
  if not n then return nil end
  -- a fraction of a unit is rounded down to whole bytes; a fraction of a byte is a mistake
  if unit == "" and not n:match("^%d+$") then return nil end
  -- nil past what an integer holds (9000000T): no limit of that size can be set
  local bytes = math.tointeger(math.floor(tonumber(n) * UNITS[unit]))
  return bytes and bytes > 0 and bytes or nil
end

--- Parses a whole number written in plain decimal ("64"; not "0x40", " 64", "6.4e1").
-- @param v integer or string
-- @treturn integer|nil
function M.parse_integer(v)
  if math.type(v) == "integer" then return v end
  if type(v) ~= "string" or not v:match("^%d+$") then return nil end
  return math.tointeger(tonumber(v))
end

--- Parses a number written in plain decimal, a fraction allowed ("0.5", "2", ".25").
-- @param v number or string
-- @treturn number|nil
function M.parse_decimal(v)
  if type(v) == "number" then return v end
  if type(v) ~= "string" or not (v:match("^%d+%.?%d*$") or v:match("^%.%d+$")) then return nil end
  return tonumber(v)
end

--- Parses a duration: seconds, or "30s", "5m", "1h", "250ms".
-- @param v number or string
-- @treturn number|nil seconds
function M.parse_duration(v)
  if type(v) == "number" and v > 0 then return v end
  if type(v) ~= "string" then return nil end
  local n, unit = v:match("^(%d+%.?%d*)%s*(%a*)$")
  local scale = ({ [""] = 1, s = 1, ms = 0.001, m = 60, h = 3600 })[unit or ""]
  if not n or not scale then return nil end
  local s = tonumber(n) * scale
  return s > 0 and s or nil
end

--- RLIMIT_NPROC for a sandbox's processes, or nil. The kernel counts it per real uid;
-- as root every sandbox has a host id of its own, so this bounds a fork bomb even
-- without a pids cgroup. Unprivileged the id is shared with the caller: no default.
-- @tparam table sb
-- @treturn integer|nil
function M.default_nproc(sb)
  if core.proc.geteuid() ~= 0 then return nil end
  -- Never below --pids: that cap is the cgroup's to enforce (and to count, in pids.events).
  local want = math.max(4096, sb.limits and sb.limits.pids or 0)
  -- Nor above the hard limit we hold: the tenant cannot raise it (no CAP_SYS_RESOURCE in
  -- the host's user namespace; measured inside podman with its --ulimit nproc=1024:1024,
  -- every run failed at "spawn: rlimits: Operation not permitted"), and it is already the
  -- stricter cap.
  local hard = tonumber((file.read("/proc/self/limits") or ""):match("\nMax processes%s+%S+%s+(%d+)"))
  return hard and hard < want and hard or want
end

--- The kernel's ceiling for RLIMIT_NOFILE (fs.nr_open), or nil when unreadable.
function M.nr_open()
  return math.tointeger(tonumber(file.read("/proc/sys/fs/nr_open") or ""))
end

--- The largest `limits.nofile` a sandbox can be given: the hard RLIMIT_NOFILE this
-- process holds, within fs.nr_open. Raising a hard limit needs CAP_SYS_RESOURCE in the
-- host's user namespace, which the spawn no longer holds once it is inside the tenant's
-- (native), and which root in a container often lacks (bwrap and oci then fail too:
-- measured at `ulimit -Hn` 20000, --nofile 20001 ended every mechanism at setrlimit, EPERM).
-- @treturn integer|nil the ceiling, nil when neither is known
-- @treturn string what bounds it
function M.nofile_ceiling()
  local _, hard = core.proc.nofile()
  local nr_open = M.nr_open()
  if math.type(hard) == "integer" and (not nr_open or hard <= nr_open) then
    return hard, "the hard RLIMIT_NOFILE corral runs with, `ulimit -Hn`, which a sandbox cannot raise"
  end
  return nr_open, "fs.nr_open"
end

--- The fewest processes a sandbox starts its command with under every built-in
-- mechanism: measured with `corral run --mechanism M --pids N -- /bin/true`, native
-- needs 2 (at 1: "spawn: fork tenant", EAGAIN) and bwrap 4 (at 3: "bwrap: Can't fork for
-- pid 1"; at 2: "Creating new namespace failed").
M.MIN_PIDS = 4

--- The kernel's pid_max: no more processes than that can exist at once, so no larger
-- --pids means anything (and above 4194304 the cgroup refuses it), or nil when unreadable.
-- @treturn integer|nil
function M.pid_max()
  return math.tointeger(tonumber(file.read("/proc/sys/kernel/pid_max") or ""))
end

--- The smallest CPU bandwidth, in cores: the kernel's least CFS quota is 1000 us, of
-- corral's 100000 us period (below it cpu.max refuses the write, EINVAL).
M.MIN_CPU = 0.01

local function bad(field, detail)
  return nil, errors.invalid_argument(field, detail)
end

local function check_limits(l)
  if l == nil then return {} end
  if type(l) ~= "table" then return bad("limits", "must be a table") end
  local out = {}
  for k, v in pairs(l) do
    if not LIMITS[k] then return bad("limits." .. tostring(k), "unknown limit") end
    if k == "memory" or k == "fsize" or k == "disk" then
      out[k] = M.parse_size(v)
      if not out[k] then return bad("limits." .. k, "must be a size like 256M, got " .. tostring(v)) end
      -- whole KiB, as an image file is sized
      if k == "disk" and (out[k] < disk.MIN_BYTES or out[k] % 1024 ~= 0) then
        return bad("limits.disk", "must be at least 8M, in whole KiB, got " .. tostring(v))
      end
      -- below this the cap ends every run at once (121)
      if k == "memory" and out[k] < 4 * 1024 * 1024 then
        return bad("limits.memory", "must be at least 4M for anything to start, got " .. tostring(v))
      end
    elseif k == "pids" then
      -- fewer and no sandbox starts; more than pid_max cannot exist at once
      local top = M.pid_max()
      if math.type(v) ~= "integer" or v < M.MIN_PIDS or (top and v > top) then
        return bad("limits.pids", string.format("must be an integer from %d (what a sandbox needs to start its " ..
          "command) to %s (kernel.pid_max), got %s", M.MIN_PIDS, top or "pid_max", tostring(v)))
      end
      out[k] = v
    elseif k == "nofile" then
      -- above the ceiling the spawn's setrlimit fails with EPERM, a bad argument and not a
      -- protection missing; below 16 the sandbox's init cannot start the command
      local top, why = M.nofile_ceiling()
      if math.type(v) ~= "integer" or v < 16 or (top and v > top) then
        return bad("limits.nofile", string.format("must be an integer from 16 to %s, got %s (at most %s)",
          top or "fs.nr_open", tostring(v), why or "fs.nr_open"))
      end
      out[k] = v
    elseif k == "cpu" then
      if type(v) ~= "number" or v ~= v or v < M.MIN_CPU or v > 1024 then
        return bad("limits.cpu", string.format("must be a number of cores from %g (the kernel's least CPU " ..
          "quota) to 1024 (0.5 = half a core), got %s", M.MIN_CPU, tostring(v)))
      end
      out[k] = v
    elseif k == "wall" then
      out[k] = M.parse_duration(v)
      if not out[k] then return bad("limits.wall", "must be a duration like 30s, got " .. tostring(v)) end
    end
  end
  return out
end

--- Where the tenant finds its trusted CAs when a secret is bound: the runtime's bundle
-- shown with the run's CA added (corral.resources writes it, corral.tenant_root binds it).
M.CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
local CA_VARIABLES = { "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
  "CURL_CA_BUNDLE" }

-- A bound secret's stand-in under its name (corral.egress.secrets made it: worthless
-- outside this run, so not a credential the hardening list refuses), and the variables
-- that point clients at the bundle holding the run's CA.
local function add_stand_ins(env, secrets)
  if not secrets then return end
  for _, s in ipairs(secrets) do env[s.name] = s.stand_in end
  for _, v in ipairs(CA_VARIABLES) do env[v] = M.CA_BUNDLE end
end

--- Validates a sandbox description once.
-- @tparam table t the fields above
-- @treturn table a new sandbox (`t` unmodified), or nil and `invalid_argument`/`refused_env`
function M.new(t)
  if type(t) ~= "table" then return bad("sandbox", "must be a table") end
  for k in pairs(t) do
    if not FIELDS[k] then return bad(tostring(k), "unknown field") end
  end
  local id = t.id
  if type(id) ~= "string" or not id:match("^[%w][%w_.-]*$") or #id > 64 or id:find("..", 1, true) then
    return bad("id", "must be 1-64 characters of [A-Za-z0-9_.-], starting alphanumeric, without '..'; got "
      .. string.format("%q", tostring(id)))
  end
  local sb = { id = id }
  local root = t.storage_root or M.DEFAULT_STORAGE_ROOT
  if type(root) ~= "string" or root:sub(1, 1) ~= "/" or root:find("\0", 1, true) then
    return bad("storage_root", "must be an absolute path")
  end
  sb.storage_root = root
  if t.workspace_path ~= nil then
    if type(t.workspace_path) ~= "string" or t.workspace_path:sub(1, 1) ~= "/" then
      return bad("workspace_path", "must be an absolute path to an existing directory")
    end
    local r, err = core.path.resolve(t.workspace_path)
    if not r then return bad("workspace_path", err) end
    local why = M.unfit_workspace(r, M.storage_path(sb))
    if why then return bad("workspace_path", why) end
    sb.workspace_path = r
  end
  if t.service_port ~= nil then
    if math.type(t.service_port) ~= "integer" or t.service_port < 1 or t.service_port > 65535 then
      return bad("service_port", "must be a port number 1-65535")
    end
    sb.service_port = t.service_port
  end
  local env, err = hardening.environment(t.env)
  if not env then return nil, err end
  sb.env = env
  local limits, lerr = check_limits(t.limits)
  if not limits then return nil, lerr end
  sb.limits = limits
  if t.network ~= nil then
    local net, nerr = require("corral.egress.network_spec").check(t.network)
    if not net then return nil, nerr end
    sb.network = net
    add_stand_ins(sb.env, net.secrets)
  end
  return sb
end

-- The kernel's interface filesystems as /proc/self/mountinfo names them (core.fs.kernel_fs
-- tells the same ones by their magic, all but devtmpfs, which shares tmpfs's).
local KERNEL_FS = { proc = true, sysfs = true, devtmpfs = true, devpts = true, debugfs = true, tracefs = true,
  securityfs = true, cgroup = true, cgroup2 = true, bpf = true, configfs = true, efivarfs = true, pstore = true,
  fusectl = true, binfmt_misc = true, mqueue = true, nsfs = true, selinuxfs = true, smackfs = true }

-- A mount of a kernel interface filesystem at or beneath `dir`: its mount point and type, or nil.
local function kernel_mount_beneath(dir)
  local text = file.read("/proc/self/mountinfo") or ""
  local prefix = dir == "/" and "/" or dir .. "/"
  for line in text:gmatch("[^\n]+") do
    local at, fstype = line:match("^%S+ %S+ %S+ %S+ (%S+) .- %- (%S+) ")
    if at then
      at = at:gsub("\\(%d%d%d)", function(o) return string.char(tonumber(o, 8)) end)
      if KERNEL_FS[fstype] and (at == dir or at:sub(1, #prefix) == prefix) then return at, fstype end
    end
  end
  return nil
end

--- Why a resolved directory cannot be a sandbox's workspace, or nil. A workspace is bound
-- read-write and, shown as it is, with every mount beneath it: one that is, lies in or
-- holds a kernel interface filesystem (/proc, /sys, /dev, cgroup …) would show the tenant
-- the host's processes and devices, judged by the filesystem itself, not its path alone.
-- And one that is or lies inside another sandbox's storage (`STORAGE_MARK`) would hand the
-- tenant that sandbox's files (through an idmapped mount, as that sandbox's owner).
-- @tparam string dir a resolved path
-- @tparam[opt] string own the sandbox's own storage directory, which it may lie in
-- @treturn string|nil why, a phrase
function M.unfit_workspace(dir, own)
  local _, bwhy, kind = core.rootplan.check_boundary(dir)
  if kind == "root" or kind == "system" then return dir .. " " .. bwhy .. ": the host's kernel interfaces" end
  local private = state_dir.refusal(dir)
  if private then return dir .. " " .. private end
  local fs = core.fs.kernel_fs(dir)
  if fs then return string.format("%s is on %s, a kernel interface filesystem: the tenant would see the host " ..
    "through it", dir, fs) end
  local at, fstype = kernel_mount_beneath(dir)
  if at then return string.format("%s holds %s (%s), a kernel interface filesystem: the tenant would see the " ..
    "host through it", dir, at, fstype) end
  local other = core.proc.geteuid() == 0 and storage_mark.enclosing(dir)
  if other then
    local a, b = own and core.fs.lstat(own), core.fs.lstat(other)
    if not (a and b and a.dev == b.dev and a.ino == b.ino) then
      return string.format("%s is %swhere another sandbox keeps its files: its tenant's files would be this " ..
        "one's (give a directory of its own)", dir, other == dir and "" or "inside " .. other .. ", ")
    end
  end
  return nil
end

-- Where a sandbox's storage is and whose it is: corral.storage's, named here too as the
-- description's public API (docs/boundary.md, docs/mechanisms.md).
M.storage_path = storage.path
M.host_id = storage.host_id
M.is_host_id = storage.is_host_id
M.check_root = storage.check_root
M.prepare_storage = storage.prepare

return M
