--- The S1 probe: a host earns tier S1 by doing it (once per process, cached).
--
-- The probe program is the corral host itself (`corral -e`). It runs twice: as a bare
-- child, where every attempt (read a secret, fork, connect, exec, hold capabilities)
-- must succeed, else a denial could not be told from a broken attempt; then confined to
-- its runtime, where each attempt must be denied with its layer's errno and followed in
-- the same child by a control that succeeds (docs/architecture.md, invariant 2).
-- A mutation (`mutate` or CORRAL_TIER_PROBE_MUTATE: "no-landlock", "no-seccomp",
-- "no-net-filter", "no-subprocess-filter", "keep-capabilities", "control-fails",
-- "bare-control-fails") must yield S0; tests/tier_spec.lua checks each.
-- @module corral.tier.probe
local core = require "corral.core"
local leftovers = require "corral.leftovers"
local policy = require "corral.tier.policy"
local shell = require "corral.shell"
local transient = require "corral.transient"

local M = {}

local cached

-- The program both runs execute. One line per attempt: "<what> ok" or "<what> denied
-- <errno>", then "<what>-control ok|failed". Exec is last: where it succeeds, the
-- process is gone (exit 42).
local PROGRAM = [[
local core = require "corral.core"
local secret, port = os.getenv("PROBE_SECRET"), tonumber(os.getenv("PROBE_PORT"))
local granted, host = os.getenv("PROBE_GRANTED"), os.getenv("PROBE_HOST")
local function say(...) io.write(table.concat({ ... }, " "), "\n") io.flush() end
local function report(what, ok, _, code) say(what, ok and "ok" or "denied", tostring(code)) end
local f, err, code = io.open(secret)
report("read", f, err, code)
if f then f:close() end
local g = io.open(granted, "rb")
say("read-control", g and g:read(4) == "\127ELF" and "ok" or "failed")
if g then g:close() end
report("capabilities", core.tier.attempt("capabilities"))
local h = io.open(granted, "rb")
say("capabilities-control", h and h:read(4) == "\127ELF" and "ok" or "failed")
if h then h:close() end
report("fork", core.tier.attempt("fork"))
say("fork-control", core.tier.attempt("thread") and "ok" or "failed")
report("connect", core.tier.attempt("connect", port))
say("connect-control", core.tier.attempt("socketpair") and "ok" or "failed")
report("exec", core.proc.execve(host, { host, "-e", "os.exit(42)" }, {}, "/"))
say("exec-control", "ok")
os.exit(0)
]]

local EXPECTED = { read = "EACCES", capabilities = "EPERM", fork = "EPERM", connect = "EPERM", exec = "EPERM" }
local ORDER = { "read", "fork", "connect", "exec" }

local function errno_name(code)
  for k, v in pairs(core.errno) do
    if v == tonumber(code) then return k end
  end
  return tostring(code)
end

local function parse(out)
  local seen = {}
  for what, verdict, code in out:gmatch("(%S+) (%S+) ?(%S*)\n") do
    seen[what] = { verdict = verdict, errno = code ~= "" and code ~= "nil" and errno_name(code) or nil }
  end
  return seen
end

local function run(plan)
  local out = io.tmpfile()
  local devnull = assert(io.open("/dev/null"))
  plan.stdin, plan.stdout, plan.stderr = devnull, out, out
  plan.timeout = 10
  local res, err = core.tier.run(plan)
  devnull:close()
  out:seek("set")
  local text = out:read("a") or ""
  out:close()
  return res, err, text
end

-- The probe proper; returns holds, detail, the receipt's `probe` table.
local function probe_once(mutate)
  local host = core.proc.host_executable()
  if not host then return false, "the corral executable was not found for the probe program" end
  host = core.path.resolve_file(host) or host
  local abi = core.landlock.abi()
  if not abi then return false, "Landlock is not available here" end
  local dir = core.fs.mkdtemp(leftovers.base() .. "/corral-tier-probe-")
  if not dir then return false, "cannot make a scratch directory" end
  local secret = dir .. "/secret"
  local f = assert(io.open(secret, "w"))
  f:write("secret\n")
  f:close()
  local lfd, port = core.sock.listen("127.0.0.1", 0)
  if not lfd then core.fs.remove_tree(dir) return false, "cannot listen on loopback: " .. tostring(port) end
  local granted = mutate == "control-fails" and secret or host
  local env = { "PROBE_SECRET=" .. secret, "PROBE_PORT=" .. port, "PROBE_GRANTED=" .. granted,
    "PROBE_HOST=" .. host }
  local argv = { host, "-e", PROGRAM }
  local report = { control = false, attempts = {} }

  local bare_env = env
  if mutate == "bare-control-fails" then
    -- the bare child's connect meets a port nobody listens on: its attempt fails there
    local dead, dead_port = assert(core.sock.listen("127.0.0.1", 0))
    dead:close()
    bare_env = { env[1], "PROBE_PORT=" .. tostring(dead_port), env[3], env[4] }
  end
  local cres, cerr, cout = run({ path = host, argv = argv, env = bare_env })
  local cseen = parse(cout)
  local function succeeded(what) return cseen[what] ~= nil and cseen[what].verdict == "ok" end
  local control_ok = cres and cres.status == 42 and succeeded("read") and succeeded("fork") and
    succeeded("connect")
  report.control = control_ok and true or false

  local g = assert(policy.check({}))
  local pol = policy.derive(g, { name = "landlock/" .. abi .. "+seccomp" }, { host })
  local plan = { path = host, argv = argv, env = env, rules = pol.rules, filters = pol.filters,
    supervised = pol.supervised, drop_caps = pol.drop_caps }
  if mutate == "no-landlock" then plan.rules = nil end
  if mutate == "keep-capabilities" then plan.drop_caps = nil end
  if mutate == "no-seccomp" then plan.filters, plan.supervised = { "tty" }, nil end
  if mutate == "no-net-filter" then plan.filters = { "tty" } end
  if mutate == "no-subprocess-filter" then plan.supervised = nil end
  local res, err, out = run(plan)
  lfd:close()
  core.fs.remove_tree(dir)
  if not control_ok then
    return false, "control failed: the attempts did not succeed in a bare child (" ..
      tostring(cres and cres.status or cerr) .. "): " .. cout:gsub("%s+$", ""), report
  end
  if not res then return false, "the confined probe did not start: " .. tostring(err), report end
  local seen = parse(out)
  local holds = res.status == 0
  -- capabilities are attempted only where the bare child held some: elsewhere no control
  -- tells a drop apart
  local order = { table.unpack(ORDER) }
  if succeeded("capabilities") then table.insert(order, 2, "capabilities") end
  for _, what in ipairs(order) do
    local a, c = seen[what], seen[what .. "-control"]
    local denied = a ~= nil and a.verdict == "denied" and a.errno == EXPECTED[what]
    local controlled = c ~= nil and c.verdict == "ok"
    report.attempts[#report.attempts + 1] = { attempt = what, denied = denied, errno = a and a.errno,
      control_after = controlled }
    holds = holds and denied and controlled
  end
  if not holds then
    return false, string.format("the confined probe exited %s: %s", tostring(res.status),
      (out:gsub("%s+$", ""):gsub("\n", "; "))), report
  end
  return true, string.format("landlock/%%d+seccomp: %s were denied, each followed by a control " ..
    "that succeeded; all succeeded in a bare child", table.concat(order, ", ")):format(abi), report, abi
