--- Special address ranges: where a connection the host makes for a tenant must not land.
--
-- A tenant allowed `api.example.com` has no say in what that name resolves to on the
-- host; whoever controls its DNS does. If it resolved to 127.0.0.1, 10.x or the cloud
-- metadata address, the host would connect the tenant to a service on the host or its
-- private network (DNS rebinding). An IP entry is no different: `0.0.0.0/0` in an
-- allowlist means "the Internet", never "the metadata service". `check` refuses such
-- destinations unless the operator unlocks them.
--
-- Rules:
--
-- * The most specific special range containing the address decides. It is unlocked by
--   an entry that contains the address *and* is at least as specific as that range,
--   either in `network.internal` or (for an IP destination) the allowlist entry that
--   matched: `10.1.0.0/16` unlocks 10.1.2.3 (in 10/8), but `0.0.0.0/0`, `0.0.0.0/1` or
--   `::/0` unlock nothing, and `169.254.0.0/16` does not unlock the metadata address
--   169.254.169.254, which must be written on its own (`169.254.169.254/32`).
-- * An address of this host (any address, or local route, of the host's network
--   namespace: see `corral.egress.hostaddr`) reaches whatever listens on the host's
--   wildcard address, like loopback. It is refused unless `network.internal` lists it
--   at least as specifically as the host holds it: the address itself for an interface
--   address (10.0.0.5/32), or the whole local route (127.0.0.0/8) or part of it. An
--   allowlist entry never unlocks it, and neither does a broader internal range
--   (`10.0.0.0/8` does not unlock the host's own 10.0.0.5).
-- * Some ranges are never a destination, whatever is written (`fixed`): 0.0.0.0/8 and
--   `::` (a connect to them reaches the local host), multicast, broadcast, reserved
--   240/4, IPv4-compatible `::/96` (deprecated: no stack should deliver to it, so it is
--   refused whatever IPv4 it carries), discard-only 100::/64, and corral's own synthetic
--   ranges (198.18.0.0/15, 64:ff9b:1::/48: see `corral.egress.synthetic`).
-- * An address that carries an IPv4 address a translator, relay or tunnel would deliver
--   to is judged by that IPv4 address, as if the tenant had connected to it (only
--   `network.internal` unlocks an embedded special IPv4, never an allowlist entry):
--   IPv4-mapped `::ffff:0:0/96` (folded to IPv4 before anything else), IPv4-translated
--   `::ffff:0:0:0/96` (SIIT), NAT64 `64:ff9b::/96`, 6to4 `2002::/16` (bits 16-47) and
--   Teredo `2001::/32` (its server, bits 32-63, and its client, the last 32 bits
--   inverted: both must pass). ISATAP interface identifiers, which can follow any
--   prefix, are not unpacked.
-- * Documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32)
--   are *not* special: they are routed nowhere, so there is no service behind them to
--   protect, and the tests use them as stand-ins for public addresses. (A host that
--   holds one of them on an interface still has it refused as its own address.)
-- @module corral.egress.ranges
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"
local synthetic = require "corral.egress.synthetic"

local inet = core.inet

local M = {}

--- The argument name of internal-list errors.
M.ARGUMENT = "network.internal"

local function embedded_last32(b) return { b:sub(13, 16) } end
local function embedded_6to4(b) return { b:sub(3, 6) } end
local function embedded_teredo(b)
  local client = b:sub(13, 16):gsub(".", function(c) return string.char(c:byte() ~ 0xff) end)
  return { b:sub(5, 8), client }
end

