--- A DSSE envelope around an in-toto Statement: sealed with the host key, opened with a
-- public key. Each way of failing says which part failed (payload, signature, key).
--
-- DSSE (github.com/secure-systems-lab/dsse, protocol.md): the signature is over
-- PAE(payloadType, payload) = "DSSEv1 <len> <type> <len> <payload>", lengths in bytes
-- as ASCII decimal; the envelope is `{payload = base64, payloadType, signatures =
-- {{keyid, sig = base64}}}`.
-- @module corral.receipt.dsse
local json = require "corral.json"
local key = require "corral.receipt.key"

local M = {}

--- The payload type of an in-toto Statement.
M.PAYLOAD_TYPE = "application/vnd.in-toto+json"
--- The in-toto Statement type.
M.STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

--- DSSE's pre-authentication encoding.
-- @tparam string payload_type
-- @tparam string payload the bytes (not their base64)
-- @treturn string
function M.pae(payload_type, payload)
  return string.format("DSSEv1 %d %s %d %s", #payload_type, payload_type, #payload, payload)
end

--- Seals a Statement: its canonical JSON signed with the host key.
-- @tparam table statement `{_type, subject, predicateType, predicate}`
-- @tparam table k the host key (corral.receipt.key.load)
-- @treturn table the envelope, or nil and why
function M.seal(statement, k)
  local payload = json.encode(statement, { keyorder = { "_type", "subject", "predicateType", "predicate" } })
  local sig, err = key.sign(k, M.pae(M.PAYLOAD_TYPE, payload))
  if not sig then return nil, err end
  local sign = key.module()
  return { payload = sign.b64encode(payload), payloadType = M.PAYLOAD_TYPE,
           signatures = { { keyid = k.fingerprint, sig = sign.b64encode(sig) } } }
end

--- The envelope's JSON text, keys in a fixed order.
-- @tparam table envelope
-- @treturn string
function M.encode(envelope)
  return json.encode(envelope, { indent = true, keyorder = { "payloadType", "payload", "signatures", "keyid", "sig" } })
end

-- The envelope's parts, checked for shape: nil and the part that is wrong.
local function parts(envelope)
  if type(envelope) ~= "table" then return nil, "not a DSSE envelope (a JSON object)" end
  if envelope.payloadType ~= M.PAYLOAD_TYPE then
    return nil, "payloadType: " .. tostring(envelope.payloadType) .. ", not " .. M.PAYLOAD_TYPE
  end
  if type(envelope.payload) ~= "string" then return nil, "payload: missing" end
  local sigs = envelope.signatures
  if type(sigs) ~= "table" or type(sigs[1]) ~= "table" or type(sigs[1].sig) ~= "string" then
    return nil, "signature: missing"
  end
  return envelope.payload, sigs
end

--- Opens an envelope with a public key: the signature checked over the payload's bytes,
-- then the payload read as an in-toto Statement.
-- @tparam table envelope decoded JSON
-- @tparam string pem the public key (SubjectPublicKeyInfo PEM)
-- @treturn table the Statement, or nil and the reason, naming the part that failed
function M.open(envelope, pem)
  local sign, merr = key.module()
  if not sign then return nil, tostring(merr) end
  local b64, sigs = parts(envelope)
  if not b64 then return nil, sigs end
  local payload = sign.b64decode(b64)
  if not payload then return nil, "payload: not base64" end
  local raw, kerr = sign.public_raw(pem)
  if not raw then return nil, "key: " .. tostring(kerr) end
  local fingerprint = key.fingerprint(raw)
  local why
  for _, s in ipairs(sigs) do
    local sig = type(s) == "table" and type(s.sig) == "string" and sign.b64decode(s.sig)
    if not sig then
      why = "signature: not base64"
    elseif s.keyid ~= nil and s.keyid ~= fingerprint then
      why = "key: the signature's keyid " .. tostring(s.keyid) .. " is not this key's " .. fingerprint
    else
      local ok, verr = sign.verify(pem, M.pae(envelope.payloadType, payload), sig)
      if ok then
        local statement = json.decode(payload)
        if type(statement) ~= "table" or statement._type ~= M.STATEMENT_TYPE then
          return nil, "payload: not an in-toto Statement v1"
        end
        return statement, fingerprint
      end
      why = "signature: " .. tostring(verr) .. " over the payload with key " .. fingerprint ..
        " (the payload, the signature or the key was changed)"
    end
  end
  return nil, why
end

return M
