--- Secrets the tenant never holds (`corral run --secret`, `--secret-file`): each bound to
-- hosts, the tenant given a stand-in of the same shape, the value kept in this module's
-- memory only and handed to the TLS terminator (`corral.tls`, core/lib/intercept.h),
-- which puts it into request headers toward the bound hosts and nowhere else.
--
-- A stand-in keeps the value's known prefix (ghp_, github_pat_, sk-ant-, sk-, xoxb-, AKIA
-- …), its length, and each later character's class (a digit for a digit, a lower-case
-- letter for one, …), drawn afresh for every run from /dev/urandom: a client that checks
-- a token's shape accepts it, and it is worth nothing anywhere else.
--
-- The values never enter the `network` table (which events, receipts and the control
-- socket may show): it carries each secret's name, hosts and stand-in; `bound` is the
-- only way from a stand-in to its value, and the one caller is the plane that makes the
-- terminator.
-- @module corral.egress.secrets
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"

local M = {}

--- Known prefixes kept as they are (longest first, so that github_pat_ wins over gh…).
M.PREFIXES = { "github_pat_", "sk-ant-api03-", "sk-ant-", "sk-proj-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
  "glpat-", "xoxb-", "xoxp-", "xoxa-", "xapp-", "hf_", "npm_", "pypi-", "sk-", "AKIA", "ASIA" }

--- The port a bound host gets when none is written.
M.DEFAULT_PORT = 443

-- stand-in → value; never iterated into anything the tenant or a log can see
local values = {}

local function random_bytes(n)
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(n)
  f:close()
  return b
end

local CLASSES = {
  { "%d", "0123456789" },
  { "%l", "abcdefghijklmnopqrstuvwxyz" },
  { "%u", "ABCDEFGHIJKLMNOPQRSTUVWXYZ" },
}