end

local SANDBOX_EXEC = "/usr/bin/sandbox-exec"

--- The seatbelt probe (macOS, only where `sandbox-exec` runs): a read allowed unconfined,
-- denied under the tier profile, then a granted read in the same child.
-- @treturn table `{tier = "S1", mechanism = "seatbelt/<version>", detail =}`, or nil and why not
function M.seatbelt()
  if not core.path.resolve_file(SANDBOX_EXEC) then return nil, SANDBOX_EXEC .. " is not on this host" end
  local version = shell.capture({ "/usr/bin/sw_vers", "-productVersion" }):match("^%s*(%S+)")
  if not version then return nil, "no macOS version (sw_vers)" end
  local dir = core.fs.mkdtemp(leftovers.base() .. "/corral-tier-sb-")
  if not dir then return nil, "cannot make a scratch directory" end
  local real = core.path.resolve(dir)
  local secret, granted = real .. "/secret", real .. "/granted"
  local f = assert(io.open(secret, "w")) f:write("secret\n") f:close()
  assert(core.fs.mkdir(granted, tonumber("755", 8)))
  f = assert(io.open(granted .. "/f", "w")) f:write("granted\n") f:close()
  local control, ccode = shell.capture({ SANDBOX_EXEC, "-p", "(version 1)(allow default)", "/bin/cat", secret })
  local g = assert(policy.check({ read = { granted }, subprocess = true }))
  local profile, perr = require("corral.sbpl").tier_profile(g, "/bin/sh")
  local out = profile and shell.capture({ SANDBOX_EXEC, "-p", profile, "/bin/sh", "-c",
    "cat " .. shell.quote(secret) .. " || echo denied; cat " .. shell.quote(granted .. "/f") }) or ""
  core.fs.remove_tree(dir)
  if not (ccode == 0 and control:find("secret", 1, true)) then return nil, "control failed: " .. control end
  if not profile then return nil, tostring(perr) end
  if out:find("secret\n", 1, true) or not out:find("denied\ngranted\n", 1, true) then
    return nil, "the confined read was not denied, or its control failed: " .. out
  end
  return { tier = "S1", mechanism = "seatbelt/" .. version, detail = "seatbelt/" .. version ..
    ": a read outside the grants was denied, then a granted one succeeded; it succeeded unconfined" }
end

--- Runs the S1 probe (cached per process unless `mutate` is given).
-- @tparam[opt] string mutate a deliberate weakening (see the module's description)
-- @treturn table `{tier = "S1"|"S0", mechanism = string|nil, detail =, probe = {control, attempts}}`,
--   and `ran_out` (what ran out, corral.transient) when S1 is not known: a step then fails
--   (corral.tier) instead of running at S0
function M.check(mutate)
  mutate = mutate or os.getenv("CORRAL_TIER_PROBE_MUTATE")
  if mutate == "" then mutate = nil end
  if not mutate and cached then return cached end
  if not core.landlock.abi() and not mutate then
    local sb = M.seatbelt()
    if sb then
      sb.probe = { control = true, attempts = { { attempt = "read", denied = true, control_after = true } } }
      cached = sb
      return sb
    end
  end
  local ok, holds, detail, report, abi = pcall(probe_once, mutate)
  if not ok then holds, detail = false, "probe error: " .. tostring(holds) end
  local r = { tier = holds and "S1" or "S0", mechanism = holds and ("landlock/" .. abi .. "+seccomp") or nil,
    abi = holds and abi or nil, detail = detail, probe = report or { control = false, attempts = {} },
    mutate = mutate }
  -- a resource that ran out while probing: not known, and not kept (corral.transient)
  r.ran_out = not holds and not mutate and transient.of(tostring(detail)) or nil
  if not mutate and not r.ran_out then cached = r end
  return r
end

--- Forgets the cached result.
function M.reset()
  cached = nil
end

return M
