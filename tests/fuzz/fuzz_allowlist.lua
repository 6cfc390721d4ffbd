-- A mutation fuzzer for the allowlist entry parser (corral.egress.grammar.parse_entry),
-- which reads what an operator — or a tenant-influenced file — writes. Entries are bred
-- from tests/fuzz/corpus/allowlist/seeds (one per line) by inserting, deleting, replacing
-- and splicing bytes, with an alphabet weighted to the grammar's own punctuation. For each
-- it checks: parse_entry never raises; it answers an entry or an invalid_argument on
-- network.allow whose detail begins with the entry quoted; an entry's canonical text
-- parses back to the same canonical text, kind, protocol and ports; loopback is never
-- granted; a UDP entry always names ports, never port 53 alone.
--   lua5.4 tests/fuzz/fuzz_allowlist.lua [SECONDS] [SEED]   (scripts/run-fuzz allowlist)
-- tests/egress_allowlist_spec.lua runs `run` for a fixed count with a fixed seed.
local grammar = require "corral.egress.grammar"
local errors = require "corral.errors"

local M = {}

local ALPHABET = "[]:/.,-*_@?#%0123456789abcdefxyzABC:///:::[[]]..--**"

local function seeds(path)
  local out = {}
  for line in io.lines(path) do
    if line ~= "" then out[#out + 1] = line end
  end
  return out
end

local function mutate(s, pool, rnd)
  for _ = 1, rnd(1, 4) do
    local op, at = rnd(1, 5), rnd(1, #s + 1)
    local c = rnd(1, 8) == 1 and string.char(rnd(0, 255)) or ALPHABET:sub(rnd(1, #ALPHABET), nil)
    c = c:sub(1, 1)
    if op == 1 then
      s = s:sub(1, at - 1) .. c .. s:sub(at)
    elseif op == 2 then
      s = s:sub(1, at - 1) .. s:sub(at + 1)
    elseif op == 3 then
      s = s:sub(1, at - 1) .. c .. s:sub(at + 1)
    elseif op == 4 then
      local o = pool[rnd(1, #pool)]
      s = s:sub(1, at - 1) .. o:sub(rnd(1, #o + 1))
    else
      s = s:sub(1, at - 1) .. s:sub(at, at):rep(rnd(2, 40)) .. s:sub(at + 1)
    end
  end
  return s:sub(1, 600)
end

local function fail(entry, why)
  error(string.format("allowlist fuzz: %q: %s", entry, why), 0)
end

--- Checks one entry against the invariants; raises naming it when one breaks.
function M.check(entry)
  local ok, e, err = pcall(grammar.parse_entry, entry)
  if not ok then fail(entry, "raised: " .. tostring(e)) end
  if not e then
    if not errors.is(err, "invalid_argument") or err.argument ~= "network.allow" then
      fail(entry, "refused without an invalid_argument on network.allow")
    end
    local quoted = '"' .. entry .. '": '
    if err.detail:sub(1, #quoted) ~= quoted then fail(entry, "detail does not name the entry") end
    return false
  end
  local again = grammar.parse_entry(e.text)
  if not again or again.text ~= e.text or again.kind ~= e.kind or again.proto ~= e.proto or
      grammar.ports_text(again) ~= grammar.ports_text(e) then
    fail(entry, "canonical text " .. tostring(e.text) .. " does not parse back to itself")
  end
  if (e.kind == "address" or e.kind == "network") and
      ((#e.bytes == 4 and e.bytes:byte(1) == 127 and e.prefix >= 8) or
       (#e.bytes == 16 and e.prefix == 128 and e.bytes == string.rep("\0", 15) .. "\1")) then
    fail(entry, "grants the sandbox's own loopback")
  end
  if e.proto ~= "tcp" and e.proto ~= "udp" then fail(entry, "no protocol: " .. tostring(e.proto)) end
  if e.proto == "udp" and (not e.ports or (#e.ports == 1 and e.ports[1][1] == 53 and e.ports[1][2] == 53)) then
    fail(entry, "a UDP entry without ports, or for DNS alone")
  end
  return true
end

--- Runs `count` mutations (or until `seconds` have passed) from the seed corpus.
-- @treturn integer inputs tried
-- @treturn integer of them accepted
function M.run(opts)
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  local pool = seeds(opts.seeds or (here .. "/corpus/allowlist/seeds"))
  local state = opts.seed or os.time()
  local function rnd(a, b) -- a small LCG: the run is reproducible from its seed alone
    state = (state * 1103515245 + 12345) % 2147483648
    return a + state % (b - a + 1)
  end
  local deadline = opts.seconds and os.clock() + opts.seconds
  local n, accepted = 0, 0
  for _, s in ipairs(pool) do
    if M.check(s) then accepted = accepted + 1 end
  end
  while (opts.count and n < opts.count) or (deadline and os.clock() < deadline) do
    local entry = mutate(pool[rnd(1, #pool)], pool, rnd)
    n = n + 1
    if M.check(entry) then
      accepted = accepted + 1
      if #pool < 4000 then pool[#pool + 1] = entry end
    end
  end
  return n, accepted
end

if arg and arg[0] and arg[0]:match("fuzz_allowlist%.lua$") then
  local seconds, seed = tonumber(arg[1]) or 60, tonumber(arg[2])
  local n, accepted = M.run({ seconds = seconds, seed = seed })
  print(string.format("fuzz_allowlist: ok, %d entries in %ds, %d accepted", n, seconds, accepted))
end

return M
