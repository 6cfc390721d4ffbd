--- The REPL as a diagnostic console: the helpers it defines as globals, how it prints
-- results (`print`, through corral.pretty) and what Tab offers (`complete`). The host
-- (core/host/main.c) calls `install` when a REPL starts.
--
--     corral> help()                      -- every helper, one line each; help "why"
--     corral> sandboxes()                 -- every live sandbox of this user (any process)
--     corral> why("tenant", "pypi.org:443")
--     corral> attach "tenant"             -- the helpers' default sandbox from here on
--
-- Live sandboxes are those of `corral run` processes (this one included), reached
-- through their control sockets (corral.control). A sandbox is named by its id, by
-- `id@pid` when several share an id, or by the pid of the corral process serving it.
-- @module corral.repl
local core = require "corral.core"
local control = require "corral.control"
local pretty = require "corral.pretty"
local shell = require "corral.shell"

local M = {}

local attached -- the sandbox the helpers default to (`attach`)

-- ---- finding a sandbox -----------------------------------------------------------------

-- Every live sandbox: {path =, pid =, info = the info answer} (those that answer),
-- asked all at once (corral.control.request_all): one that hangs costs one timeout.
local function live()
  local regs, paths, out = control.list(), {}, {}
  for i, reg in ipairs(regs) do paths[i] = reg.path end
  for i, answer in ipairs(control.request_all(paths, { op = "info" })) do
    if type(answer.result) == "table" then
      regs[i].info = answer.result
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

-- ---- the helpers -----------------------------------------------------------------------

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
  if dest == nil and type(ref) == "string" and ref:find(":%d+$") then ref, dest = nil, ref end
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

--- Makes a sandbox the helpers' default (nil: none), as `corral attach ID` does.
-- @param[opt] ref
function M.attach(ref)
  if ref == nil then
    attached = nil
    rawset(_G, "_PROMPT", nil)
    return true
  end
  local reg, err = find(ref)
  if not reg then return nil, err end
  attached = reg.info.id .. "@" .. reg.pid
  rawset(_G, "_PROMPT", "corral[" .. reg.info.id .. "]> ")
  return attached
end

