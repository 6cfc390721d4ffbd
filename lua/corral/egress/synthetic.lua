--- Synthetic addresses: what the in-sandbox DNS responder answers for an allowed name.
--
-- The tenant never sees a real address for a name. Each allowed name gets an address
-- from a range that is never a real destination; a connection to it reaches the
-- acceptor, which maps it back to the name (`lookup`), and only then does the host
-- resolve the name, after the decision.
--
-- * IPv4: 198.18.0.0/15 (RFC 2544 benchmarking: never routed on the Internet). Every
--   address whose last octet is 0 or 255 is skipped: some stacks and middleboxes still
--   treat x.y.z.0 and x.y.z.255 as network/broadcast addresses of a /24. That leaves
--   512 * 254 = 130,048 addresses.
-- * IPv6: 64:ff9b:1::/48 (RFC 8215, local-use IPv4/IPv6 translation: never global).
--   The name's IPv6 address is its IPv4 synthetic address embedded in the last 32 bits
--   (64:ff9b:1::c612:xxxx, the RFC 6052 /96 layout), so the two families share one slot.
--   A fixed prefix (rather than a ULA derived from the sandbox id) lets every component
--   (the decision, `corral.egress.ranges`, the nftables rules) recognise a synthetic
--   address without the allocator; each sandbox has its own network namespace, so
--   sandboxes sharing the range never see each other's addresses.
--
-- Both ranges are "special" in `corral.egress.ranges` and can never be unlocked there:
-- a host-side resolution that lands in them is refused.
--
-- Slots: a name hashes (FNV-1a 64 over the seed and the name) to a slot; a taken slot
-- moves to the next free one (linear probing). An address is stable for the life of the
-- allocator, and for one seed it does not depend on other names unless they collided.
-- At most `limit` names (default 65,536, at most 130,048): the table is never more than
-- half full, so probing stays short; past the limit `address` refuses.
-- @module corral.egress.synthetic
local core = require "corral.core"
local errors = require "corral.errors"
local address = require "corral.egress.address"

local inet = core.inet

local M = {}

--- The IPv4 synthetic network.
M.V4_CIDR = "198.18.0.0/15"
--- The IPv6 synthetic network.
M.V6_CIDR = "64:ff9b:1::/48"
--- Default maximum number of names per allocator: read by `new`, so a change applies to
-- sandboxes created afterwards (the tests make it small to reach it with a few names).
-- The data plane answers a name past it SERVFAIL (`corral.egress.responder`).
M.DEFAULT_LIMIT = 65536
--- Number of usable addresses (and the largest limit).
M.CAPACITY = 512 * 254

local V4_NET = assert(address.parse_cidr(M.V4_CIDR))
local V6_NET = assert(address.parse_cidr(M.V6_CIDR))
local V6_EMBED = assert(address.parse_cidr("64:ff9b:1::/96"))

local function fnv1a(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do
    h = (h ~ s:byte(i)) * 0x100000001b3
  end
  return h
end

local function slot_bytes(slot)
  local offset = (slot // 254) * 256 + slot % 254 + 1
  return string.char(198, 18 + (offset >> 16), (offset >> 8) & 0xff, offset & 0xff)
end

-- The slot of a 4-byte address, or nil when it is not an allocatable synthetic address.
local function bytes_slot(b)
  if not inet.in_cidr(b, V4_NET, 15) then return nil end
  local o2, o3, o4 = b:byte(2, 4)
  if o4 == 0 or o4 == 255 then return nil end
  local block = (o2 - 18) * 256 + o3
  return block * 254 + o4 - 1
end

-- 4-byte synthetic address for any address: itself, or the IPv4 embedded in 64:ff9b:1::/96.
local function as_v4(bytes)
  if #bytes == 4 then return bytes end
  if inet.in_cidr(bytes, V6_EMBED, 96) then return bytes:sub(13, 16) end
  return nil
end

--- Whether an address (text) lies in either synthetic network, allocated or not.
-- @tparam string ip
-- @treturn boolean
function M.is_synthetic(ip)
  local b = address.parse_address(ip)
  if not b then return false end
  if #b == 4 then return inet.in_cidr(b, V4_NET, 15) end
  return inet.in_cidr(b, V6_NET, 48)
end

local Allocator = {}
Allocator.__index = Allocator

--- A new allocator.
-- @param seed the sandbox id (or any string or number): it mixes into the hash
-- @tparam[opt] table opts `{limit = integer}` (default `DEFAULT_LIMIT`, at most `CAPACITY`)
-- @treturn table the allocator
function M.new(seed, opts)
  if type(seed) ~= "string" and type(seed) ~= "number" then
    error("synthetic.new: seed must be a string or a number", 2)
  end
  local limit = (opts or {}).limit or M.DEFAULT_LIMIT
  if math.type(limit) ~= "integer" or limit < 1 or limit > M.CAPACITY then
    error("synthetic.new: limit must be an integer 1.." .. M.CAPACITY, 2)
  end
  return setmetatable({ seed = tostring(seed), limit = limit, n = 0, by_name = {}, by_slot = {} }, Allocator)
end

--- The synthetic address of a name, allocating it on first use.
-- @tparam string name a hostname (normalised as in allowlists: `PyPI.org.` is `pypi.org`)
-- @tparam[opt="inet"] string family `"inet"` or `"inet6"`
-- @treturn[1] string the address as text
-- @treturn[1] string the address as 4 or 16 bytes (what `core.dns.answer` takes)
-- @return[2] nil
-- @treturn[2] table `invalid_argument` (not a hostname) or `cannot_enforce` (the limit)
function Allocator:address(name, family)
  family = family or "inet"
  if family ~= "inet" and family ~= "inet6" then
    error("address: family must be \"inet\" or \"inet6\", got " .. tostring(family), 2)
  end
  local n, why = address.normalize_name(name)
  if not n then return nil, errors.invalid_argument("name", string.format('"%s": %s', tostring(name), why)) end
  local slot = self.by_name[n]
  if not slot then
    if self.n >= self.limit then
      return nil, errors.cannot_enforce("network_restriction", string.format(
        "synthetic address table full: %d names already have an address in this sandbox; %q refused",
        self.limit, n))
    end
    slot = fnv1a(self.seed .. "\0" .. n) % M.CAPACITY
    while self.by_slot[slot] do slot = (slot + 1) % M.CAPACITY end
    self.by_slot[slot] = n
    self.by_name[n] = slot
    self.n = self.n + 1
  end
  local b = slot_bytes(slot)
  if family == "inet6" then b = V6_EMBED:sub(1, 12) .. b end
  return inet.format(b), b
end

--- The name a synthetic address was given to (text, either family; an IPv4-mapped form
-- of a synthetic IPv4 address too).
-- @tparam string ip
-- @treturn string|nil the name, or nil for any other address
function Allocator:lookup(ip)
  local b = address.parse_address(ip)
  b = b and as_v4(b)
  local slot = b and bytes_slot(b)
  return slot and self.by_slot[slot]
end

--- How many names have an address.
-- @treturn integer
function Allocator:count()
  return self.n
end

--- The names with an address, sorted.
-- @treturn {string,...}
function Allocator:names()
  local t = {}
  for name in pairs(self.by_name) do t[#t + 1] = name end
  table.sort(t)
  return t
end

return M
