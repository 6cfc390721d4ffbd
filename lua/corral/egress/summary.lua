--- What the egress plane denied, and which connections failed upstream, in words a
-- person reads: `corral run` prints it on stderr at the end of a run (and each line as
-- it first happens with --verbose), naming the command-line option that would change
-- the decision. Names are what the tenant asked for: a synthetic address is already
-- mapped back to its name by the acceptor.
-- @module corral.egress.summary
local events = require "corral.egress.events"
local ranges = require "corral.egress.ranges"

local M = {}

-- UDP destinations are written as their allowlist entries are: udp:api.test:443.
local function proto_prefix(ev)
  return ev.protocol == "udp" and "udp:" or ""
end

local function dest(ev)
  local host = ev.name or ev.ip or "?"
  if host:find(":", 1, true) then host = "[" .. host .. "]" end
  return proto_prefix(ev) .. (ev.port and (host .. ":" .. ev.port) or host)
end

local function entry_for(ev)
  local host = ev.name or ev.ip or "NAME"
  if host:find(":", 1, true) then host = "[" .. host .. "]" end
  return proto_prefix(ev) .. host .. (ev.port and (":" .. ev.port) or "")
end

--- One line for an event the summary reports, or nil for one it does not (allowed
-- connections, answered names, orderly ends).
-- @tparam table ev an egress event (`corral.egress.events`)
-- @treturn string|nil
function M.line(ev)
  local reason = tostring(ev.reason or "")
  if reason:find("^corral is out of file descriptors") then
    return ev.port and string.format("failed %s (%s)", dest(ev), reason) or reason
  end
  if ev.kind == "failed" then
    local why, tried = reason:match("^upstream: (.-) %((.*)%)$")
    why = (why or reason:gsub("^upstream: ", "")):lower()
    if why:find("refused", 1, true) then why = "upstream refused" end
    if why:find("timed out", 1, true) then why = "upstream did not answer" end
    return string.format("failed %s (%s%s)", dest(ev), why, tried and (" " .. tried) or "")
  end
  -- a UDP flow that heard only errors back from upstream
  if ev.kind == "udp_closed" and ev.bytes_down == 0 and reason:find("upstream: ", 1, true) then
    local why = reason:match("upstream: (.*)$"):lower()
    if why:find("refused", 1, true) then why = "upstream refused" end
    return string.format("failed %s (%s%s)", dest(ev), why, ev.upstream and (" " .. ev.upstream) or "")
  end
  if ev.verdict ~= "deny" or ev.kind == "suppressed" then return nil end
  local d = dest(ev)
  if ev.kind == "dns" then
    if reason:find("not in the allowlist", 1, true) then
      return string.format("denied %s (no entry names it; --allow %s:PORT would)", d, entry_for(ev))
    end
    return string.format("denied %s (DNS: %s)", d, reason)
  end
  if reason:find("allowed only on ports", 1, true) then
    return string.format("denied %s (port not allowed for %s; --allow %s would)", d, ev.name or ev.ip,
      entry_for(ev))
  end
  if reason:find("not in the allowlist", 1, true) then
    -- an address no entry can open (multicast, broadcast …): no option would change it
    local what, cidr, fixed = ranges.classify(not ev.name and ev.ip or "")
    if fixed then return string.format("denied %s (%s, %s: never a destination)", d, what, cidr) end
    return string.format("denied %s (no entry names it; --allow %s would)", d, entry_for(ev))
  end
  local other = reason:match("is allowed only for (%u+) %(")
  if other then
    return string.format("denied %s (%s is allowed for %s only; --allow %s would)", d, ev.name or ev.ip, other,
      entry_for(ev))
  end
  -- the policy's reasons name its fields; the summary names the flags that set them
  reason = reason:gsub("list it in network%.internal", "list it with --internal")
    :gsub("network%.internal listing", "--internal listing"):gsub('%(network%.sni = "require"%)', "(--sni require)")
  if reason:find("--internal", 1, true) or reason:find("refused range", 1, true) then
    return string.format("denied %s (%s; --internal CIDR admits a private range, ADDR/32 one address)", d, reason)
  end
  if ev.kind == "cut" then return string.format("cut %s (%s)", d, reason) end
  if reason:find("^connection cap reached") then
    return string.format("denied %s (%s; --max-connections sets the cap)", d, reason)
  end
  return string.format("denied %s (%s)", d, reason)
end

--- Starts collecting. With `opts.verbose`, each line is also written to `opts.out`
-- (default io.stderr) the first time it happens.
-- @tparam[opt] table opts `{verbose =, out =, sandbox = only this sandbox's events}`
-- @treturn table the collector, with `:lines()` (in first-seen order, each with its
--   count) and `:finish()` (unsubscribes, writes the summary, returns its lines)
function M.start(opts)
  opts = opts or {}
  local out = opts.out or io.stderr
  local self = { order = {}, count = {}, hosts = {}, requests = {} }
  function self.on(ev)
    if opts.sandbox and ev.sandbox ~= opts.sandbox then return end
    if ev.kind == "request" and ev.verdict == "allow" then self.request(ev) end
    local ok, line = pcall(M.line, ev)
    if not ok or not line then return end
    if not self.count[line] then
      self.order[#self.order + 1] = line
      self.count[line] = 0
      if opts.verbose then out:write("corral run: ", line, "\n") end
    end
    self.count[line] = self.count[line] + 1
  end
  -- requests on terminated TLS (--secret), counted by host
  function self.request(ev)
    local r = self.requests[ev.name]
    if not r then
      r = { n = 0, used = 0 }
      self.requests[ev.name] = r
      self.hosts[#self.hosts + 1] = ev.name
    end
    r.n, r.used = r.n + 1, r.used + (ev.secret_used and 1 or 0)
  end
  function self.lines()
    local t = {}
    for i, l in ipairs(self.order) do
      local n = self.count[l]
      t[i] = n > 1 and (l .. " x" .. n) or l
    end
    return t
  end
  function self.finish()
    events.unsubscribe(self.on)
    local t = self.lines()
    if #t > 0 then
      out:write("corral run: egress: ", #t == 1 and "1 decision" or (#t .. " decisions"),
        " the tenant may not have expected:\n")
      for _, l in ipairs(t) do out:write("  ", l, "\n") end
    end
    for _, host in ipairs(self.hosts) do
      local r = self.requests[host]
      out:write(string.format("corral run: terminated TLS: %s: %d request%s, %d with a secret put in\n", host, r.n,
        r.n == 1 and "" or "s", r.used))
    end
    return t
  end
  events.subscribe(self.on)
  return self
end

return M