--- `corral attach ID`: attaches, then opens the REPL (the host's `corral.host.repl`).
-- @tparam {string,...} argv `{"attach", ID}`
-- @tparam function fail the CLI's `fail(cmd, err)` → exit status
-- @treturn integer exit status
function M.attach_main(argv, fail)
  local errors = require "corral.errors"
  if #argv ~= 2 then
    return fail("attach", errors.invalid_argument("ID", "give one sandbox (corral attach ID)"))
  end
  local ok, err = M.attach(argv[2])
  if not ok then return fail("attach", err) end
  local has_host, host = pcall(require, "corral.host")
  if not has_host then return fail("attach", "the REPL needs the corral executable (corral.host)") end
  io.write("attached to ", ok, "\n")
  host.repl()
  return 0
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

-- ---- help ------------------------------------------------------------------------------

--- The helpers the REPL defines as globals, in the order `help()` lists them: name,
-- usage, one line, and the longer text `help(name)` prints.
M.HELPERS = {
  { name = "help", usage = "help([name])", brief = "this list, or one helper explained",
    long = "help() lists every helper; help(\"why\") or help(why) explains one." },
  { name = "sandboxes", usage = "sandboxes()", brief = "every live sandbox of this user, in any corral process",
    long = [[Each: id, ref (id@pid, unique), mechanism, pid (the corral process serving it),
tenant_pids, limits, usage from its cgroup (memory_current, memory_peak, pids, cpu_usec;
without a cgroup, from /proc: pids, memory_rss summed, cpu_usec, from = "/proc"),
command, and egress (its allowlist, live connections) when it has a network. A sandbox
is listed while its `corral run` lives; a killed one's registration is swept.]] },
  { name = "info", usage = "info([id])", brief = "everything a sandbox's corral process reports about it",
    long = "As sandboxes() for one sandbox, plus its cgroups, storage and egress ports." },
  { name = "connections", usage = "connections([id])", brief = "the sandbox's live egress connections",
    long = [[Each relayed connection: its destination (name or ip, port), the upstream address
it was connected to, and the allowlist entry that allowed it.]] },
  { name = "decisions", usage = "decisions([id], [n])", brief = "the sandbox's last n egress decisions (default 20)",
    long = [[DNS answers, connects and their ends (closed, failed, cut), each with its verdict and
reason, newest last. decisions(n) alone: the attached sandbox's, or (none attached) this
process's own.]] },
  { name = "ruleset", usage = "ruleset([id])", brief = "the sandbox's nftables table, read back from the kernel",
    long = [[Decoded from netlink (the read-back corral verifies its ruleset with): each chain with
its hook, priority and policy, and each rule's expressions.]] },
  { name = "why", usage = "why([id], \"host:port\")",
    brief = "which allowlist entry lets host:port through, or why none",
    long = [[Decided with the sandbox's current policy, as its next connection would be (nothing is
logged): verdict, reason, the entry, and for a name what its DNS query gets.]] },
  { name = "allow", usage = "allow([id], entry)", brief = "allow one more destination in the running sandbox",
    long = [[entry as --allow takes it (pypi.org:443, 10.0.0.0/8:5432). Applies to the next DNS
query and connection; the ruleset's ports follow.]] },
  { name = "revoke", usage = "revoke([id], entry, [{cut = true}])", brief = "revoke an entry of the running sandbox",
    long = [[Applies to the next decision. With {cut = true} the open connections the policy no
longer allows are reset too (each logged as a cut decision).]] },
  { name = "namespaces", usage = "namespaces(pid | id)", brief = "a process's namespaces against the host's",
    long = [[For each kind (user, mnt, pid, net, ipc, uts, cgroup, time): the process's namespace
inode, this REPL's, and whether they are shared. Given a sandbox, its tenant's first pid.]] },
  { name = "attach", usage = "attach(id) / attach()", brief = "make a sandbox the helpers' default (none: detach)",
    long = [[`corral attach ID` opens the REPL attached. The prompt names the sandbox; every
helper's id argument may then be left out.]] },
  { name = "pp", usage = "pp(value, [opts])", brief = "a value written out as a table (what the REPL prints)",
    long = "opts: {depth = 6, width = 96, items = 200}. Results print this way already." },
  { name = "step", usage = "step{argv..., grants =} / step{s2 = code}",
    brief = "one step at the best tier (corral.tier)",
    long = "Returns the step's receipt; its result field holds what the step returned." },
  { name = "conformance", usage = "conformance(mechanism, [opts])", brief = "the conformance report of a mechanism",
    long = [[As `corral conformance`: each guarantee held, breached, unavailable or void, and the
census. opts: {only = "privilege" or a list of groups, ids = {[id] = true}, credentials =
a probe hook, progress = fn(result, i, n)}.]] },
}

local by_name = {}
for _, h in ipairs(M.HELPERS) do by_name[h.name] = h end

--- Prints the helpers (no name) or one helper's usage and longer text.
-- @param[opt] name a helper's name, or the helper itself
function M.help(name)
  if type(name) == "function" then
    for n, fn in pairs(M.globals()) do
      if fn == name then name = n end
    end
  end
  if name == nil then
    local lines = { "REPL helpers (help(\"name\") for one; `corral` and `core` are loaded):" }
    for _, h in ipairs(M.HELPERS) do lines[#lines + 1] = string.format("  %-22s %s", h.usage, h.brief) end
    lines[#lines + 1] = attached and ("attached to " .. attached) or "attached to none (attach(id))"
    io.write(table.concat(lines, "\n"), "\n")
    return
  end
  local h = by_name[tostring(name)]
  if not h then return nil, "no helper " .. tostring(name) .. " (help() lists them)" end
  io.write(h.usage, "\n  ", h.brief, "\n\n", h.long, "\n")
end

--- The REPL's globals, by name.
-- @treturn table
function M.globals()
  return { help = M.help, sandboxes = M.sandboxes, info = M.info, connections = M.connections,
    decisions = M.decisions, ruleset = M.ruleset, why = M.why, allow = M.allow, revoke = M.revoke,
    namespaces = M.namespaces, attach = M.attach,
    pp = function(v, opts) io.write(pretty.format(v, opts), "\n") end,
    step = M.step }
end

--- Defines the helpers as globals (the host calls it when a REPL starts). `conformance`
-- stays the module the host binds.
function M.install()
  for name, fn in pairs(M.globals()) do rawset(_G, name, fn) end
  if attached then rawset(_G, "_PROMPT", "corral[" .. attached:match("^(.-)@") .. "]> ") end
end

-- ---- printing and completion -----------------------------------------------------------

--- Prints the REPL's results (see corral.pretty.results).
function M.print(...)
  io.write(pretty.results(...), "\n")
  io.flush()
end

-- The fields a value offers: a table's string keys, and its __index table's.
local function fields(v, out, seen)
  seen = seen or {}
  if seen[v] then return out end
  seen[v] = true
  if type(v) == "table" then
    for k in pairs(v) do
      if type(k) == "string" then out[k] = true end
    end
  end
  local mt = getmetatable(v)
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then fields(rawget(mt, "__index"), out, seen) end
  return out
end

local function keyword_list()
  local kw = {}
  for w in ("and break do else elseif end false for function goto if in local nil not or repeat return then true "
    .. "until while"):gmatch("%a+") do kw[#kw + 1] = w end
  return kw
end
local KEYWORDS = keyword_list()

--- What Tab offers for the word before the cursor: globals and keywords for a name,
-- fields (string keys, methods through __index) after `a.b.` or `a:`.
-- @tparam string text the word, e.g. "corral.sand" or "sb:st"
-- @treturn {string,...} whole words, sorted
function M.complete(text)
  local prefix, sep, partial = text:match("^(.*)([.:])([%w_]*)$")
  local names
  if prefix then
    local v = _G
    for part in prefix:gmatch("[^.:]+") do
      if type(v) ~= "table" and type(v) ~= "userdata" and type(v) ~= "string" then return {} end
      local ok, x = pcall(function() return v[part] end)
      if not ok then return {} end
      v = x
    end
    if type(v) == "string" then v = string end
    names = fields(v, {})
  else
    prefix, sep, partial = "", "", text
    names = fields(_G, {})
    for _, k in ipairs(KEYWORDS) do names[k] = true end
  end
  local out = {}
  for name in pairs(names) do
    if name:sub(1, #partial) == partial and name:match("^[%a_][%w_]*$") then
      out[#out + 1] = prefix .. sep .. name
    end
  end
  table.sort(out)
  return out
end

return M
