--- What a run answers on its control socket (corral.control serves it): the request
-- handlers of one sandbox, from its cgroup, its processes and its egress plane.
-- @module corral.control_ops
local core = require "corral.core"
local file = require "corral.file"

local M = {}

local function read_number(path)
  local s = file.read(path)
  return s and tonumber(s:match("^%s*(%d+)"))
end

local function read_key(path, key)
  local s = file.read(path)
  return s and tonumber(s:match("%f[%w]" .. key .. " (%d+)"))
end

--- What a sandbox's cgroup directories report now: memory, pids and CPU use (nil where
-- a controller is absent).
-- @tparam {string,...} dirs the sandbox's cgroup directories
-- @treturn table `{memory_current =, memory_peak =, pids =, cpu_usec =}`
function M.cgroup_usage(dirs)
  local u = {}
  for _, d in ipairs(dirs or {}) do
    u.memory_current = u.memory_current or read_number(d .. "/memory.current")
      or read_number(d .. "/memory.usage_in_bytes")
    u.memory_peak = u.memory_peak or read_number(d .. "/memory.peak")
      or read_number(d .. "/memory.max_usage_in_bytes")
    u.pids = u.pids or read_number(d .. "/pids.current")
    u.cpu_usec = u.cpu_usec or read_key(d .. "/cpu.stat", "usage_usec")
  end
  return u
end

