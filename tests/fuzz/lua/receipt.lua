--- Fuzz target: a receipt given to `corral verify` (corral.receipt.verify, then the
-- description `verify` prints of a valid one), against a key made for this process.
-- An input is either the receipt file itself, or (first byte "P") a Statement that is
-- signed here first, its commitment and carried subjects' digests set as a signer
-- would, so that what lies past the signature (the statement's checks and the printed
-- description) is reached too. verify must answer, never raise: the Statement, or nil
-- and why; a receipt it accepts has a known kind and its committed policy, and what is
-- printed of it holds no control character (a terminal's escapes). The description
-- itself may raise on a signed predicate of a shape corral never writes (only the key's
-- holder can sign one): that is a refused input here, not a broken invariant.
local S = require "support"
local dsse = require "corral.receipt.dsse"
local json = require "corral.json"
local key = require "corral.receipt.key"
local receipt = require "corral.receipt"
local receipt_cli = require "corral.receipt.cli"

local sign = assert(key.module())
local key_path = S.scratch .. "/receipt.key"
assert(sign.ensure_key(key_path) ~= nil)
local pem = assert(sign.public_key(key_path))

-- The digests a signer writes: the commitment over the policy, each carried subject's.
local function as_signed(text)
  local ok, st = pcall(json.decode, text)
  if not ok or type(st) ~= "table" or type(st.predicate) ~= "table" then return text end
  local p = st.predicate
  local cok, commitment = pcall(receipt.commitment, p)
  if cok then p.commitment = commitment end
  for _, sub in ipairs(type(st.subject) == "table" and st.subject or {}) do
    local bytes = type(sub) == "table" and (sub.name == "argv" and type(p.argv) == "table" and json.encode(p.argv)
      or sub.name == "census" and type(p.checks) == "table" and json.encode(p.checks))
    if bytes and type(sub.digest) == "table" then sub.digest.sha256 = receipt.subject("x", bytes).digest.sha256 end
  end
  local eok, out = pcall(json.encode, st)
  return eok and out or text
end

local function signed(payload)
  local sig = assert(sign.sign(key_path, dsse.pae(dsse.PAYLOAD_TYPE, payload)))
  return json.encode({ payloadType = dsse.PAYLOAD_TYPE, payload = sign.b64encode(payload),
    signatures = { { sig = sign.b64encode(sig) } } })
end

local printed = { write = function(self, ...) for _, s in ipairs({ ... }) do self[#self + 1] = s end end }

return function(data)
  local text = data
  if data:sub(1, 1) == "P" then text = signed(as_signed(data:sub(2))) end
  local path = S.write("receipt.json", text)
  local statement, why = S.no_raise("receipt.verify", receipt.verify, path, pem)
  if not statement then
    S.check(type(why) == "string" or type(why) == "table", "a refusal says why")
    return
  end
  S.check(receipt.KINDS[statement.predicate.kind], "an accepted receipt is of a known kind")
  S.check(statement.predicate.commitment == receipt.commitment(statement.predicate), "its policy is the committed one")
  for i = #printed, 1, -1 do printed[i] = nil end
  if not pcall(receipt_cli.describe, statement, why, printed) then return end
  local shown = table.concat(printed)
  S.check(not shown:find("[%z\1-\9\11-\31\127]"), "no control character is printed: " .. shown)
end
