--- `corral run`'s network flags, read into the `network` table: the destinations
-- (--allow, --allow-file, --internal, --resolve, --link: `network`), --idle (how long a
-- connection may move no byte; none by default), --max-connections (per sandbox),
-- --sni (match, require or off: see `corral.egress.sni_hold`), --learn (see
-- `corral.egress.learn`), --udp-idle and --max-udp-flows (see `corral.egress.udp`);
-- and the combinations of `corral run`'s network flags that cannot mean what they say,
-- each refused naming the flags (`combination`).
-- @module corral.egress.run_options
local core = require "corral.core"
local errors = require "corral.errors"
-- The egress grammar, loaded only when a flag needs it: a run without network flags
-- (most) never reads an entry, and loading these modules was ~0.3 ms of its start.
local function address() return require "corral.egress.address" end
local function grammar() return require "corral.egress.grammar" end
local function request_rules() return require "corral.egress.request_rules" end
-- a count in plain decimal ("64"; tonumber would take "0x40" and " 64")
local parse_integer = require("corral.sandbox").parse_integer

local M = {}

--- The `network` table from run's egress options, or nil when none was given.
-- @tparam table opts parsed options
-- @treturn table|nil network, or nil and an error naming the option
function M.network(opts)
  if #(opts.allow or {}) == 0 and not opts["allow-file"] and #(opts.internal or {}) == 0 and
     #(opts.resolve or {}) == 0 and not opts.link and not opts["service-port"] and not opts.learn then
    return nil
  end
  -- every value is checked here, so a refusal names its option and nothing starts
  local function invalid(option, fmt, ...)
    return nil, errors.invalid_argument(option, string.format(fmt, ...))
  end
  -- a path entry (request_rules) admits its destination and adds a rule; the grammar's
  -- own refusals (single-label names, loopback, other URL paths …), by option
  local rules = {}
  local function check_entry(e)
    local dest, rule, rwhy = request_rules().split(e)
    if rwhy then return nil, rwhy end
    rules[#rules + 1] = rule
    local _, aerr = grammar().parse_entry(dest or e)
    if aerr then return nil, aerr.detail end
    return dest or e
  end
  local allow = {}
  for _, e in ipairs(opts.allow or {}) do
    local entry, why = check_entry(e)
    if why then return invalid("--allow", "%s", why) end
    allow[#allow + 1] = entry
  end
  if opts["allow-file"] then
    local file = opts["allow-file"]
    -- read whole, so that a directory (which io.open opens) is an error, not a raise from lines()
    local text, ferr, ferrno = core.fs.read(file)
    if not text then return nil, errors.invalid_argument("--allow-file", ferr, ferrno) end
    local n = 0
    for line in (text:sub(-1) == "\n" and text or text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      line = line:gsub("#.*", ""):match("^%s*(.-)%s*$")
      if line ~= "" then
        local entry, why = check_entry(line)
        if why then return invalid("--allow-file", "%s:%d: %s", file, n, why) end
        allow[#allow + 1] = entry
      end
    end
  end
  for _, c in ipairs(opts.internal or {}) do
    local ok, why = address().parse_cidr(c)
    if not ok then return invalid("--internal", '"%s": %s (write a CIDR, e.g. 10.20.0.0/16)', c, why) end
  end
  local resolve
  for _, r in ipairs(opts.resolve or {}) do
    local name, addr = r:match("^([^=]*)=(.*)$")
    if not name or name == "" or addr == "" then
      return invalid("--resolve", '"%s": expected NAME=ADDR (e.g. pypi.org=192.0.2.10)', r)
    end
    local n, why = address().normalize_name(name)
    if not n then return invalid("--resolve", '"%s": %s is not a hostname: %s', r, name, why) end
    local text = addr:match("^%[(.*)%]$") or addr
    if not core.inet.parse(text) then
      return invalid("--resolve", '"%s": %s is not an IP address (NAME=ADDR, e.g. pypi.org=192.0.2.10)', r, addr)
    end
    resolve = resolve or {}
    resolve[n] = resolve[n] or {}
    table.insert(resolve[n], text)
  end
  local link
  if opts.link then
    local ns, addr, gw, peer = opts.link:match("^([^,]+),([^,]+),([^,]+),?([^,]*)$")
    if not ns then
      return nil, errors.invalid_argument("--link", opts.link .. ": expected NETNS,ADDR/PREFIX,GATEWAY[,PEER/PREFIX]")
    end
    link = { peer_netns = ns:find("/", 1, true) and ns or ("/run/netns/" .. ns), address = addr, gateway = gw,
             peer_address = peer ~= "" and peer or nil }
  end
  local proxy
  if opts["upstream-proxy"] then
    local why
    proxy, why = require("corral.egress.upstream_proxy").parse(opts["upstream-proxy"])
    if not proxy then return invalid("--upstream-proxy", "%s", why) end
    for _, e in ipairs(allow) do
      if e:match("^[uU][dD][pP]:") then
        return invalid("--upstream-proxy", "carries TCP only: %s (a udp: entry) cannot go through it", e)
      end
    end
  end
  local methods
  if opts.method then
    local why
    methods, why = request_rules().methods(opts.method)
    if not methods then return invalid("--method", "%s", why) end
  end
  if #allow == 0 and #(opts.internal or {}) == 0 and not resolve and not link then return nil end
  local requests = (#rules > 0 or methods) and { rules = rules, methods = methods } or nil
  return { allow = allow, internal = opts.internal, resolve = resolve, link = link, requests = requests,
    upstream_proxy = proxy }
end

--- Adds --secret, --secret-file and --ca-file to `network` (see `corral.egress.secrets`):
-- the secrets' names, hosts and stand-ins, their values kept by that module; and checks
-- that the request rules (--allow https://HOST/PATH, --method) fall on hosts they bind.
-- Read before corral's own environment is cleared.
-- @tparam table|nil network the table from `network` and `apply`
-- @tparam table opts parsed options
-- @treturn[1] table|nil network
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the flag
function M.secrets(network, opts)
  local given_secret = #(opts.secret or {}) > 0 or #(opts["secret-file"] or {}) > 0
  local function secrets() return require "corral.egress.secrets" end
  if not given_secret then
    if opts["ca-file"] then
      return nil, errors.invalid_argument("--ca-file", "applies to the hosts a --secret is bound to: give --secret too")
    end
    if opts.method and not (network and network.requests) then
      return nil, errors.invalid_argument("--method", "applies to requests on the hosts a --secret is bound to: "
        .. "give --secret too")
    end
    if network and network.requests then
      local flag, why = request_rules().check(network.requests, nil, secrets().bound)
      if flag then return nil, errors.invalid_argument(flag, why) end
    end
    return network
  end
  local flag = #(opts.secret or {}) > 0 and "--secret" or "--secret-file"
  if not network or #(network.allow or {}) == 0 or network.learn then
    return nil, errors.invalid_argument(flag, "binds a secret to hosts the sandbox connects to: give --allow for "
      .. "them too (and not --learn)")
  end
  local list, err = secrets().parse(opts, core.proc.environ())
  if not list then return nil, err end
  if network.requests then
    local rflag, why = request_rules().check(network.requests, list, secrets().bound)
    if rflag then return nil, errors.invalid_argument(rflag, why) end
  end
  local ca = opts["ca-file"]
  if ca then
    local st = core.fs.lstat(ca)
    if not st or st.type ~= "file" then
      return nil, errors.invalid_argument("--ca-file", ca .. ": not a regular file")
    end
  end
  network.secrets, network.ca_file = list, ca
  return network
end

--- Whether the namespace a --link names is there: asked of the host after `combination`,
-- so that a --link refused for what it is given with is refused for that first.
-- @tparam table|nil network the table from `network`
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table invalid_argument naming --link
function M.link_namespace(network)
  local link = network and network.link
  if link and not core.fs.lstat(link.peer_netns) then
    return nil, errors.invalid_argument("--link", link.peer_netns .. ": no such network namespace")
  end
  return true
end

local UNIT = { [""] = 1, s = 1, m = 60, h = 3600, d = 86400 }

--- Seconds from "90", "90s", "10m", "2h", "1d"; "0" and "none" are no limit (0).
-- @tparam string text
-- @treturn[1] number seconds
-- @return[2] nil
-- @treturn[2] string why
function M.duration(text)
  if text == "none" then return 0 end
  local n, unit = tostring(text):match("^(%d+%.?%d*)(%a?)$")
  local k = n and UNIT[unit]
  if not k then
    return nil, string.format('"%s": expected seconds, or a number with s, m, h or d (e.g. 2h), or none', text)
  end
  local v = tonumber(n) * k
  if v > 86400 * 365 then return nil, string.format('"%s": at most a year', text) end
  return v
end

local function given(v)
  if type(v) == "table" then return #v > 0 end
  return v ~= nil and v ~= false
end

-- What the allowlist holds: TCP entries, TCP entries naming a host, UDP entries.
local function holds(allow)
  local k = { tcp = false, tcp_name = false, udp = false }
  for _, text in ipairs(allow or {}) do
    local e = grammar().parse_entry(text)
    if e and e.proto == "udp" then
      k.udp = true
    elseif e then
      k.tcp = true
      k.tcp_name = k.tcp_name or e.kind == "name" or e.kind == "wildcard"
    end
  end
  return k
end

local NO_NETWORK = "applies to allowed destinations: give --allow too (without it the sandbox has no network)"

--- Refuses the network flags given together that cannot mean what they say: a flag
-- accepted and then ignored is a run the operator did not ask for. --learn takes the
-- other flags (--internal, --resolve, --sni …) so that the same command line runs again
-- with --allow-file FILE, but not --allow: what that lets through is relayed and never
-- recorded, so FILE would not be the list the command needs.
-- @tparam table|nil network the table from `network`
-- @tparam table opts parsed options
-- @treturn[1] true
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the flag, its detail the other
function M.combination(network, opts)
  local function refuse(flag, why) return nil, errors.invalid_argument(flag, why) end
  local allowed = network ~= nil and #(network.allow or {}) > 0
  local from = given(opts.allow) and "--allow" or "--allow-file"
  if opts.learn and allowed then
    return refuse("--learn", "with " .. from .. ": what " .. from .. " lets through is relayed and never "
      .. "recorded, so FILE would not be the list the command needs; run --learn without it, then "
      .. "--allow-file FILE")
  end
  for _, f in ipairs({ "upstream-proxy", "method" }) do
    if opts.learn and given(opts[f]) then
      return refuse("--" .. f, "with --learn, which relays nothing: run --learn without it")
    end
  end
  if not allowed and not opts.learn then
    for _, f in ipairs({ "internal", "resolve", "link", "idle", "max-connections", "sni", "udp-idle",
                         "max-udp-flows", "upstream-proxy", "method" }) do
      if given(opts[f]) then return refuse("--" .. f, NO_NETWORK) end
    end
    if not given(opts["service-port"]) and given(opts["log-json"]) then
      return refuse("--log-json", "records egress decisions, and the sandbox has none: give --allow, --learn "
        .. "or --service-port too")
    end
    if given(opts.verbose) then
      return refuse("--verbose", "prints egress denials as they happen, and the sandbox has no egress: give "
        .. "--allow or --learn too")
    end
    return true
  end
  if opts.learn then return true end
  local k = holds(network.allow)
  for _, f in ipairs({ "idle", "max-connections", "sni" }) do
    if given(opts[f]) and not k.tcp then
      return refuse("--" .. f, "applies to TCP connections, and every " .. from .. " entry is udp: (give a "
        .. "TCP entry, or drop --" .. f .. ")")
    end
  end
  if given(opts.sni) and not k.tcp_name then
    return refuse("--sni", "checks the host a connection to an allowed name announces, and no " .. from
      .. " entry names a host (a connection to an address has no name to check)")
  end
  for _, f in ipairs({ "udp-idle", "max-udp-flows" }) do
    if given(opts[f]) and not k.udp then
      return refuse("--" .. f, "applies to UDP flows, and no " .. from .. " entry is udp: (e.g. --allow "
        .. "udp:ntp.example.com:123)")
    end
  end
  return true
end

--- Adds --idle and --max-connections to `network` (the table from the egress options).
-- @tparam table|nil network
-- @tparam table opts parsed options
-- @treturn[1] table|nil network
-- @return[2] nil
-- @treturn[2] table invalid_argument naming the option
function M.apply(network, opts)
  local idle, max, sni = opts.idle, opts["max-connections"], opts.sni
  local udp_idle, max_udp = opts["udp-idle"], opts["max-udp-flows"]
  if opts.learn then
    -- learn mode needs a plane even with nothing allowed
    network = network or { allow = {} }
    network.learn = true
  end
  if idle == nil and max == nil and sni == nil and udp_idle == nil and max_udp == nil then return network end
  if not network then
    return nil, errors.invalid_argument(idle and "--idle" or max and "--max-connections" or sni and "--sni"
      or udp_idle and "--udp-idle" or "--max-udp-flows",
      "applies to egress connections: give --allow too (without it the sandbox has no network)")
  end
  if udp_idle ~= nil then
    local v, why = M.duration(udp_idle)
    if v == 0 then why = '"' .. udp_idle .. '": a UDP flow has no end of its own; give a duration (e.g. 2m)' end
    if not v or v == 0 then return nil, errors.invalid_argument("--udp-idle", why) end
    network.udp_idle = v
  end
  if max_udp ~= nil then
    local v = parse_integer(max_udp)
    if not v or v < 1 then
      return nil, errors.invalid_argument("--max-udp-flows", '"' .. max_udp .. '": a positive integer, in decimal')
    end
    network.max_udp_flows = v
  end
  if sni ~= nil then
    if sni ~= "match" and sni ~= "require" and sni ~= "off" then
      return nil, errors.invalid_argument("--sni", '"' .. sni .. '": match (a TLS SNI or HTTP Host must be the '
        .. "name connected to), require (and must be there) or off")
    end
    network.sni = sni
  end
  if idle ~= nil then
    local v, why = M.duration(idle)
    if not v then return nil, errors.invalid_argument("--idle", why) end
    network.idle = v
  end
  if max ~= nil then
    local v = parse_integer(max)
    if not v or v < 1 then
      return nil, errors.invalid_argument("--max-connections", '"' .. max .. '": a positive integer, in decimal')
    end
    network.max_connections = v
  end
  return network
end

return M
