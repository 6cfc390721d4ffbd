--- The capability probes' results, kept for the boot in the caller's runtime directory.
--
-- Probing by doing costs a CLI call 10-35 ms (child processes, namespaces, a ruleset);
-- it is done once per boot and host state instead of once per process. Only results that
-- *hold* are kept: a stale "holds" meets the enforcement step itself, which fails closed
-- at its system call and refuses naming the capability (and `invalidate` then drops the
-- file); a stale "absent" would silently keep a host that gained a protection from using
-- it, so an absent result is probed again every time.
--
-- The file is valid only for the state it was probed in (`key`): the boot, the kernel,
-- the caller's ids, namespaces, capabilities, seccomp and no_new_privs state, cgroup,
-- the sysctls and LSMs that change the answers, corral's own files and the programs the
-- probes run. Any difference and every probe runs again. It lives in
-- `corral.runtime_dir` (0700, the caller's own), mode 0600, replaced by rename.
-- @module corral.probe_cache
local core = require "corral.core"
local file = require "corral.file"
local runtime_dir = require "corral.runtime_dir"

local M = {}

--- The first line of the file; a change to the format changes it.
M.FORMAT = "corral probe cache 1"

--- The file's name in the runtime directory: this, then `-` and the corral executable's
-- path, so that two builds or installs on one machine (a checkout and /usr/local, a
-- LuaRocks tree) each keep their own file instead of replacing the other's at every call
-- (their keys differ: the host's identity is in it).
M.NAME = "probes"

-- The longest path written into the name as it is (escaped); a longer one is named by
-- its SHA-256. Not hashed always: where the kernel has no AF_ALG, the digest loads
-- libcrypto, ~6 ms of every CLI call (`corral -e "core.digest.sha256('x')"` under strace).
M.NAME_PATH_MAX = 200

-- Read once at load, like the runtime directory: corral may clear its environment.
-- Each changes what a probe finds: where it makes scratch files, which programs it runs,
-- and a deliberate weakening of the tier probe (corral.tier.probe).
-- The key's lists are data on M: core/host/confine_fast.c, which checks a key before any
-- Lua state exists, is generated from them.
M.ENVIRONMENT = { "TMPDIR", "PATH", "CORRAL_TIER_PROBE_MUTATE" }
local ENVIRONMENT = {}
for _, name in ipairs(M.ENVIRONMENT) do
  ENVIRONMENT[#ENVIRONMENT + 1] = name .. "=" .. (os.getenv(name) or "")
end

M.SYSCTLS = { "user/max_user_namespaces", "user/max_net_namespaces", "user/max_mnt_namespaces",
  "user/max_pid_namespaces", "user/max_cgroup_namespaces", "user/max_ipc_namespaces",
  "user/max_uts_namespaces", "kernel/unprivileged_userns_clone",
  "kernel/apparmor_restrict_unprivileged_userns", "kernel/seccomp/actions_avail",
  "net/netfilter/nf_conntrack_max" }
M.NAMESPACES = { "user", "mnt", "net", "pid", "cgroup", "ipc", "uts" }
M.STATUS_FIELDS = { "Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp",
  "Seccomp_filters" }
-- The programs a probe runs; a new or replaced one may change its answer.
M.PROGRAMS = { "/bin/sh", "/bin/cat", "/usr/bin/unshare", "/usr/bin/bwrap", "/usr/sbin/nft" }

-- The modules whose files are in the key (their probes' code).
M.MODULES = { "corral.probe", "corral.probe_cache", "corral.tenant_root" }

-- A file's content for the key ("-" when it cannot be read).
local function slurp(path) return file.read(path) or "-" end

local function identity(path)
  local st = path and core.fs.lstat(path)
  if not st then return "-" end
  return string.format("%d:%d:%d:%d", st.dev, st.ino, st.size, st.mtime_ns)
end

--- The host state the cached results are valid for, as text (one fact per line).
-- @treturn string
function M.key()
  local lines = { M.FORMAT }
  local function add(k, v) lines[#lines + 1] = k .. "=" .. (tostring(v):gsub("\n", "\\n")) end
  add("boot", slurp("/proc/sys/kernel/random/boot_id"))
  add("release", slurp("/proc/sys/kernel/osrelease"))
  add("kernel", slurp("/proc/sys/kernel/version"))
  for _, ns in ipairs(M.NAMESPACES) do add("ns." .. ns, core.fs.readlink("/proc/self/ns/" .. ns) or "-") end
  -- each field found by a plain search for its name: a pattern tried at every position
  -- of the ~1.4 KB costs ~20 times more (~200 us)
  local status = "\n" .. slurp("/proc/self/status")
  for _, k in ipairs(M.STATUS_FIELDS) do
    local _, at = status:find("\n" .. k .. ":", 1, true)
    local value = at and status:sub(at + 1, (status:find("\n", at, true) or 0) - 1)
    add("status." .. k, value and value:match("^[ \t]*(.-)[ \t]*$") or "-")
  end
  add("cgroup", slurp("/proc/self/cgroup"))
  for _, s in ipairs(M.SYSCTLS) do add("sysctl." .. s, slurp("/proc/sys/" .. s)) end
  add("lsm", slurp("/sys/kernel/security/lsm"))
  add("landlock", core.landlock.abi() or "-")
  add("host", identity(core.proc.host_executable()))
  add("wrapper", identity(require("corral.confine_wrapper").path()))
  -- the core: linked into the host (whose identity is above), else the C module a stock
  -- interpreter loads
  add("core", package.preload["corral.core"] and "host" or
    identity(package.searchpath("corral.core", package.cpath)))
  for _, m in ipairs(M.MODULES) do
    add("module." .. m, identity(package.searchpath(m, package.path)))
  end
  for _, p in ipairs(M.PROGRAMS) do add("program." .. p, identity(p)) end
  for _, e in ipairs(ENVIRONMENT) do add("env", e) end
  return table.concat(lines, "\n")
end

local function escape(s)
  return (tostring(s):gsub("[%%\t\n\r]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function encode_extra(extra)
  local parts = {}
  for k, v in pairs(extra or {}) do
    if type(k) == "string" and (type(v) == "string" or math.type(v) == "integer") then
      parts[#parts + 1] = escape(k) .. "=" .. (math.type(v) == "integer" and "i" or "s") .. escape(v)
    end
  end
  table.sort(parts)
  return table.concat(parts, ",")
end

local function decode_extra(text)
  if text == "" then return nil end
  local extra = {}
  for part in text:gmatch("[^,]+") do
    local k, kind, v = part:match("^([^=]+)=([is])(.*)$")
    if not k then return nil end
    extra[unescape(k)] = kind == "i" and math.tointeger(tonumber(v)) or unescape(v)
  end
  return extra
end

--- The file's path (the runtime directory made if needed), or nil and why not.
-- @treturn string|nil
function M.path()
  local dir, err = runtime_dir.dir()
  if not dir then return nil, err end
  local host = core.proc.host_executable() or "-"
  -- "%" and "/" escaped: one name per path, and no path separator in it
  local name = host:gsub("[%%/]", { ["%"] = "%25", ["/"] = "%2F" })
  if #name > M.NAME_PATH_MAX then name = core.digest.sha256(host):sub(1, 12) end
  return dir .. "/" .. M.NAME .. "-" .. name
end

--- The results kept for this host state.
-- @treturn table name → `{detail =, extra =, at = unix time}`; empty when there is no
--   valid file (missing, another owner, a mode others may read or write, another key)
function M.load()
  local path = M.path()
  if not path then return {} end
  local st = core.fs.lstat(path)
  if not st or st.type ~= "file" or st.uid ~= core.proc.geteuid() or st.mode & 0x3f ~= 0 or
     st.size > 1024 * 1024 then
    return {}
  end
  local text = slurp(path)
  local key = M.key()
  local head, body = text:sub(1, #key + 1), text:sub(#key + 2)
  if head ~= key .. "\n" then return {} end
  local out = {}
  for line in body:gmatch("[^\n]+") do
    local name, at, detail, extra = line:match("^holds\t([^\t]+)\t(%d+)\t([^\t]*)\t([^\t]*)$")
    if not name then return {} end
    out[unescape(name)] = { detail = unescape(detail), extra = decode_extra(extra), at = tonumber(at) }
  end
  return out
end

--- Keeps `results` (name → `{detail, extra, at}`) as the file for this host state.
-- A failure to write is not an error: the next process probes again.
-- @tparam table results
-- @treturn boolean whether the file was written
function M.store(results)
  local path = M.path()
  if not path then return false end
  local names = {}
  for name in pairs(results) do names[#names + 1] = name end
  table.sort(names)
  local lines = { M.key() }
  for _, name in ipairs(names) do
    local r = results[name]
    lines[#lines + 1] = table.concat({ "holds", escape(name), tostring(math.tointeger(r.at) or os.time()),
      escape(r.detail or ""), encode_extra(r.extra) }, "\t")
  end
  local tmp = path .. "." .. core.proc.getpid() .. ".tmp"
  os.remove(tmp)
  -- a name no one else can take: the directory is the caller's own, mode 0700
  local f = io.open(tmp, "w")
  if not f then return false end
  core.fs.chmod(tmp, tonumber("600", 8))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local ok = os.rename(tmp, path)
  if not ok then os.remove(tmp) end
  return ok and true or false
end

--- Drops the file: an enforcement step failed, or `corral probe --fresh` asked.
function M.invalidate()
  local path = M.path()
  if path then os.remove(path) end
end

return M
