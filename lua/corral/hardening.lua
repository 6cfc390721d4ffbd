--- The tenant hardening profile: the mirror image of `corral.confine`.
--
-- A tenant environment starts from a minimal base; the host adds variables by name; a
-- fixed list of forbidden name fragments, and values shaped like credentials, are
-- refused even then. The list is never widened and no option disables it
-- (docs/architecture.md, invariant 6): credentials reach a process only through
-- `corral confine`.
-- @module corral.hardening
local errors = require "corral.errors"

local M = {}

local FRAGMENTS = {
  "KEY", "TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL", "AUTH", "COOKIE",
  "SESSION", "PRIVATE", "CERT", "AWS_", "GCP_", "GOOGLE_", "AZURE_", "GITHUB_", "GH_",
  "GITLAB_", "ANTHROPIC_", "OPENAI_", "HF_", "DOCKER_", "KUBE", "VAULT_", "SSH_", "GPG_",
  "NPM_", "PYPI_", "STRIPE_", "SLACK_", "SENTRY_", "DSN",
  "PASS", "_PWD", "PGPASS",
}

-- Each fragment's position in FRAGMENTS under its first three letters (every fragment
-- has three or more): a name is checked by one lookup at each of its positions instead
-- of one search per fragment (35 searches a name cost ~0.3 ms a run for a shell's
-- environment, every variable of which `corral run` checks).
local BY_TRIGRAM = {}
for i, f in ipairs(FRAGMENTS) do
  assert(#f >= 3, f)
  local t = f:sub(1, 3)
  BY_TRIGRAM[t] = BY_TRIGRAM[t] or {}
  table.insert(BY_TRIGRAM[t], i)
end

-- The fragment an upper-case name contains (the first in FRAGMENTS' order), or nil.
local function forbidden_fragment(upper)
  local best
  for i = 1, #upper - 2 do
    local list = BY_TRIGRAM[upper:sub(i, i + 2)]
    if list then
      for _, k in ipairs(list) do
        local f = FRAGMENTS[k]
        if (not best or k < best) and upper:sub(i, i + #f - 1) == f then best = k end
      end
    end
  end
  return best and FRAGMENTS[best]
end

-- Values that are credentials whatever the variable is called: a Lua pattern, what it
-- is, and a plain text no match can be without (searched in the value, or in its lower
-- case for `lower`). The text is found by memchr-speed search; only a value holding it
-- meets the pattern, which Lua tries at every position (measured: the eleven patterns
-- over a shell's 37 variables cost ~0.8 ms a run, ~0.1 ms behind the texts).
local VALUE_SHAPES = {
  { "[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]%s*=%s*[^;%s]", "a Password= in a connection string", lower = "password" },
  { "[;%s][Pp][Ww][Dd]%s*=%s*[^;%s]", "a PWD= in a connection string", lower = "pwd" },
  { "^[Pp][Ww][Dd]%s*=%s*[^;%s]", "a PWD= in a connection string", lower = "pwd" },
  { "%f[%w]AKIA[0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z]" ..
    "[0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z]", "an AWS access key id", text = "AKIA" },
  { "%f[%w]gh[pousr]_[%w]+", "a GitHub token", text = "_" },
  { "%f[%w]github_pat_[%w_]+", "a GitHub token", text = "github_pat_" },
  { "%f[%w]glpat%-[%w_-]+", "a GitLab token", text = "glpat-" },
  { "%f[%w]sk%-ant%-[%w_-]+", "an Anthropic API key", text = "sk-ant-" },
  { "%f[%w]sk%-[%w_-]+[%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w][%w]",
    "an API secret key (sk-…)", text = "sk-" },
  { "%f[%w]xox[abposr]%-[%w-]+", "a Slack token", text = "xox" },
  { "%-%-%-%-%-BEGIN[%u ]*PRIVATE KEY%-%-%-%-%-", "a private key", text = "-----BEGIN" },
}

-- A read-only view: a tenant profile cannot be handed a shorter list by accident.
M.forbidden_env_fragments = setmetatable({}, {
  __index = FRAGMENTS,
  __len = function() return #FRAGMENTS end,
  __newindex = function() error("forbidden_env_fragments is fixed and never widened", 2) end,
  __pairs = function() return ipairs(FRAGMENTS) end,
})

-- The caller's terminal type: a name, not a credential, that a tenant's shell and
-- editors need to draw; anything but a plain terminfo name is not passed.
local function caller_term()
  local term = os.getenv("TERM")
  if term and #term <= 64 and term:match("^[%w][%w%.%-%+_]*$") then return term end
  return nil
end

--- The base every tenant environment starts from: TERM is the caller's (a plain
-- terminfo name), else `dumb`.
-- @treturn table name → value
function M.base_env()
  return {
    PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    HOME = "/storage",
    LANG = "C.UTF-8",
    TERM = caller_term() or "dumb",
    TZ = "UTC",
  }
end

-- Whether value holds `%a[%w+.-]*://[^/%s@]+@` (a URL with user information), found in
-- linear time: that pattern, searched unanchored, retries its scheme run from every
-- position, and every caller's variable is checked on each `corral run` (measured: a
-- 4,000-letter value, as hyperfine's randomized environment offset sets, made a run
-- take 147 ms instead of 15). Any letter in the run of scheme characters before a
-- "://" can start the scheme, so the run is scanned back once for a letter.
local function url_userinfo(value)
  local at = 1
  while true do
    local s, e = value:find("://", at, true)
    if not s then return false end
    local i, letter = s - 1, false
    while i >= 1 do
      local c = value:sub(i, i)
      if not c:find("^[%w+.-]$") then break end
      letter = letter or c:find("^%a$") ~= nil
      i = i - 1
    end
    if letter and value:find("^[^/%s@]+@", e + 1) then return true end
    at = e + 1
  end
end

--- Why a variable may not reach a tenant, or nil when it may.
-- @tparam string name
-- @tparam string value
-- @treturn nil|string the reason
function M.refusal(name, value)
  local f = forbidden_fragment(name:upper())
  if f then return "name contains the forbidden fragment " .. f end
  -- scheme://user:password@host or scheme://token@host: a credential in the value.
  if url_userinfo(value) then
    return "value carries credentials in a URL's user information"
  end
  local lower
  for _, shape in ipairs(VALUE_SHAPES) do
    local gate
    if shape.lower then
      lower = lower or value:lower()
      gate = lower:find(shape.lower, 1, true)
    else
      gate = value:find(shape.text, 1, true)
    end
    if gate and value:find(shape[1]) then return "value carries " .. shape[2] end
  end
  return nil
end

--- Builds a tenant environment: the base, plus each variable the host names.
-- @tparam[opt] table extra name → value
-- @treturn table name → value, or nil and `refused_env` naming the first refused variable
function M.environment(extra)
  local env = M.base_env()
  local names = {}
  for name in pairs(extra or {}) do names[#names + 1] = name end
  table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
  for _, name in ipairs(names) do
    local value = extra[name]
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      return nil, errors.invalid_argument("env", "bad variable name " .. tostring(name))
    end
    if type(value) ~= "string" or value:find("\0", 1, true) then
      return nil, errors.invalid_argument("env", name .. " must be a string without NUL")
    end
    local why = M.refusal(name, value)
    if why then
      return nil, errors.new("refused_env", { argument = name, detail = why })
    end
    env[name] = value
  end
  return env
end

--- Leaves this process's own environment to the variables named in `keep` (those set,
-- and only those a tenant could be given: a credential-shaped one goes even when named),
-- or without `keep` to every variable but the credential-shaped ones, so that nothing
-- loaded or started afterwards inherits anything else. The block the process started
-- with is overwritten too (core.proc.replace_environ): /proc/PID/environ reads that
-- block, which unsetenv leaves as it was.
-- @tparam[opt] {string,...} keep the names to keep
-- @treturn[1] {string,...} the names removed, sorted
-- @return[2] nil
-- @treturn[2] string why the environment could not be replaced
function M.clear_own_environment(keep)
  local core = require "corral.core"
  local wanted
  if keep then
    wanted = {}
    for _, name in ipairs(keep) do wanted[name] = true end
  end
  local kept, removed = {}, {}
  for name, value in pairs(core.proc.environ()) do
    if (not wanted or wanted[name]) and not M.refusal(name, value) then
      kept[#kept + 1] = name .. "=" .. value
    else
      removed[#removed + 1] = name
    end
  end
  table.sort(kept)
  local ok, err = core.proc.replace_environ(kept)
  if not ok then return nil, err end
  table.sort(removed)
  return removed
end

--- The environment as a sorted "NAME=value" list, as exec takes it.
-- @tparam table env name → value
-- @treturn {string,...}
function M.envp(env)
  local out = {}
  for k, v in pairs(env) do out[#out + 1] = k .. "=" .. v end
  table.sort(out)
  return out
end

return M
