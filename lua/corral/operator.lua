--- The operator's verbs on live sandboxes, shared by the REPL's helpers (corral.repl)
-- and the public API, corral.init (`sandboxes`, `ruleset`, `decisions`, `step`):
-- listing them, asking one (info, connections, decisions, ruleset, why), changing its
-- policy (allow, revoke), its namespaces against the host's, one tier step and the
-- conformance suite.
--
-- Live sandboxes are those of `corral run` processes (this one included), reached
-- through their control sockets (corral.control). A sandbox is named by its id, by
-- `id@pid` when several share an id, or by the pid of the corral process serving it;
-- left out, it is the attached one (`attach`, as `corral attach ID` sets it).
-- @module corral.operator
local core = require "corral.core"
local control = require "corral.control"
local shell = require "corral.shell"

local M = {}

local attached -- the sandbox the verbs default to (`attach`)

-- ---- finding a sandbox -----------------------------------------------------------------

-- Every live sandbox: {path =, pid =, info = the info answer} (those that answer),
-- asked all at once (corral.control.request_all): one that hangs costs one timeout.
local function live()
  local regs, paths, out = control.list(), {}, {}
  for i, reg in ipairs(regs) do paths[i] = reg.path end
  for i, answer in ipairs(control.request_all(paths, { op = "info" })) do
    if type(answer.result) == "table" then
      regs[i].info = answer.result
      regs[i].pid = regs[i].pid or math.tointeger(answer.result.pid)
      out[#out + 1] = regs[i]
    end
  end
  return out
end

-- The registration a reference names: nil (the attached one), a pid, "id" or "id@pid".
local function find(ref)
  ref = ref == nil and attached or ref
  if ref == nil then return nil, "no sandbox given, and none attached (attach(ID) or give ID)" end
  local id, pid = tostring(ref):match("^(.-)@(%d+)$")
  if math.type(ref) == "integer" or tostring(ref):match("^%d+$") then id, pid = nil, tostring(ref) end
  id = id or (not pid and tostring(ref)) or nil
  local found = {}
  for _, reg in ipairs(live()) do
    if (not pid or reg.pid == tonumber(pid)) and (not id or reg.info.id == id) then found[#found + 1] = reg end
  end
  if #found == 1 then return found[1] end
  if #found == 0 then return nil, "no live sandbox " .. tostring(ref) .. " (sandboxes() lists them)" end
  local names = {}
  for _, r in ipairs(found) do names[#names + 1] = r.info.id .. "@" .. r.pid end
  return nil, tostring(ref) .. " is ambiguous: " .. table.concat(names, ", ")
end

local function ask(ref, req)
  local reg, err = find(ref)
  if not reg then return nil, err end
  return control.request(reg.path, req)
end

-- ---- the verbs ----------------------------------------------------------------------

local function local_planes()
  local out = {}
  for _, p in ipairs(require("corral.egress.loop").planes()) do
    if p.id and p.netns then out[#out + 1] = p end
  end
  table.sort(out, function(a, b) return a.id < b.id end)
  return out
end

--- Every live sandbox of this user, in any corral process: id, mechanism, pid (of the
-- corral process serving it), the tenant's pids, limits and usage from its cgroup (or,
-- without one, from /proc: `pids`, `memory_rss`, `cpu_usec`, `from = "/proc"`). A
-- sandbox with an egress plane that this process provisioned through the Lua API, not
-- `corral run`, is listed too, with `connections`, `dns_port`, `acceptor_port` and
-- `service`.
-- @treturn {table,...}
function M.sandboxes()
  local out, seen = {}, {}
  for _, reg in ipairs(live()) do
    local i = reg.info
    seen[i.id .. "@" .. reg.pid] = true
    out[#out + 1] = { id = i.id, ref = i.id .. "@" .. reg.pid, mechanism = i.mechanism, pid = reg.pid,
      tenant_pids = i.tenant_pids, limits = i.limits, usage = i.usage, command = i.command,
      egress = i.egress and { allow = i.egress.allow, connections = i.egress.connections } or nil }
  end
  local loop = require "corral.egress.loop"
  for _, p in ipairs(local_planes()) do
    if not seen[p.id .. "@" .. core.proc.getpid()] then
      out[#out + 1] = { id = p.id, pid = core.proc.getpid(), connections = loop.count(p.id), dns_port = p.dns_port,
        acceptor_port = p.acceptor_port, service = p.service_addr }
    end
  end
  return out
end

--- Everything a sandbox's process reports about it (see corral.control `info`).
-- @param[opt] ref the sandbox (default: the attached one)
function M.info(ref)
  return ask(ref, { op = "info" })
end

--- The live egress connections of a sandbox (destination, upstream, the entry that
-- allowed it).
-- @param[opt] ref
function M.connections(ref)
  return ask(ref, { op = "connections" })
end

--- A sandbox's recent egress decisions, newest last. `decisions(n)` alone: the attached
-- sandbox's, or when none is attached this process's own (the Lua API's sandboxes).
-- @param[opt] ref
-- @tparam[opt=20] integer n
function M.decisions(ref, n)
  if (ref == nil or math.type(ref) == "integer") and n == nil then
    if not attached then return require("corral.egress.events").recent(ref or 20) end
    ref, n = nil, ref
  end
  return ask(ref, { op = "decisions", n = n or 20 })
end

--- A sandbox's nftables table as the kernel holds it: another process's decoded from
-- netlink by that process (corral.control), one this process serves (the Lua API's own)
-- as `nft list ruleset` shows it (`local_ruleset`).
-- @param[opt] ref
-- @treturn string
function M.ruleset(ref)
  if type(ref) == "string" then
    local text = M.local_ruleset(ref)
    if text then return text end
  end
  return ask(ref, { op = "ruleset" })
end

--- Which allowlist entry lets a destination through, or why none does.
-- @param[opt] ref
-- @tparam string dest "host:port"
function M.why(ref, dest)
  -- a question needs its destination: one argument is always that, never a sandbox
  if dest == nil then ref, dest = nil, ref end
  local _, err = control.parse_dest(dest)
  if err then return nil, err end
  return ask(ref, { op = "why", dest = dest })
end

--- Allows one more destination, at once, in the running sandbox's policy.
-- @param[opt] ref
-- @tparam string entry as `--allow` takes it
function M.allow(ref, entry)
  if entry == nil then ref, entry = nil, ref end
  return ask(ref, { op = "allow", entry = entry })
end

--- Revokes an entry; with `{cut = true}` the connections it no longer allows are reset.
-- @param[opt] ref
-- @tparam string entry
-- @tparam[opt] table opts `{cut = boolean}`
function M.revoke(ref, entry, opts)
  if type(entry) ~= "string" then ref, entry, opts = nil, ref, entry end
  return ask(ref, { op = "revoke", entry = entry, cut = type(opts) == "table" and opts.cut == true })
end

local NS_KINDS = { "user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time" }

--- A process's namespaces against this REPL's own (the host's, when the REPL runs on
-- the host): for each kind, its inode, the host's, and whether they are the same.
-- @param pid a pid, or a sandbox (its tenant's first pid)
-- @treturn table `{pid =, net = {inode =, host =, shared =}, ...}`
function M.namespaces(pid)
  if math.type(pid) ~= "integer" then
    local info, err = ask(pid, { op = "info" })
    if not info then return nil, err end
    pid = info.tenant_pids and info.tenant_pids[1]
    if not pid then return nil, "the sandbox has no process running" end
  end
  local out, n, why = { pid = pid }, 0, nil
  for _, kind in ipairs(NS_KINDS) do
    local fd <close>, err = core.ns.open(pid, kind)
    local own <close> = core.ns.open("self", kind)
    if fd and own then
      local a, b = core.ns.info(fd), core.ns.info(own)
      out[kind] = { inode = a.inode, host = b.inode, shared = core.ns.same(fd, own) }
      n = n + 1
    else
      why = why or err
    end
  end
  if n == 0 then return nil, tostring(why) end
  return out
end

--- Makes a sandbox the verbs' default (nil: none).
-- @param[opt] ref
-- @treturn[1] string|boolean the sandbox as `id@pid` (true when detached)
-- @treturn[1] table its registration (`info`, `pid`, `path`)
-- @return[2] nil
-- @treturn[2] string why no sandbox was found
function M.attach(ref)
  if ref == nil then
    attached = nil
    return true
  end
  local reg, err = find(ref)
  if not reg then return nil, err end
  attached = reg.info.id .. "@" .. reg.pid
  return attached, reg
end

--- The attached sandbox as `id@pid`, or nil.
-- @treturn string|nil
function M.attached()
  return attached
end

-- `nft list ruleset` in a netns owned by a user namespace of this caller's own (a plane
-- made without root): nft joins that user namespace keeping CAP_NET_ADMIN there, which
-- nsenter's child, no root in it, would lose at exec.
local function ruleset_in_own_userns(netns)
  local nft = core.path.resolve_executable("nft", "/usr/sbin:/usr/bin:/sbin:/bin")
  if nft:sub(1, 1) ~= "/" then return nil, "no nft to list the ruleset with" end
  local out = assert(io.tmpfile())
  local proc, err = core.spawn.start({ plain = true, net_admin = true, netns = netns, path = nft,
    argv = { "nft", "list", "ruleset" }, env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }, stdout = out,
    stderr = out })
  if not proc then
    out:close()
    return nil, err
  end
  local code = proc:wait(10)
  if not code then proc:kill(); code = proc:wait() end
  proc:close()
  out:seek("set")
  local text = out:read("a")
  out:close()
  return text, code
end

--- The ruleset in the netns of a sandbox this very process serves (the Lua API's own),
-- as `nft list ruleset` shows it there.
-- @tparam string id
-- @treturn string
function M.local_ruleset(id)
  for _, p in ipairs(local_planes()) do
    if p.id == id then
      if p.netns_owner == "caller" then return ruleset_in_own_userns(p.netns) end
      local netns = "/proc/" .. core.proc.getpid() .. "/fd/" .. p.netns:fileno()
      return shell.capture({ "nsenter", "--net=" .. netns, "nft", "list",
        "ruleset" })
    end
  end
  return nil, "no sandbox " .. tostring(id) .. " with an egress plane in this process"
end

--- Runs one step at the highest tier this host earns and returns its receipt (see
-- corral.tier.step): `corral.step{"/bin/echo", "hi", grants = {read = {"/srv"}}}`, or
-- `corral.step{s2 = "return 1 + 1"}` for Lua at S2.
-- @tparam table spec
-- @treturn table the receipt (its `result` holds the step's result)
-- @return[2] nil
-- @treturn[2] table the refusal
function M.step(spec)
  local tier = require "corral.tier"
  local result, rec
  if type(spec) == "table" and spec.s2 then
    result, rec = tier.s2({ code = spec.s2, grants = spec.grants, fuel = spec.fuel, memory = spec.memory })
  else
    result, rec = tier.step(spec)
  end
  if not result then return nil, rec end
  rec.result = result
  return rec
end

--- Runs the conformance suite (see corral.conformance.run) and returns its report.
-- @param mechanism a built-in name, a path to a .lua file, or a table
-- @tparam[opt] table opts `only`, `ids`, `credentials`, `progress`
-- @treturn table `{mechanism =, results =, census =, seconds =}`, or nil and an error
function M.conformance(mechanism, opts)
  return require("corral.conformance").run(mechanism, opts)
end

return M
