--- Grants → policy → commitment, for the isolation tiers (see corral.tier).
--
-- Everything a grant does not name is denied. The commitment is SHA-256 over the
-- policy's canonical serialisation (one fact per line, sorted, every path resolved, the
-- mechanism with its version, each seccomp program's digest): the same for the same
-- policy on every host with the same mechanism, different when any grant changes. A
-- grant that would withhold part of the residue (`M.RESIDUE`) is refused.
-- @module corral.tier.policy
local core = require "corral.core"
local errors = require "corral.errors"
local state_dir = require "corral.state_dir"
local allowlist = require "corral.egress.allowlist"

local M = {}

--- The format of the canonical serialisation; a change to it changes every commitment.
M.FORMAT = "corral tier policy 1"

--- What a native process keeps at S1 whatever its grants, and why none can be taken.
M.RESIDUE = {
  "the clock: clock_gettime is served by the vDSO, without a system call a filter could see",
  "randomness: getrandom(2), the CPU's RDRAND/RDSEED, address-space layout randomisation",
  "/dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom: granted read+write to every step",
  "its own process: its pid, its resource usage, signals inside its own domain (/proc is not granted)",
  "its inherited stdin, stdout and stderr, whatever they are",
  "CPU time and memory: S1 sets no resource limits (corral run does)",
  "host identity: uname, the hostname, the number of CPUs",
  "with net = an allowlist: a network namespace of its own where DNS and TCP reach only the egress plane " ..
    "(any other packet goes nowhere); its loopback",
  "with net = true: any socket, including pathname unix sockets its uid may open (Landlock checks " ..
    "unix connects only from ABI 9)",
}

local KEYS = { read = "paths", write = "paths", exec = "paths", net = "net", subprocess = "boolean",
  env = "names", clock = "boolean", random = "boolean" }
local DEFAULTS = { net = false, subprocess = false, clock = true, random = true }

local function invalid(key, fmt, ...)
  return nil, errors.invalid_argument("grants." .. key, string.format(fmt, ...))
end