--- The special ranges: `{cidr, what, fixed = boolean?, embeds = function?}`.
M.SPECIAL = {
  { "0.0.0.0/8", "\"this network\" (a connect reaches the local host)", fixed = true },
  { "10.0.0.0/8", "private (RFC 1918)" },
  { "100.64.0.0/10", "shared address space (carrier-grade NAT, RFC 6598)" },
  { "100.100.100.200/32", "a cloud metadata service (Alibaba)" },
  { "127.0.0.0/8", "loopback" },
  { "169.254.0.0/16", "link-local" },
  { "169.254.169.254/32", "the cloud metadata service (AWS, GCP, Azure, OCI)" },
  { "172.16.0.0/12", "private (RFC 1918)" },
  { "192.0.0.0/24", "IETF protocol assignments (RFC 6890)" },
  { "192.88.99.0/24", "6to4 relay anycast (deprecated, RFC 7526)" },
  { "192.168.0.0/16", "private (RFC 1918)" },
  { synthetic.V4_CIDR, "corral's synthetic range (benchmarking, RFC 2544)", fixed = true },
  { "224.0.0.0/4", "multicast", fixed = true },
  { "240.0.0.0/4", "reserved (RFC 1112)", fixed = true },
  { "255.255.255.255/32", "broadcast", fixed = true },
  { "::/128", "the unspecified address (a connect reaches the local host)", fixed = true },
  { "::1/128", "loopback" },
  { "::/96", "IPv4-compatible (deprecated, RFC 4291)", fixed = true },
  { "::ffff:0:0:0/96", "IPv4-translated (SIIT, RFC 2765)", embeds = embedded_last32 },
  { "64:ff9b::/96", "NAT64 (RFC 6052)", embeds = embedded_last32 },
  { synthetic.V6_CIDR, "corral's synthetic range (local-use translation, RFC 8215)", fixed = true },
  { "100::/64", "discard-only (RFC 6666)", fixed = true },
  { "2001::/32", "Teredo (RFC 4380)", embeds = embedded_teredo },
  { "2002::/16", "6to4 (RFC 3056)", embeds = embedded_6to4 },
  { "fc00::/7", "unique local (RFC 4193)" },
  { "fd00:ec2::254/128", "the cloud metadata service (AWS)" },
  { "fe80::/10", "link-local" },
  { "fec0::/10", "site-local (deprecated, RFC 3879)" },
  { "ff00::/8", "multicast", fixed = true },
}

for _, r in ipairs(M.SPECIAL) do
  r.bytes, r.prefix = assert(address.parse_cidr(r[1]))
end

local function most_specific(bytes)
  local best
  for _, r in ipairs(M.SPECIAL) do
    if #r.bytes == #bytes and inet.in_cidr(bytes, r.bytes, r.prefix) and (not best or r.prefix > best.prefix) then
      best = r
    end
  end
  return best
end

--- Describes an address's special range, if any.
-- @tparam string ip address text
-- @treturn[1] string what the range is
-- @treturn[1] string the range (CIDR)
-- @treturn[1] boolean whether `network.internal` can never unlock it
-- @treturn[2] nil an ordinary address (or not an address)
function M.classify(ip)
  local b = address.parse_address(ip)
  local r = b and most_specific(b)
  if not r then return nil end
  return r[2], r[1], r.fixed == true
end

local Internal = {}

--- Parses a `network.internal` list: CIDRs or single addresses (`10.1.0.0/16`,
-- `169.254.169.254`, `fd00::/8`, `[fd00::]/8`). Idempotent on its own result.
-- @tparam[opt] {string,...} list
-- @treturn[1] table the parsed list
-- @return[2] nil
-- @treturn[2] table `invalid_argument` on `network.internal` naming the entry
function M.parse_internal(list)
  if getmetatable(list) == Internal then return list end
  local out = setmetatable({}, Internal)
  if list == nil then return out end
  if type(list) ~= "table" then
    return nil, errors.invalid_argument(M.ARGUMENT, "must be a list of CIDRs, got " .. type(list))
  end
  for i = 1, #list do
    local b, p = address.parse_cidr(list[i])
    if not b then
      return nil, errors.invalid_argument(M.ARGUMENT, string.format('"%s": %s', tostring(list[i]), p))
    end
    out[i] = { bytes = b, prefix = p, text = list[i] }
  end
  return out
end

-- The broadest entry of a list of `{bytes =, prefix =}` that contains the address: the
-- host holds 127.0.0.1 both as an address and inside its local route 127.0.0.0/8, and
-- listing the route unlocks what it holds.
local function containing(list, bytes)
  local best
  for _, n in ipairs(list or {}) do
    if #n.bytes == #bytes and inet.in_cidr(bytes, n.bytes, n.prefix) and (not best or n.prefix < best.prefix) then
      best = n
    end
  end
  return best
