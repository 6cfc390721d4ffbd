--- The REPL as a diagnostic console: the helpers it defines as globals, how it prints
-- results (`print`, through corral.pretty) and what Tab offers (`complete`). The host
-- (core/host/main.c) calls `install` when a REPL starts.
--
--     corral> help()                      -- every helper, one line each; help "why"
--     corral> sandboxes()                 -- every live sandbox of this user (any process)
--     corral> why("tenant", "pypi.org:443")
--     corral> attach "tenant"             -- the helpers' default sandbox from here on
--
-- The helpers on live sandboxes are corral.operator's verbs (the public API, corral.init,
-- exports some of them too), reachable here under the same names.
-- @module corral.repl
local operator = require "corral.operator"
local pretty = require "corral.pretty"

local M = {}

-- The operator's verbs, as the helpers of the same names.
for _, name in ipairs({ "sandboxes", "info", "connections", "decisions", "ruleset", "local_ruleset", "why", "allow",
  "revoke", "namespaces", "step", "conformance" }) do
  M[name] = operator[name]
end

--- Makes a sandbox the helpers' default (nil: none), as `corral attach ID` does.
-- @param[opt] ref
function M.attach(ref)
  local attached, reg = operator.attach(ref)
  if ref == nil then
    rawset(_G, "_PROMPT", nil)
    return attached
  end
  if not attached then return nil, reg end
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
logged): verdict, reason, the entry, and for a name what its DNS query gets. "udp:host:port"
asks about a datagram flow, which only udp: entries grant.]] },
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
    local attached = operator.attached()
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
  local attached = operator.attached()
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