-- The processes this one started: a run's sandbox init (or bubblewrap).
local function children()
  local out = {}
  for _, tid in ipairs(core.fs.listdir("/proc/self/task") or {}) do
    local f = io.open("/proc/self/task/" .. tid .. "/children")
    if f then
      for pid in f:read("a"):gmatch("%d+") do out[#out + 1] = tonumber(pid) end
      f:close()
    end
  end
  table.sort(out)
  return out
end

local function plane_of(id)
  for _, p in ipairs(require("corral.egress.loop").planes()) do
    if p.id == id and p.netns then return p end
  end
end

--- Splits "host:port", "[v6]:port" or "1.2.3.4:port" into a decision's subject; a
-- `udp:` (or `tcp:`) prefix, as an allowlist entry has, asks about that protocol.
-- @tparam string dest
-- @treturn[1] table `{name =}` or `{ip =}`, with `port` and `protocol`
-- @return[2] nil
-- @treturn[2] string why not
function M.parse_dest(dest)
  if type(dest) ~= "string" then return nil, "destination must be a string \"host:port\"" end
  -- only a prefix followed by a whole destination: "udp:53" is the host udp's port 53
  local proto, rest = dest:match("^(%a+):(.+:%d+)$")
  local prefix = ""
  if proto == "udp" or proto == "tcp" then
    dest, prefix = rest, proto .. ":"
  else
    proto = "tcp"
  end
  local q, err = M.parse_tcp_dest(dest)
  if not q then return nil, prefix .. err end -- its text begins with the destination
  q.protocol = proto
  return q
end

--- parse_dest without a protocol prefix.
-- @tparam string dest
-- @treturn[1] table `{name =}` or `{ip =}`, with `port`
-- @return[2] nil
-- @treturn[2] string why not
function M.parse_tcp_dest(dest)
  local host, port = dest:match("^%[(.+)%]:(%d+)$")
  if not host then host, port = dest:match("^([^:]+):(%d+)$") end
  port = math.tointeger(tonumber(port))
  if not host or not port then return nil, dest .. ": give host:port, [v6]:port or a.b.c.d:port" end
  if port < 1 or port > 65535 then return nil, dest .. ": port " .. port .. " is not one of 1 to 65535" end
  -- the user's text: never read as packed bytes ("host" is not 104.111.115.116)
  if require("corral.egress.address").parse_address(host) then return { ip = host, port = port } end
  return { name = host, port = port }
end

--- Counts the connection decisions of sandbox `id` from now on (its `connect`, `inbound`
-- and `udp` events: one each, or the `count` of SYNs or datagrams the ruleset refused).
-- @tparam string id
-- @treturn table `{allowed =, denied =}`, kept up to date
-- @treturn function its subscriber (the token for corral.egress.events.unsubscribe)
function M.connection_counts(id)
  local counts = { allowed = 0, denied = 0 }
  local kinds = { connect = true, inbound = true, udp = true }
  return counts, require("corral.egress.events").subscribe(function(ev)
    if ev.sandbox ~= id or not kinds[ev.kind] then return end
    local key = ev.verdict == "allow" and "allowed" or "denied"
    counts[key] = counts[key] + (math.tointeger(ev.count) or 1)
  end)
end

-- ops table → what `release` undoes once its server closes (weak: ops never served go)
local taken = setmetatable({}, { __mode = "k" })

--- Releases what `for_run` took for its ops (its event subscriber); corral.control's
-- server calls it on close.
-- @tparam table ops
function M.release(ops)
  local sub = taken[ops]
  taken[ops] = nil
  if sub then require("corral.egress.events").unsubscribe(sub) end
end

--- The request handlers of one run: what corral.control.serve answers for sandbox sb under mech.
-- @tparam table mech the mechanism
-- @tparam table sb the sandbox
-- @tparam[opt] table run `{argv =}` what was asked
-- @treturn table ops for corral.control.serve
function M.for_run(mech, sb, run)
  local function egress() return require "corral.egress" end
  local started = os.time()
  -- counted only where there is a plane: one is made before its run registers, never
  -- after, and without one there is no connection to count (nor its event module to load)
  local counts, counting = { allowed = 0, denied = 0 }, nil
  if plane_of(sb.id) then counts, counting = M.connection_counts(sb.id) end
  local ops = {}
  taken[ops] = counting
  local function label() return mech.name or require("corral.mechanism").label(mech) end
  function ops.info()
    local p = plane_of(sb.id)
    local policy = egress().policy(sb.id)
    local cg = mech.cgroup_paths and mech.cgroup_paths(sb) or {}
    local tenant = children()
    -- without a cgroup to read, what /proc shows of the tenant's processes
    local usage = #cg > 0 and M.cgroup_usage(cg) or require("corral.proctree").usage(tenant)
    return {
      id = sb.id, pid = core.proc.getpid(), mechanism = label(),
      tenant_pids = tenant, started = started, command = run and run.argv, limits = sb.limits, usage = usage,
      cgroups = cg,
      storage = sb.storage_root and sb.storage_root .. "/" .. sb.id,
      egress = p and {
        allow = policy and policy.allowlist and policy.allowlist:texts() or {},
        decide = policy and policy.decide ~= nil, connections = require("corral.egress.loop").count(sb.id),
        allowed = counts.allowed, denied = counts.denied,
        dns_port = p.dns_port, acceptor_port = p.acceptor_port, service = p.service_addr,
      } or nil,
    }
  end
  -- What `corral ls` shows, at the cost of a few reads: info's usage without its CPU
  -- time, its egress counts without the plane's ports. Answered, then the connection is
  -- closed: one turn of this process's loop for each of 100 sandboxes listed at once.
  function ops.status(_, conn)
    local p = plane_of(sb.id)
    local cg = mech.cgroup_paths and mech.cgroup_paths(sb) or {}
    local usage = #cg > 0 and M.cgroup_usage(cg) or require("corral.proctree").footprint(children())
    local policy = p and egress().policy(sb.id)
    if conn then conn.last() end
    return {
      id = sb.id, pid = core.proc.getpid(), mechanism = label(), started = started,
      processes = usage.pids, memory = usage.memory_current or usage.memory_rss,
      egress = p and {
        allow = policy and policy.allowlist and #policy.allowlist:texts() or 0,
        connections = require("corral.egress.loop").count(sb.id), allowed = counts.allowed, denied = counts.denied,
      } or nil,
    }
  end
  function ops.connections()
    return require("corral.egress.relays").connections(sb.id)
  end
  function ops.decisions(req)
    local n = math.tointeger(req.n) or 20
    local mine = {}
    for _, ev in ipairs(egress().events.recent()) do
      if ev.sandbox == sb.id then mine[#mine + 1] = ev end
    end
    return table.move(mine, math.max(1, #mine - n + 1), #mine, 1, {})
  end
  function ops.ruleset()
    local p = plane_of(sb.id)
    if not p then return nil, sb.id .. " has no egress plane (no --allow, no service port): no ruleset" end
    return core.nft.dump(p.netns)
  end
  function ops.why(req)
    local q, err = M.parse_dest(req.dest)
    if not q then return nil, err end
    q.sandbox = sb.id
    local v = egress().registry:decide(q)
    local out = { verdict = v.verdict, reason = v.reason, by = v.by, entry = v.entry }
    if q.name then
      local ok, why = egress().resolvable(sb.id, q.name)
      out.dns = ok and "answered (a synthetic address)" or ("NXDOMAIN: " .. tostring(why))
    end
    return out
  end
  local function need_plane()
    if not plane_of(sb.id) then
      return nil, sb.id .. " has no egress plane (started without --allow): it has no network"
    end
    return true
  end
  function ops.allow(req)
    local ok, err = need_plane()
    if not ok then return nil, err end
    local e, aerr = egress().allow(sb.id, req.entry)
    -- the detail alone: the caller names its own argument (--allow, allow()), not the Lua field
    if not e then return nil, type(aerr) == "table" and aerr.detail or aerr end
    return { allowed = e.text, allow = egress().policy(sb.id).allowlist:texts() }
  end
  function ops.revoke(req)
    local ok, err = need_plane()
    if not ok then return nil, err end
    local n, cut = egress().revoke(sb.id, req.entry, { cut = req.cut == true })
    if not n then return nil, cut end
    local policy = egress().policy(sb.id)
    local held = policy and policy.allowlist and policy.allowlist:texts() or {}
    if n == 0 then
      -- said, not a silent success: the caller may have mistyped the entry it meant
      return nil, string.format("%s is not in %s's allowlist, which holds: %s", tostring(req.entry), sb.id,
        #held > 0 and table.concat(held, ", ") or "nothing")
    end
    return { removed = n, cut = cut or 0, allow = held }
  end
  return ops
end

return M
