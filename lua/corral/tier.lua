--- Isolation tiers, earned by probe and sealed in a receipt.
--
-- * S0: a bare child, nothing confined; the receipt says so.
-- * S1: Landlock and seccomp, no namespace, so it holds where user namespaces are
--   restricted. Earned only where corral.tier.probe holds.
-- * S2: untrusted Lua in a fresh state with fuel and a memory cap, in a child at S1.
--
-- Every step returns `result, receipt` (corral.tier.receipt), the receipt sealing the
-- SHA-256 commitment to the exact policy applied (corral.tier.policy).
-- @module corral.tier
local core = require "corral.core"
local errors = require "corral.errors"
local policy = require "corral.tier.policy"
local probe = require "corral.tier.probe"
local receipt = require "corral.tier.receipt"

local M = {}

--- The tier this host earns (the cached S1 probe; see corral.tier.probe).
-- @treturn table `{tier =, mechanism =, detail =, probe =}`
function M.earned()
  return probe.check()
end

-- The refusal for a probe that is not known (a resource ran out while probing: never
-- a step at S0 for it), or nil.
local function unknown(earned)
  if not earned.ran_out then return nil end
  return errors.resource("tier S1", "probing tier S1: " .. tostring(earned.detail), earned.ran_out)
end

local function environment(names)
  local host, env = core.proc.environ(), {}
  for _, name in ipairs(names) do
    if host[name] ~= nil then env[#env + 1] = name .. "=" .. host[name] end
  end
  return env
end

local steps = 0

-- The egress plane for an allowlisted step is made and programmed before the program
-- exists, owned by the caller's user namespace (without root: a user namespace of the
-- caller's own, which the program joins first), where the program (which joins it and
-- drops every capability) holds none (docs/architecture.md, invariant 4).
local function egress_plane(g, network)
  network = network or {}
  steps = steps + 1
  local id = string.format("step-%d-%d", core.proc.getpid(), steps)
  local pl, err = require("corral.egress.plane").new(id, { allow = g.net, internal = network.internal,
    resolve = network.resolve })
  if not pl then
    return nil, errors.cannot_enforce("grants.net", "the egress plane an allowlist needs could not be built " ..
      "(a network namespace of corral's own, programmed with nftables): " ..
      tostring(errors.is(err) and err.detail or err))
  end
  pl.port_key = id
  return pl
end

local function run_served(pl, plan)
  local loop = require "corral.egress.loop"
  plan.netns = pl.netns
  loop.add(pl)
  local running, err, errno = core.tier.start(plan)
  local res
  if running then
    repeat local hit = loop.step(1, { running }) until hit[1]
    res, err, errno = running:result()
  end
  loop.remove(pl)
  pl:close()
  return res, err, errno
end

