--- Special address ranges: where a host-side resolution of an allowed name must not land.
--
-- A tenant allowed `api.example.com` has no say in what that name resolves to on the
-- host; whoever controls its DNS does. If it resolved to 127.0.0.1, 10.x or the cloud
-- metadata address, the host would connect the tenant to a service on the host or its
-- private network (DNS rebinding). `check` refuses such results unless the operator
-- lists the range in `network.internal`.
--
-- Rules:
--
-- * The most specific special range containing the address decides. An internal entry
--   unlocks it only if it contains the address *and* is at least as specific as that
--   range: `10.1.0.0/16` unlocks 10.1.2.3 (in 10/8), but `0.0.0.0/0` or `::/0` unlock
--   nothing, and `169.254.0.0/16` does not unlock the metadata address 169.254.169.254,
--   which must be listed on its own (`169.254.169.254/32`).
-- * Some ranges are never a destination, whatever `network.internal` says (`fixed`):
--   0.0.0.0/8 and `::` (a connect to them reaches the local host), multicast, broadcast,
--   reserved 240/4, IPv4-compatible `::/96`, discard-only 100::/64, and corral's own
--   synthetic ranges (198.18.0.0/15, 64:ff9b:1::/48: see `corral.egress.synthetic`).
-- * An IPv4-mapped address (`::ffff:169.254.169.254`) is checked as its IPv4 address;
--   so is the IPv4 embedded in a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address,
--   which a translator or relay would deliver to. Teredo (2001::/32) is not unpacked.
-- * Documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32)
--   are *not* special: they are routed nowhere, so there is no service behind them to
--   protect, and the tests use them as stand-ins for public addresses.
-- @module corral.egress.ranges
local core = require "corral.core"
local errors = require "corral.errors"
local allowlist = require "corral.egress.allowlist"
local synthetic = require "corral.egress.synthetic"

local inet = core.inet

local M = {}

--- The argument name of internal-list errors.
M.ARGUMENT = "network.internal"

local function embedded_nat64(b) return b:sub(13, 16) end
local function embedded_6to4(b) return b:sub(3, 6) end

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
  { "192.168.0.0/16", "private (RFC 1918)" },
  { synthetic.V4_CIDR, "corral's synthetic range (benchmarking, RFC 2544)", fixed = true },
  { "224.0.0.0/4", "multicast", fixed = true },
  { "240.0.0.0/4", "reserved (RFC 1112)", fixed = true },
  { "255.255.255.255/32", "broadcast", fixed = true },
  { "::/128", "the unspecified address (a connect reaches the local host)", fixed = true },
  { "::1/128", "loopback" },
  { "::/96", "IPv4-compatible (deprecated, RFC 4291)", fixed = true },
  { "64:ff9b::/96", "NAT64 (RFC 6052)", embeds = embedded_nat64 },
  { synthetic.V6_CIDR, "corral's synthetic range (local-use translation, RFC 8215)", fixed = true },
  { "100::/64", "discard-only (RFC 6666)", fixed = true },
  { "2002::/16", "6to4 (RFC 3056)", embeds = embedded_6to4 },
  { "fc00::/7", "unique local (RFC 4193)" },
  { "fd00:ec2::254/128", "the cloud metadata service (AWS)" },
  { "fe80::/10", "link-local" },
  { "fec0::/10", "site-local (deprecated, RFC 3879)" },
  { "ff00::/8", "multicast", fixed = true },
}

for _, r in ipairs(M.SPECIAL) do
  r.bytes, r.prefix = assert(allowlist.parse_cidr(r[1]))
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
-- @tparam string ip text or bytes
-- @treturn[1] string what the range is
-- @treturn[1] string the range (CIDR)
-- @treturn[1] boolean whether `network.internal` can never unlock it
-- @treturn[2] nil an ordinary address (or not an address)
function M.classify(ip)
  local b = allowlist.address(ip)
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
    local b, p = allowlist.parse_cidr(list[i])
    if not b then
      return nil, errors.invalid_argument(M.ARGUMENT, string.format('"%s": %s', tostring(list[i]), p))
    end
    out[i] = { bytes = b, prefix = p, text = list[i] }
  end
  return out
end

local function check(bytes, internal, depth)
  local r = most_specific(bytes)
  local text = inet.format(bytes)
  if not r then return true end
  if r.embeds and depth == 0 then
    local v4 = r.embeds(bytes)
    local ok, why = check(v4, internal, 1)
    if ok then return true end
    return nil, string.format("%s is %s, delivered to an embedded IPv4 address: %s", text, r[2], why)
  end
  if r.fixed then
    return nil, string.format("%s is %s (%s): never a destination", text, r[2], r[1])
  end
  local broader
  for _, n in ipairs(internal) do
    if #n.bytes == #bytes and inet.in_cidr(bytes, n.bytes, n.prefix) then
      if n.prefix >= r.prefix then return true end
      broader = broader or n.text
    end
  end
  local hint = broader and string.format("; the internal entry %s is broader than %s and does not unlock it",
    broader, r[1]) or ""
  return nil, string.format("%s is %s (%s); list it in network.internal to allow it%s", text, r[2], r[1], hint)
end

--- Checks an address a name resolved to on the host.
-- @tparam string ip text or bytes (IPv4-mapped addresses are checked as IPv4)
-- @tparam[opt] {string,...} internal the `network.internal` list (or its `parse_internal`)
-- @treturn[1] boolean true: the address may be connected to
-- @return[2] nil
-- @treturn[2] string why not (the address, its range, and how to allow it if one can)
function M.check(ip, internal)
  local bytes, why = allowlist.address(ip)
  if not bytes then return nil, why end
  local nets, err = M.parse_internal(internal)
  if not nets then return nil, tostring(err) end
  local ok, reason = check(bytes, nets, 0)
  if ok then return true end
  if #bytes == 4 and #ip ~= 4 and (inet.parse(ip) == "inet6" or (#ip == 16 and not inet.parse(ip))) then
    reason = string.format("::ffff:%s is IPv4-mapped: %s", inet.format(bytes), reason)
  end
  return nil, reason
end

return M
