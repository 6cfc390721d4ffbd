--- A `corral run`'s receipt: the witness corral.run calls when the sandbox is provisioned
-- (`began`) and when everything is released (`finish`), and the Statement it seals.
--
-- What it records: the mechanism and the gate's evidence (each capability the host
-- applies around it, and the probe result the gate was given, cached for this process);
-- the policy committed to (the tenant's root plan with its environment as names only,
-- the limits, the egress allowlist and the operator's side of it, the secrets' bindings:
-- none exist yet, so `secrets` is an empty list); the start and end times; how the
-- command ended and its cgroup usage; the egress decisions counted by verdict.
-- @module corral.receipt.run
local errors = require "corral.errors"
local receipt = require "corral.receipt"

local M = {}

-- The tenant's own name files (corral.name_files), as the root built for it binds them:
-- their host path is a temporary one of this run, so the receipt names them "the
-- sandbox's own" and carries the SHA-256 of what each says.
local function own_name_files()
  local name_files = require "corral.name_files"
  local f = io.open("/etc/nsswitch.conf")
  local host_nsswitch = f and f:read("a")
  if f then f:close() end
  local contents = name_files.contents(name_files.HOSTNAME, host_nsswitch)
  local files = {}
  for dest, text in pairs(contents) do files[dest] = { text = text } end
  return files
end

-- The root plan without values a receipt must not carry: the environment as names.
local function root_plan(sb)
  local own = own_name_files()
  local srcs = {}
  for dest in pairs(own) do srcs[dest] = "the sandbox's own" end
  local plan = require("corral.tenant_root").plan(sb, { names = { files = srcs } })
  for _, m in ipairs(plan.mounts or {}) do
    if m.own then m.sha256 = assert(require("corral.core").digest.sha256(own[m.dest].text)) end
  end
  local names = {}
  for _, kv in ipairs(plan.env or {}) do names[#names + 1] = kv:match("^([^=]*)") end
  table.sort(names)
  plan.env = names
  return plan
end

local function strings(list)
  local out = {}
  for _, v in ipairs(type(list) == "table" and list or {}) do out[#out + 1] = tostring(v) end
  return out
end

-- The operator's egress policy: what --allow, --internal and --resolve set.
local function network_policy(network)
  if type(network) ~= "table" then return nil end
  local resolve = {}
  if type(network.resolve) == "table" then
    -- each name's addresses, in the order given (--resolve NAME=ADDR, repeated)
    for name, addrs in pairs(network.resolve) do
      local list = type(addrs) == "table" and strings(addrs) or { tostring(addrs) }
      resolve[#resolve + 1] = tostring(name) .. "=" .. table.concat(list, ",")
    end
    table.sort(resolve)
  end
  return { internal = strings(network.internal), resolve = resolve,
           decide = network.decide ~= nil and "a Lua hook (not committable)" or nil }
end

--- The policy a run's receipt commits to.
-- @tparam table sb the sandbox
-- @tparam string mechanism its label
-- @treturn table
function M.policy(sb, mechanism)
  local network = type(sb.network) == "table" and sb.network or nil
  return { mechanism = mechanism, root_plan = root_plan(sb), limits = sb.limits or {},
           allowlist = strings(network and network.allow), egress = network_policy(network),
           service_port = sb.service_port, secrets = {} }
end

-- The gate's evidence: each capability the host applies around mech for sb, and the
-- probe result it was checked against (corral.probe keeps each for the process).
local function gate_evidence(corral, mech, sb)
  local out = {}
  local applied = corral.mechanism.host_applied(mech, sb) or {}
  local caps = {}
  for cap in pairs(applied) do caps[#caps + 1] = cap end
  table.sort(caps)
  local probe = require "corral.probe"
  for _, cap in ipairs(caps) do
    local ok, r = pcall(probe.check, cap)
    if ok and type(r) == "table" then
      out[#out + 1] = { capability = cap, holds = r.holds, detail = tostring(r.detail),
                        probed_at = r.probed_at and receipt.time(r.probed_at) or nil }
    end
  end
  return out
end

--- A witness for one run, writing its receipt to `path`. The host key is loaded (made
-- at first use) and the path checked now, before anything runs.
-- @tparam string path the receipt file
-- @tparam {string,...} argv the command
-- @treturn table witness (`began`, `finish`), or nil and an error (`argument` "receipt")
function M.witness(path, argv)
  local prepared, err = receipt.prepare(path)
  if not prepared then return nil, err end
  local w = { started = receipt.now(), counts = { allow = 0, deny = 0 }, by_kind = {} }
  function w.began(corral, mech, sb)
    w.mechanism = corral.mechanism.label(mech)
    w.gate = gate_evidence(corral, mech, sb)
    w.policy = M.policy(sb, w.mechanism)
    local events = require "corral.egress.events"
    w.unsubscribe = function(fn) events.unsubscribe(fn) end
    w.listener = events.subscribe(function(ev)
      if ev.sandbox ~= sb.id or ev.kind == "suppressed" then return end
      local verdict = ev.verdict == "allow" and "allow" or "deny"
      local n = tonumber(ev.count) or 1
      w.counts[verdict] = w.counts[verdict] + n
      local k = w.by_kind[ev.kind] or { allow = 0, deny = 0 }
      k[verdict] = k[verdict] + n
      w.by_kind[ev.kind] = k
    end)
  end
  --- Seals and writes the receipt; returns the run's status, or 1 when the receipt
  -- could not be written (said through `say`).
  function w.finish(ended, status, say)
    if w.listener then w.unsubscribe(w.listener) end
    if not w.policy then return status end -- refused before the sandbox existed: no receipt
    local result = ended.result or {}
    local pred = {
      argv = argv, mechanism = w.mechanism, gate = w.gate, policy = w.policy,
      started = receipt.time(w.started), ended = receipt.time(receipt.now()),
      exit = { status = status, how = ended.signal and "signal before start" or result.how, code = result.code,
               limit = result.limit, torn_down = ended.sandbox and ended.sandbox.torn or false },
      usage = result.usage, egress = { allow = w.counts.allow, deny = w.counts.deny, by_kind = w.by_kind },
    }
    local st = receipt.statement("run", { receipt.subject("argv", require("corral.json").encode(argv)) }, pred)
    local ok, werr = receipt.write(prepared, st)
    if ok then return status end
    say("--receipt: not written: " .. tostring(werr))
    return 1
  end
  return w
end

--- The error a refusal of --receipt is, in the CLI's words.
function M.flagged(err)
  if errors.is(err) and err.argument == "receipt" then return errors.invalid_argument("--receipt", err.detail) end
  return err
end

return M