local function egress_facts(pol, network)
  network = network or {}
  local internal = {}
  for _, c in ipairs(network.internal or {}) do internal[#internal + 1] = tostring(c) end
  table.sort(internal)
  local resolve = {}
  if type(network.resolve) == "table" then
    for name, addrs in pairs(network.resolve) do
      local list = type(addrs) == "table" and addrs or { addrs }
      local texts = {}
      for _, a in ipairs(list) do texts[#texts + 1] = tostring(a) end
      table.sort(texts)
      resolve[#resolve + 1] = tostring(name) .. " " .. table.concat(texts, ",")
    end
  elseif network.resolve ~= nil then
    resolve[1] = "(a function of the operator's)"
  end
  table.sort(resolve)
  pol.internal, pol.resolve = internal, resolve
end

-- Runs one plan under the policy and builds its receipt, `extra` merged in.
local function run_sealed(pol, g, earned, plan, extra, network)
  if pol.egress then egress_facts(pol, network) end
  local commitment, cerr = policy.commitment(pol, g)
  if not commitment then return nil, cerr end
  plan.rules, plan.filters, plan.supervised, plan.drop_caps = pol.rules, pol.filters, pol.supervised,
    pol.drop_caps
  local meter = receipt.meter()
  local res, err, errno
  if pol.egress then
    local pl, perr = egress_plane(g, network)
    if not pl then return nil, perr end
    res, err, errno = run_served(pl, plan)
  else
    res, err, errno = core.tier.run(plan)
  end
  if not res then
    -- a program that could not be executed gets a shell's 126/127, still sealed; any other
    -- failure is a layer that could not be built: refused (invariant 1)
    if not tostring(err):match("^exec:") then
      return nil, errors.cannot_enforce("tier " .. pol.tier, "could not be applied: " .. tostring(err))
    end
    local status = errno == core.errno.ENOENT and core.exit.NOTFOUND or core.exit.NOEXEC
    res = { status = status, wall_s = 0, cpu_s = 0, max_rss_kb = 0, error = err }
  end
  local rec = {
    tier = pol.tier, mechanism = pol.mechanism or "none", commitment = commitment, grants = g, exit = res.status,
    wall_s = res.wall_s, cpu_s = res.cpu_s, max_rss = res.max_rss_kb, energy = receipt.energy(meter, res.cpu_s),
    probe = earned.probe,
    residue = pol.tier == "S0" and { "everything: S0 confines nothing" } or policy.RESIDUE,
  }
  receipt.canonical_of[rec] = policy.canonical(pol, g)
  if res.timed_out then rec.timed_out = true end
  if res.execs_denied and res.execs_denied > 0 then rec.execs_denied = res.execs_denied end
  for k, v in pairs(extra or {}) do rec[k] = v end
  return res, rec
end

--- Runs one command at the highest tier this host earns for its grants.
-- @tparam table spec `cmd`, `grants`, `min_tier = "S1"` (refuse rather than run at S0),
--   `timeout`, `stdin/stdout/stderr`, `receipts` (a file), `network` (`internal`, `resolve`)
-- @treturn table result `{exit =, timed_out =}`, and the receipt; or nil and a refusal
function M.step(spec)
  if type(spec) ~= "table" then return nil, errors.invalid_argument("step", "takes a table") end
  local g, err = policy.check(spec.grants or {})
  if not g then return nil, err end
  local argv = spec.cmd or { table.unpack(spec) }
  if type(argv) ~= "table" or type(argv[1]) ~= "string" then
    return nil, errors.invalid_argument("cmd", "a command is required")
  end
  local path = core.path.resolve_executable(argv[1])
  if not path or path:sub(1, 1) ~= "/" then
    return nil, errors.invalid_argument("cmd", argv[1] .. ": not found")
  end
  local earned = probe.check()
  if earned.ran_out then return nil, unknown(earned) end
  if spec.min_tier == "S1" and earned.tier ~= "S1" then
    return nil, errors.cannot_enforce("tier S1", "this host did not earn it: " .. tostring(earned.detail))
  end
  local pol = { tier = "S0" }
  local plan_path, plan_argv = path, argv
  if earned.mechanism and earned.mechanism:match("^seatbelt/") then
    local serr
    pol, serr = policy.derive_seatbelt(g, { name = earned.mechanism }, path)
    if not pol then return nil, serr end
    plan_path, plan_argv = "/usr/bin/sandbox-exec", { "/usr/bin/sandbox-exec", "-p", pol.profile, path,
      table.unpack(argv, 2) }
  elseif earned.tier == "S1" then
    pol = policy.derive(g, { name = earned.mechanism })
    -- resolve before grant: the program is exec'd by the path the rules cover (invariant 3)
    local runtime = policy.runtime_dirs()
    if not policy.covered(path, runtime) and not policy.covered(path, g.exec) then
      return nil, errors.invalid_argument("grants.exec", path .. " is neither in the runtime (" ..
        table.concat(runtime, ", ") .. ") nor granted exec")
    end
  end
  local plan = { path = plan_path, argv = plan_argv, env = environment(g.env), cwd = spec.cwd, timeout = spec.timeout,
    stdin = spec.stdin, stdout = spec.stdout, stderr = spec.stderr }
  local res, rec = run_sealed(pol, g, earned, plan, { cmd = argv }, spec.network)
  if not res then return nil, rec end
  if spec.receipts then
    local ok, aerr = receipt.append(rec, spec.receipts)
    if not ok then return nil, errors.invalid_argument("receipts", tostring(aerr)) end
  end
  return { exit = res.status, timed_out = res.timed_out or nil, error = res.error }, rec
end

-- The S2 child's program: request on stdin, evaluated in core.vm, outcome as JSON.
-- Values travel as {value = v} (nil as {}) and flat tables as {pairs = {{k, v}, ...}}
-- so that nil, integer keys and key types survive JSON.
local S2_RUNNER = [[
local json = require "dkjson"
local core = require "corral.core"
local req = json.decode(io.read("a"))
-- The child shows its own confinement before it evaluates anything: a read of a
-- directory outside its grants (req.denied) and a fork must be denied, then a granted
-- read must succeed.
local function attest()
  local f, _, rerr = io.open(req.denied)
  if f then f:close() end
  local forked, _, ferr = core.tier.attempt("fork")
  local g = io.open(req.granted, "rb")
  local control = g and g:read(4) == "\127ELF"
  if g then g:close() end
  return { read = f and "allowed" or tostring(rerr), fork = forked and "allowed" or tostring(ferr),
           control = control and true or false }
end
local attested = attest()
local ok, r, st = core.vm.eval(req.code, { fuel = req.fuel, memory = req.memory, read = req.read,
  clock = req.clock })
local function wrap(v)
  if type(v) ~= "table" then return { value = v } end
  local pairs_ = {}
  for k, x in pairs(v) do pairs_[#pairs_ + 1] = { k, x } end
  return { pairs = pairs_ }
end
local values
if ok then
  values = {}
  for i = 1, r.n do values[i] = wrap(r[i]) end
end
io.write(json.encode({ ok = ok, values = values, failure = not ok and r or nil, stats = st, attested = attested }))
]]

--- The S2 child's program (what `corral.tier.s2` runs in its S1 child), for tests that
-- run it bare to see its own check fail.
M.S2_RUNNER = S2_RUNNER

--- Whether an S2 child's own check shows it confined: the read of a directory outside
-- its grants denied by Landlock (EACCES), the fork denied by seccomp (EPERM), the
-- granted read after them.
-- @tparam table attested the child's `attested` table
-- @tparam string denied the directory the child was asked to read
-- @treturn boolean, and a sentence saying what was seen
function M.s2_confined(attested, denied)
  if type(attested) ~= "table" then return false, "the child reported no check of its confinement" end
  local ok = attested.read == tostring(core.errno.EACCES) and attested.fork == tostring(core.errno.EPERM) and
    attested.control == true
  return ok, string.format("the child's read of %s: %s, its fork: %s, a granted read after them: %s",
    tostring(denied), attested.read == "allowed" and "allowed" or "denied (errno " .. tostring(attested.read) .. ")",
    attested.fork == "allowed" and "allowed" or "denied (errno " .. tostring(attested.fork) .. ")",
    attested.control and "ok" or "failed")
end

-- Directories the S2 child may be asked to show denied, in order of preference.
local DENIED_CANDIDATES = { "/etc", "/" }

-- A directory outside every path the child's policy lets it read, and readable by any
-- user, so that only Landlock can refuse it (not its mode once capabilities are dropped).
local function outside_grants(readable)
  for _, d in ipairs(DENIED_CANDIDATES) do
    local st = core.fs.lstat(d)
    if st and st.type == "dir" and st.mode & 5 == 5 and not policy.covered(d, readable) then return d end
  end
  return nil
end

local function unwrap(w)
  if type(w) ~= "table" then return nil end
  if w.pairs then
    local t = {}
    for _, kv in ipairs(w.pairs) do t[kv[1]] = kv[2] end
    return t
  end
  return w.value
end

--- The S2 defaults: instructions, bytes, seconds.
M.S2_FUEL, M.S2_MEMORY, M.S2_TIMEOUT = 100000000, 64 * 1024 * 1024, 30

--- Runs untrusted Lua at S2, in a child confined at S1 (defence in depth). Grants reach
-- the code only as functions: `read` as read_file(path), `clock` as clock() and time().
-- @tparam table spec `{code =, grants =, fuel =, memory =, timeout =, receipts =}`
-- @treturn table `{ok = true, values =}` or `{ok = false, failure = {kind =, message =}}`,
--   and the receipt; or nil and a refusal
function M.s2(spec)
  if type(spec) ~= "table" or type(spec.code) ~= "string" then
    return nil, errors.invalid_argument("code", "S2 takes the Lua source as a string")
  end
  local g, err = policy.check(spec.grants or {}, "S2")
  if not g then return nil, err end
  for _, k in ipairs({ "write", "exec", "env" }) do
    if #g[k] > 0 then
      return nil, errors.invalid_argument("grants." .. k, "S2 offers no checked function for it (read, clock and " ..
        "random are what Lua code at S2 can be given)")
    end
  end
  for _, k in ipairs({ "net", "subprocess" }) do
    if g[k] then
      return nil, errors.invalid_argument("grants." .. k, "S2 offers no checked function for it (read, clock " ..
        "and random are what Lua code at S2 can be given)")
    end
  end
  local fuel = math.tointeger(spec.fuel or M.S2_FUEL)
  local memory = math.tointeger(spec.memory or M.S2_MEMORY)
  if not fuel or fuel < 1 then return nil, errors.invalid_argument("fuel", "must be a positive integer") end
  if not memory or memory < 1 then return nil, errors.invalid_argument("memory", "must be a positive integer") end
  local earned = probe.check()
  if earned.ran_out then return nil, unknown(earned) end
  if earned.tier ~= "S1" then
    return nil, errors.cannot_enforce("tier S2", "its child must be confined at S1, which this host did not " ..
      "earn: " .. tostring(earned.detail))
  end
  local host = core.proc.host_executable()
  host = host and core.path.resolve_file(host)
  if not host then return nil, errors.cannot_enforce("tier S2", "the corral executable was not found") end
  -- dkjson outside the runtime (a user's luarocks tree) is granted read too
  local dkjson_path = package.searchpath("dkjson", package.path)
  dkjson_path = dkjson_path and core.path.resolve_file(dkjson_path)
  local extra_read = {}
  if dkjson_path and not policy.covered(dkjson_path, policy.runtime_dirs()) then extra_read[1] = dkjson_path end
  local pol = policy.derive(g, { name = "lua/" .. _VERSION:match("%d+%.%d+") .. "+" .. earned.mechanism,
    tier = "S2" }, { host }, extra_read)
  pol.limits = { fuel = fuel, memory = memory }
  local readable = { host, table.unpack(extra_read) }
  for _, list in ipairs({ g.read, policy.runtime_dirs() }) do table.move(list, 1, #list, #readable + 1, readable) end
  local denied = outside_grants(readable)
  if not denied then
    return nil, errors.cannot_enforce("tier S2", "grants.read covers every directory its child could show " ..
      "denied (" .. table.concat(DENIED_CANDIDATES, ", ") .. "), so the child cannot show its confinement")
  end
  local json = require "dkjson"
  local input, output = io.tmpfile(), io.tmpfile()
  input:write(json.encode({ code = spec.code, fuel = fuel, memory = memory, read = g.read, clock = g.clock,
    granted = host, denied = denied }))
  input:seek("set")
  local devnull = assert(io.open("/dev/null", "w"))
  local plan = { path = host, argv = { host, "-e", S2_RUNNER }, env = {}, cwd = "/",
    timeout = spec.timeout or M.S2_TIMEOUT, stdin = input, stdout = output, stderr = devnull }
  local res, rec = run_sealed(pol, g, earned, plan, {})
  input:close()
  devnull:close()
  if not res then output:close() return nil, rec end
  output:seek("set")
  local text = output:read("a") or ""
  output:close()
  local out = json.decode(text)
  local result
  -- defence in depth is claimed only where the child showed it (invariant 1)
  local confined, seen = M.s2_confined(type(out) == "table" and out.attested, denied)
  if type(out) == "table" and not confined then
    return nil, errors.cannot_enforce("tier S2", "its child is not confined at S1: " .. seen)
  end
  if res.timed_out then
    result = { ok = false, failure = { kind = "timeout", message = "the wall-clock limit (" ..
      tostring(plan.timeout) .. " s) ended the S2 child" } }
  elseif type(out) ~= "table" then
    result = { ok = false, failure = { kind = "child", message = "the S2 child exited " .. tostring(res.status) ..
      " without a result" } }
  elseif out.ok then
    local values = { n = #out.values }
    for i, w in ipairs(out.values) do values[i] = unwrap(w) end
    result = { ok = true, values = values }
  else
    result = { ok = false, failure = out.failure }
  end
  local stats = type(out) == "table" and out.stats or {}
  rec.s2 = { fuel = fuel, memory = memory, fuel_used = stats.fuel_used, memory_peak = stats.memory_peak,
             output = stats.output, confined = confined and seen or nil }
  if result.failure then rec.failure = result.failure end
  -- the step's own status, the one `corral step` exits with, not its runner's
  rec.s2.child_exit, rec.exit = res.status, result.ok and 0 or 1
  if spec.receipts then
    local ok, aerr = receipt.append(rec, spec.receipts)
    if not ok then return nil, errors.invalid_argument("receipts", tostring(aerr)) end
  end
  return result, rec
end

return M