end

-- An internal entry that contains the address and is at least as specific as `prefix`;
-- else nil and the text of a broader one that contains it, if any.
local function unlocking(list, bytes, prefix)
  local broader
  for _, n in ipairs(list or {}) do
    if #n.bytes == #bytes and inet.in_cidr(bytes, n.bytes, n.prefix) then
      if n.prefix >= prefix then return n end
      broader = broader or n.text
    end
  end
  return nil, broader
end

local function cidr_text(bytes, prefix)
  return inet.format(bytes) .. "/" .. prefix
end

-- opts: {entries = allowlist entries that matched (IP destinations only), host = the
-- host's local networks}. depth 1: an embedded IPv4 address (entries never unlock it).
local function check(bytes, internal, opts, depth)
  local text = inet.format(bytes)
  local own = containing(opts.host, bytes)
  if own and not unlocking(internal, bytes, own.prefix) then
    local what = own.prefix == #bytes * 8 and "an address of this host"
      or string.format("in a local range of this host (%s)", cidr_text(own.bytes, own.prefix))
    return nil, string.format("%s is %s: like loopback, it reaches the host's own services; only "
      .. "network.internal listing %s allows it", text, what,
      own.prefix == #bytes * 8 and text or cidr_text(own.bytes, own.prefix))
  end
  local r = most_specific(bytes)
  if not r then return true end
  if r.embeds and depth == 0 then
    for _, v4 in ipairs(r.embeds(bytes)) do
      local ok, why = check(v4, internal, { host = opts.host }, 1)
      if not ok then
        return nil, string.format("%s is %s, delivered to an embedded IPv4 address: %s", text, r[2], why)
      end
    end
    return true
  end
  if r.fixed then
    return nil, string.format("%s is %s (%s): never a destination", text, r[2], r[1])
  end
  local n, broader = unlocking(internal, bytes, r.prefix)
  if n then return true end
  local wide
  for _, e in ipairs(depth == 0 and opts.entries or {}) do
    if #e.bytes == #bytes and e.prefix >= r.prefix and inet.in_cidr(e.bytes, r.bytes, r.prefix) then
      return true, nil, e
    end
    wide = wide or e.text
  end
  local hint = ""
  if broader then
    hint = string.format("; the internal entry %s is broader than %s and does not unlock it", broader, r[1])
  elseif wide then
    hint = string.format("; the allow entry %s is broader than %s and does not reach into it "
      .. "(allow a network inside it, or list it in network.internal)", wide, r[1])
  end
  return nil, string.format("%s is %s (%s); list it in network.internal to allow it%s", text, r[2], r[1], hint)
end

--- Checks a destination the host would connect to for a tenant: an address an allowed
-- name resolved to on the host, or an IP the tenant connected to that an IP entry allows.
-- @tparam string ip address text (IPv4-mapped addresses are checked as IPv4)
-- @tparam[opt] {string,...} internal the `network.internal` list (or its `parse_internal`)
-- @tparam[opt] table opts `{entries = {entry,...}, host = {{bytes =, prefix =},...}}`:
--   `entries`, the allowlist entries (from `corral.egress.allowlist`) that matched an IP
--   destination, any of which may unlock a special range it lies entirely inside;
--   `host`, the host's own local networks (`corral.egress.hostaddr.get()`), refused
--   unless `internal` lists them
-- @treturn[1] boolean true: the address may be connected to
-- @treturn[1] nil
-- @treturn[1] table|nil the entry of `opts.entries` that unlocked a special range
-- @return[2] nil
-- @treturn[2] string why not (the address, its range, and how to allow it if one can)
function M.check(ip, internal, opts)
  local bytes, why = address.parse_address(ip)
  if not bytes then return nil, why end
  local nets, err = M.parse_internal(internal)
  if not nets then return nil, tostring(err) end
  local ok, reason, entry = check(bytes, nets, opts or {}, 0)
  if ok then return true, nil, entry end
  if #bytes == 4 and inet.parse(ip) == "inet6" then
    reason = string.format("::ffff:%s is IPv4-mapped: %s", inet.format(bytes), reason)
  end
  return nil, reason
end

return M