local function sorted_unique(list)
  local seen, out = {}, {}
  for _, v in ipairs(list) do
    if not seen[v] then seen[v] = true; out[#out + 1] = v end
  end
  table.sort(out)
  return out
end

local function resolve_paths(key, list)
  if type(list) ~= "table" then return invalid(key, "must be a list of paths") end
  local out = {}
  for i, p in ipairs(list) do
    if type(p) ~= "string" or p:sub(1, 1) ~= "/" then
      return invalid(key, "entry %d must be an absolute path", i)
    end
    local r, err = core.path.resolve_file(p)
    if not r then return invalid(key, "%s", err) end
    local private = state_dir.refusal(r)
    if private then return invalid(key, "%s %s", r, private) end
    out[#out + 1] = r
  end
  return sorted_unique(out)
end

--- Checks grants and fills the defaults: paths resolved, lists sorted.
-- Refuses what the tier cannot deny: at S1 the clock and randomness; at S2 randomness
-- (the managed runtime withholds the clock by not offering clock() and time()).
-- @tparam table grants
-- @tparam[opt] string tier "S2" for Lua in the managed runtime; S1 otherwise
-- @treturn table the normalised grants, or nil and an error naming `grants.<key>`
function M.check(grants, tier)
  if type(grants) ~= "table" then return invalid("*", "grants must be a table") end
  for k in pairs(grants) do
    if not KEYS[k] then return invalid(tostring(k), "unknown grant (known: read, write, exec, net, " ..
      "subprocess, env, clock, random)") end
  end
  local g = {}
  for _, k in ipairs({ "read", "write", "exec" }) do
    local list, err = resolve_paths(k, grants[k] or {})
    if not list then return nil, err end
    g[k] = list
  end
  local env = grants.env or {}
  if type(env) ~= "table" then return invalid("env", "must be a list of variable names") end
  for i, name in ipairs(env) do
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      return invalid("env", "entry %d must be a variable name", i)
    end
  end
  g.env = sorted_unique(env)
  for _, k in ipairs({ "subprocess", "clock", "random" }) do
    local v = grants[k]
    if v == nil then v = DEFAULTS[k] end
    if type(v) ~= "boolean" then return invalid(k, "must be true or false") end
    g[k] = v
  end
  if g.clock == false and tier ~= "S2" then
    return nil, errors.cannot_enforce("grants.clock", "a native process reads the clock through the vDSO, " ..
      "without a system call: S1 cannot withhold it, so the step is refused, never run with it (Lua at S2 " ..
      "can be denied the clock)")
  end
  if g.random == false and tier == "S2" then
    return nil, errors.cannot_enforce("grants.random", "Lua at S2 sees randomness beside math.random: the " ..
      "order pairs() visits string keys follows a hash seed each state draws from its own addresses, and " ..
      "tostring of a table shows one; so the step is refused, never run with it")
  elseif g.random == false then
    return nil, errors.cannot_enforce("grants.random", "a native process has getrandom(2), the CPU's " ..
      "RDRAND and its own randomised addresses: no tier here can withhold randomness, so the step is " ..
      "refused, never run with it")
  end
  local net = grants.net
  if net == nil then net = DEFAULTS.net end
  if type(net) == "table" then
    -- each entry's canonical text, sorted, so that two spellings of one allowlist commit alike
    local al, aerr = allowlist.parse(net)
    if not al then return invalid("net", "%s", aerr.detail or tostring(aerr)) end
    local texts = {}
    for _, e in ipairs(al:entries()) do texts[#texts + 1] = e.text end
    g.net = sorted_unique(texts)
    return g
  end
  if type(net) ~= "boolean" then return invalid("net", "must be false, true or an allowlist") end
  g.net = net
  return g
end

--- Whether normalised grants ask for an egress allowlist (the egress plane).
-- @tparam table g normalised grants
-- @treturn boolean
function M.allowlisted(g)
  return type(g.net) == "table"
end

--- The runtime directories an S1 step may read and execute, resolved and existing: the
-- root plan's programs and libraries (`core.rootplan.program_paths`), not /etc, which a
-- step is shown file by file.
-- @treturn {string,...}
function M.runtime_dirs()
  local out = {}
  for _, d in ipairs(core.rootplan.program_paths()) do
    local r = core.path.resolve(d)
    if r then out[#out + 1] = r end
  end
  out = sorted_unique(out)
  local kept = {}
  for _, d in ipairs(out) do
    local covered = false
    for _, o in ipairs(out) do
      if o ~= d and core.path.is_beneath(d, o) then covered = true end
    end
    if not covered then kept[#kept + 1] = d end
  end
  return kept
end

--- Whether a resolved path is covered by the runtime or by one of `dirs`.
-- @tparam string path resolved
-- @tparam {string,...} dirs resolved
-- @treturn boolean
function M.covered(path, dirs)
  for _, d in ipairs(dirs) do
    if core.path.is_beneath(path, d) then return true end
  end
  return false
end

-- Resolved existing files from a list (a missing one is simply not granted).
local function existing(list)
  local out = {}
  for _, p in ipairs(list) do
    local r = core.path.resolve_file(p)
    if r then out[#out + 1] = r end
  end
  return out
end

--- Derives the policy S1 applies: every capability dropped (no file rule touches
-- CAP_SYS_MODULE or CAP_NET_ADMIN), deny-default Landlock rules, the seccomp programs.
-- @tparam table g normalised grants (from `M.check`)
-- @tparam table mech `{name =, abi =}`
-- @tparam[opt] {string,...} extra_exec resolved files the step's runtime needs (read+execute)
-- @tparam[opt] {string,...} extra_read resolved files that runtime reads
-- @treturn table `{tier =, mechanism =, rules =, filters =, supervised =}`
function M.derive(g, mech, extra_exec, extra_read)
  local rules = {}
  local function add(path, access) rules[#rules + 1] = { path = path, access = access } end
  for _, d in ipairs(M.runtime_dirs()) do add(d, "rx") end
  -- /etc file by file (the root plan's start-up files, and its network files when the
  -- step may use the network), never all of it: its credential stores stay out
  local etc = existing(core.rootplan.startup_files())
  if g.net then
    for _, p in ipairs(existing(core.rootplan.network_files())) do etc[#etc + 1] = p end
  end
  for _, p in ipairs(sorted_unique(etc)) do add(p, "r") end
  -- the data devices, not the controlling terminal: a step's stdio is inherited
  for _, p in ipairs(existing(core.rootplan.data_devices())) do add(p, "d") end
  for _, p in ipairs(g.read) do add(p, "r") end
  for _, p in ipairs(g.write) do add(p, "w") end
  for _, p in ipairs(g.exec) do add(p, "rx") end
  for _, p in ipairs(extra_exec or {}) do add(p, "rx") end
  for _, p in ipairs(extra_read or {}) do add(p, "r") end
  table.sort(rules, function(a, b)
    if a.path ~= b.path then return a.path < b.path end
    return a.access < b.access
  end)
  local filters = { "tty" }
  if not g.net then filters[#filters + 1] = "nonet" end
  -- the egress plane enforces an allowlist around the program's own netns; the name says so
  local name = mech.name
  if M.allowlisted(g) and name then name = name .. "+egress" end
  return { tier = mech.tier or "S1", mechanism = name, rules = rules, filters = filters,
           supervised = (not g.subprocess) and "nosubprocess" or nil, drop_caps = true,
           egress = M.allowlisted(g) and g.net or nil }
end

--- Derives the seatbelt policy (macOS): a deny-default SBPL profile the commitment covers.
-- @tparam table g normalised grants
-- @tparam table mech `{name =}`
-- @tparam string program the resolved program
-- @treturn table `{tier =, mechanism =, profile =}`, or nil and the refusal
function M.derive_seatbelt(g, mech, program)
  local profile, err = require("corral.sbpl").tier_profile(g, program)
  if not profile then return nil, err end
  return { tier = mech.tier or "S1", mechanism = mech.name, profile = profile }
end

--- The canonical serialisation of a policy and the grants it came from.
-- @tparam table policy from `M.derive` (or `{tier = "S0", mechanism = "none"}`)
-- @tparam table g normalised grants
-- @treturn string
function M.canonical(policy, g)
  local lines = { M.FORMAT, "tier " .. policy.tier, "mechanism " .. (policy.mechanism or "none") }
  if policy.drop_caps then lines[#lines + 1] = "capabilities none" end
  if policy.limits then
    lines[#lines + 1] = "limit fuel " .. string.format("%d", policy.limits.fuel)
    lines[#lines + 1] = "limit memory " .. string.format("%d", policy.limits.memory)
  end
  local programs = core.tier.programs()
  local applied = {}
  for _, f in ipairs(policy.filters or {}) do applied[#applied + 1] = f end
  if policy.supervised then applied[#applied + 1] = policy.supervised .. " (supervised)" end
  table.sort(applied)
  for _, f in ipairs(applied) do
    local name = f:match("^(%S+)")
    lines[#lines + 1] = "seccomp " .. f .. " " .. assert(core.digest.sha256(programs[name]))
  end
  for _, r in ipairs(policy.rules or {}) do lines[#lines + 1] = "landlock " .. r.access .. " " .. r.path end
  if policy.profile then lines[#lines + 1] = "sbpl " .. assert(core.digest.sha256(policy.profile)) end
  for _, k in ipairs({ "read", "write", "exec" }) do
    for _, p in ipairs(g[k]) do lines[#lines + 1] = "grant " .. k .. " " .. p end
  end
  for _, name in ipairs(g.env) do lines[#lines + 1] = "grant env " .. name end
  if M.allowlisted(g) then
    for _, e in ipairs(g.net) do lines[#lines + 1] = "grant net allow " .. e end
  else
    lines[#lines + 1] = "grant net " .. tostring(g.net)
  end
  for _, k in ipairs({ "subprocess", "clock", "random" }) do
    lines[#lines + 1] = "grant " .. k .. " " .. tostring(g[k])
  end
  -- the operator's side of the egress plane: private ranges allowed, names answered from a table
  for _, c in ipairs(policy.internal or {}) do lines[#lines + 1] = "egress internal " .. c end
  for _, r in ipairs(policy.resolve or {}) do lines[#lines + 1] = "egress resolve " .. r end
  return table.concat(lines, "\n") .. "\n"
end

--- The commitment: SHA-256 of the canonical serialisation, as `sha256:<hex>`.
-- @tparam table policy
-- @tparam table g normalised grants
-- @treturn string, or nil and cannot_enforce when the system offers no SHA-256
function M.commitment(policy, g)
  local hex, err = core.digest.sha256(M.canonical(policy, g))
  if not hex then return nil, errors.cannot_enforce("commitment", tostring(err)) end
  return "sha256:" .. hex
end

return M