--- A stand-in for value: its known prefix kept, every later letter or digit replaced by a
-- random one of the same class, every other character kept; never the value itself.
-- @tparam string value
-- @treturn string
function M.stand_in(value)
  local prefix = ""
  for _, p in ipairs(M.PREFIXES) do
    if value:sub(1, #p) == p and #value > #p then
      prefix = p
      break
    end
  end
  for _ = 1, 8 do
    local rnd, out = random_bytes(#value), { prefix }
    for i = #prefix + 1, #value do
      local c, alphabet = value:sub(i, i), nil
      for _, cl in ipairs(CLASSES) do
        if c:find("^" .. cl[1] .. "$") then alphabet = cl[2] end
      end
      if alphabet then
        local k = rnd:byte(i) % #alphabet + 1
        c = alphabet:sub(k, k)
      end
      out[#out + 1] = c
    end
    local s = table.concat(out)
    if s ~= value and not values[s] then return s end
  end
  error("no stand-in differs from the value (too short to stand in for)")
end

-- "api.test:8443,other.test" → {{host =, port =}, ...}, or nil and why.
local function parse_hosts(text)
  local hosts = {}
  for item in (text .. ","):gmatch("([^,]*),") do
    local host, port = item:match("^([^:]+):(%d+)$")
    host, port = host or item, tonumber(port) or M.DEFAULT_PORT
    if core.inet.parse(host) then return nil, string.format('"%s": bind a name, not an address', item) end
    local name, why = address.normalize_name(host)
    if not name or host:find("*", 1, true) then
      return nil, string.format('"%s" is not a host name (%s)', item, why or "no wildcard: name each host")
    end
    if port < 1 or port > 65535 then return nil, string.format('"%s": a port is 1-65535', item) end
    hosts[#hosts + 1] = { host = name, port = port }
  end
  return hosts
end

-- Why value cannot be a secret put into a header, or nil.
local function bad_value(value)
  if value == "" then return "is empty" end
  if value:find("[%z\r\n]") then return "holds a NUL, CR or LF, which no request header may carry" end
  if #value < 8 then return "is shorter than 8 characters: its stand-in would be guessable" end
end

-- A 0600 regular file of the caller's own, read whole (one trailing newline dropped).
local function read_secret_file(path)
  local st = core.fs.lstat(path)
  if not st then return nil, path .. ": no such file" end
  if st.type ~= "file" then return nil, path .. ": not a regular file (a symlink is not followed)" end
  if st.uid ~= core.proc.geteuid() then return nil, path .. ": not yours (owned by uid " .. st.uid .. ")" end
  if st.mode & tonumber("077", 8) ~= 0 then
    return nil, string.format("%s: mode %o lets others read it; chmod 600 it", path, st.mode & tonumber("777", 8))
  end
  local text, err = core.fs.read(path)
  if not text then return nil, err end
  return (text:gsub("\r?\n$", ""))
end

--- The secrets `corral run` binds (`--secret NAME@HOSTS`, `--secret-file NAME=PATH@HOSTS`),
-- each `{name =, hosts = {{host =, port =}, ...}, stand_in =}` with its value stored
-- here; nil when none is given. Read before corral's own environment is cleared.
-- @tparam table opts parsed options
-- @tparam table environ corral's own environment (name → value)
-- @treturn[1] {table,...}|nil
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the flag
function M.parse(opts, environ)
  local out, seen = {}, {}
  local function add(flag, spec, name, value, hosts_text)
    if not name or not name:match("^[%a_][%w_]*$") then
      return nil, errors.invalid_argument(flag, string.format('"%s": expected %s', spec, flag == "--secret"
        and "NAME@HOST[:PORT][,HOST...] (e.g. GITHUB_TOKEN@api.github.com)"
        or "NAME=PATH@HOST[:PORT][,HOST...] (e.g. GITHUB_TOKEN=/run/secrets/gh@api.github.com)"))
    end
    if seen[name] then return nil, errors.invalid_argument(flag, name .. " is bound twice") end
    seen[name] = true
    if value == nil then return nil, errors.invalid_argument(flag, name .. " is not set in corral's environment") end
    local why = bad_value(value)
    if why then return nil, errors.invalid_argument(flag, name .. "'s value " .. why) end
    local hosts, herr = parse_hosts(hosts_text)
    if not hosts then return nil, errors.invalid_argument(flag, spec .. ": " .. herr) end
    local ok, s = pcall(M.stand_in, value)
    if not ok then return nil, errors.invalid_argument(flag, name .. "'s value: " .. tostring(s)) end
    values[s] = value
    out[#out + 1] = { name = name, hosts = hosts, stand_in = s }
    return true
  end
  for _, spec in ipairs(opts.secret or {}) do
    local name, hosts = spec:match("^([^@]*)@(.+)$")
    local ok, err = add("--secret", spec, name, name and environ[name], hosts or "")
    if not ok then return nil, err end
  end
  for _, spec in ipairs(opts["secret-file"] or {}) do
    local name, path, hosts = spec:match("^([^=@]*)=([^@]+)@(.+)$")
    local value, ferr
    if path then
      value, ferr = read_secret_file(path)
      if not value then return nil, errors.invalid_argument("--secret-file", ferr) end
    end
    local ok, err = add("--secret-file", spec, name, value, hosts or "")
    if not ok then return nil, err end
  end
  for _, n in ipairs(opts.env or {}) do
    if seen[n] then
      return nil, errors.invalid_argument("--env", n .. " is bound by --secret: the tenant gets its stand-in")
    end
  end
  return #out > 0 and out or nil
end

--- Whether a `network.secrets` list is one this module made (each stand-in known here),
-- or why not.
-- @tparam table list
-- @treturn nil|string
function M.check(list)
  if type(list) ~= "table" then return "secrets must be a list" end
  for i, s in ipairs(list) do
    if type(s) ~= "table" or type(s.name) ~= "string" or type(s.stand_in) ~= "string"
       or type(s.hosts) ~= "table" or #s.hosts == 0 then
      return "secrets[" .. i .. "] must be {name =, hosts = {{host =, port =}, ...}, stand_in =}"
    end
    if not values[s.stand_in] then return "secrets[" .. i .. "]: a stand-in corral.egress.secrets did not make" end
  end
end

--- Whether host:port is bound to one of the secrets.
-- @tparam {table,...} list `network.secrets`
-- @tparam string host
-- @tparam integer port
-- @treturn boolean
function M.bound(list, host, port)
  for _, s in ipairs(list or {}) do
    for _, h in ipairs(s.hosts) do
      if h.host == host and h.port == port then return true end
    end
  end
  return false
end

--- The TLS terminator for these secrets (`corral.tls`, loaded only here): the one place
-- a value leaves this module.
-- @tparam {table,...} list `network.secrets`
-- @tparam[opt] string ca_file trusted besides the host's store (`--ca-file`)
-- @tparam[opt] boolean ask each request is asked of the caller (`corral.egress.request_rules`)
-- @treturn[1] userdata
-- @return[2] nil
-- @treturn[2] string why
function M.terminator(list, ca_file, ask)
  local spec = {}
  for i, s in ipairs(list) do
    local hosts = {}
    for j, h in ipairs(s.hosts) do hosts[j] = h.host end
    spec[i] = { stand_in = s.stand_in, value = values[s.stand_in], hosts = hosts }
  end
  return require("corral.tls").new({ ca_file = ca_file, secrets = spec, ask = ask })
end

--- Whether text holds a stand-in of list, and which secret's name.
-- @tparam {table,...} list
-- @tparam string text
-- @tparam[opt] boolean any_case compare without case (a DNS name)
-- @treturn string|nil the secret's name
function M.stand_in_in(list, text, any_case)
  if any_case then text = text:lower() end
  for _, s in ipairs(list or {}) do
    if text:find(any_case and s.stand_in:lower() or s.stand_in, 1, true) then return s.name end
  end
end

--- Why a first flight corral sees in the clear (plain HTTP, spliced) is refused: it
-- carries a stand-in, which goes nowhere but a bound host's request headers over TLS.
-- @tparam {table,...} list `network.secrets`
-- @tparam string data the bytes
-- @tparam string dest where the connection goes (name:port)
-- @treturn string|nil
function M.clear_leak(list, data, dest)
  local name = M.stand_in_in(list, data)
  if not name then return nil end
  return string.format("the stand-in of %s in the clear toward %s: it is put into request headers only over "
    .. "TLS to the hosts --secret %s@HOST binds", name, dest, name)
end

return M
