--- Signed receipts: an in-toto Statement v1 in a DSSE envelope, signed with the host key,
-- for a `corral run`, a `corral step` and a `corral conformance` census; and their
-- verification (signature, then the commitment recomputed from the policy carried).
-- docs/receipts.md documents the predicate.
-- @module corral.receipt
local core = require "corral.core"
local dsse = require "corral.receipt.dsse"
local errors = require "corral.errors"
local json = require "corral.json"
local key = require "corral.receipt.key"

local M = {}

--- The predicate type of every corral receipt (its `kind` says run, step or census).
M.PREDICATE_TYPE = "urn:corral:receipt:v1"

--- The largest receipt `verify` reads (a census of every check is ~100 KiB), and the
-- largest public key file: a named file is read only when it is regular and no larger.
M.FILE_MAX = 16 * 1024 * 1024
M.KEY_MAX = 64 * 1024

local function read_line(path)
  local f = io.open(path)
  if not f then return nil end
  local v = f:read("l")
  f:close()
  return v
end

--- The host a receipt was made on: its name and this boot's id.
-- @treturn table `{name =, boot_id =}`
function M.host()
  return { name = read_line("/proc/sys/kernel/hostname"), boot_id = read_line("/proc/sys/kernel/random/boot_id") }
end

--- A wall-clock time as RFC 3339 UTC with microseconds.
-- @tparam number t seconds since the epoch
-- @treturn string
function M.time(t)
  local s = math.floor(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. string.format(".%06dZ", math.floor((t - s) * 1e6 + 0.5) % 1000000)
end

--- Now, in seconds since the epoch (microseconds).
function M.now()
  return core.relay.walltime()
end

--- The bytes a predicate's commitment covers: a step's tier serialisation (as `corral
-- step` has always committed, corral.tier.policy.canonical), else the policy's canonical
-- JSON (every object's keys sorted, corral.json).
-- @tparam table predicate
-- @treturn string
function M.canonical(predicate)
  local policy = predicate.policy
  if predicate.kind == "step" then return type(policy) == "table" and tostring(policy.canonical) or "" end
  return json.encode(policy == nil and json.null or policy)
end

--- The commitment over those bytes.
-- @tparam table predicate
-- @treturn string `sha256:<hex>`
function M.commitment(predicate)
  return "sha256:" .. assert(core.digest.sha256(M.canonical(predicate)))
end

--- A value as the receipt will carry it: through JSON and back, so that the commitment
-- made now is the one a verifier recomputes from the decoded payload.
function M.as_carried(value)
  return json.decode(json.encode(value))
end

--- A subject: a name and the SHA-256 of some bytes.
function M.subject(name, bytes)
  return { name = name, digest = { sha256 = assert(core.digest.sha256(bytes)) } }
end

--- The Statement for a predicate of `kind`, stamped with corral's version and the host.
-- @tparam string kind "run", "step" or "census"
-- @tparam table subjects a list from `M.subject`
-- @tparam table predicate the kind's fields; its `policy`, when it has no `commitment`,
--   is committed to here
-- @treturn table
function M.statement(kind, subjects, predicate)
  predicate.kind = kind
  predicate.corral_version = require("corral")._VERSION
  predicate.host = M.host()
  if predicate.policy ~= nil and kind ~= "step" then
    predicate.policy = M.as_carried(predicate.policy)
    predicate.commitment = M.commitment(predicate)
  end
  return { _type = dsse.STATEMENT_TYPE, subject = subjects, predicateType = M.PREDICATE_TYPE,
           predicate = predicate }
end

--- Checks that a receipt can be written: the host key loads (made at first use), and
-- the path is a regular file or can be made in an existing directory. Done before the
-- work, so that a bad path refuses before anything runs, leaving nothing behind.
-- @tparam string path
-- @treturn table `{key =, path =}`, or nil and an error (`argument` "receipt")
function M.prepare(path)
  -- checked before anything runs: an empty path is no file to write, found only at the end
  if path == "" then return nil, errors.invalid_argument("receipt", "empty: give the path of a file to write") end
  local st = core.fs.lstat(path)
  if st and st.type ~= "file" then return nil, errors.invalid_argument("receipt", path .. ": not a regular file") end
  local dir = path:match("^(.*)/[^/]*$") or "."
  local dst = core.fs.lstat(dir == "" and "/" or dir)
  if not (st or (dst and dst.type == "dir")) then
    return nil, errors.invalid_argument("receipt", path .. ": no such directory " .. dir)
  end
  local k, kerr = key.load()
  if not k then return nil, kerr end
  return { key = k, path = path }
end

--- Seals a Statement and writes the envelope to the prepared path (mode 0600; never
-- through a symbolic link).
-- @tparam table prepared from `M.prepare`
-- @tparam table statement from `M.statement`
-- @treturn true, or nil and why
function M.write(prepared, statement)
  local env, err = dsse.seal(statement, prepared.key)
  if not env then return nil, err end
  local f, ferr = core.fs.open_private(prepared.path, "w")
  if not f then return nil, ferr end
  local ok, werr = f:write(dsse.encode(env), "\n")
  f:close()
  if not ok then return nil, werr end
  return true
end

local function said(v)
  if v == nil then return "missing" end
  return tostring(v)
end

--- The kinds of receipt corral makes.
M.KINDS = { run = true, step = true, census = true }

-- What each kind's subjects are made from, where the verifier has it: the name, and the
-- bytes from the predicate (nil: not carried, so not recomputable).
local SUBJECTS = {
  argv = function(p) return type(p.argv) == "table" and json.encode(p.argv) or nil end,
  census = function(p) return type(p.checks) == "table" and json.encode(p.checks) or nil end,
}
-- Subjects whose bytes a receipt does not carry: their digest is signed, not recomputed.
local NOT_CARRIED = { ["s2 code"] = true, stdout = true }
local EXPECTED = { run = { argv = true }, step = { argv = true, ["s2 code"] = true, stdout = true },
                   census = { census = true } }

-- Every subject the verifier can recompute, recomputed; nil and why on the first that
-- differs, or a name this kind does not have.
local function check_subjects(statement, kind)
  if type(statement.subject) ~= "table" or #statement.subject == 0 then return nil, "payload: subject missing" end
  for _, sub in ipairs(statement.subject) do
    local name = type(sub) == "table" and sub.name
    local digest = name and type(sub.digest) == "table" and sub.digest.sha256
    if not (type(name) == "string" and EXPECTED[kind][name]) then
      return nil, "payload: subject " .. said(name or nil) .. " is not one a " .. kind .. " receipt has"
    end
    if type(digest) ~= "string" then return nil, "payload: subject " .. name .. ": digest missing" end
    if not NOT_CARRIED[name] then
      local bytes = SUBJECTS[name](statement.predicate)
      if not bytes then return nil, "payload: subject " .. name .. ": what it digests is missing" end
      local recomputed = assert(core.digest.sha256(bytes))
      if recomputed ~= digest then
        return nil, "payload: subject " .. name .. " has digest " .. digest .. ", not the predicate's (" ..
          recomputed .. ")"
      end
    end
  end
  return true
end

-- The predicate's fields that say again what its policy says: a receipt where they
-- differ from the committed policy is refused, so that what is printed is what was
-- committed to.
local function check_restated(p)
  if p.kind == "step" then
    local canonical = type(p.policy) == "table" and tostring(p.policy.canonical) or ""
    for _, k in ipairs({ "tier", "mechanism" }) do
      if not canonical:find("\n" .. k .. " " .. tostring(p[k]) .. "\n", 1, true) then
        return nil, "policy: " .. k .. " " .. said(p[k]) .. " is not the committed policy's"
      end
    end
  elseif p.mechanism ~= (type(p.policy) == "table" and p.policy.mechanism or nil) then
    return nil, "policy: mechanism " .. said(p.mechanism) .. " is not the committed policy's (" ..
      said(type(p.policy) == "table" and p.policy.mechanism or nil) .. ")"
  end
  return true
end

--- Reads a receipt file and verifies it against a public key (default: the host key's).
-- @tparam string path
-- @tparam[opt] string pem the public key
-- @treturn table the Statement and the key's fingerprint; or nil, why, and `usage` true
--   when the file itself cannot be read as a receipt
function M.verify(path, pem)
  local text, ferr = core.fs.read_regular(path, M.FILE_MAX)
  if not text then return nil, tostring(ferr), true end
  -- exactly one JSON document: nothing but white space after it
  local ok, envelope, pos = pcall(json.decode, text)
  if not ok or type(envelope) ~= "table" then return nil, path .. ": not JSON (a DSSE envelope)", true end
  if not text:find("^%s*$", pos) then
    return nil, path .. ": data after the envelope's JSON (at byte " .. pos .. "): not one DSSE envelope", true
  end
  if envelope.payloadType ~= dsse.PAYLOAD_TYPE then
    return nil, path .. ": payloadType " .. said(envelope.payloadType) .. ", not " .. dsse.PAYLOAD_TYPE, true
  end
  if not pem then
    local k, kerr = key.load()
    if not k then return nil, tostring(kerr) end
    pem = k.pem
  end
  local statement, fingerprint = dsse.open(envelope, pem)
  if not statement then return nil, fingerprint end
  local pred = statement.predicate
  if statement.predicateType ~= M.PREDICATE_TYPE or type(pred) ~= "table" then
    return nil, "payload: predicateType " .. said(statement.predicateType) .. ", not " .. M.PREDICATE_TYPE
  end
  if not M.KINDS[pred.kind] then return nil, "payload: kind " .. said(pred.kind) .. ", not run, step or census" end
  local recomputed = M.commitment(pred)
  if recomputed ~= pred.commitment then
    return nil, "policy: the commitment " .. said(pred.commitment) .. " is not the policy's (" .. recomputed ..
      "): the policy carried is not the one committed to"
  end
  local sok, serr = check_subjects(statement, pred.kind)
  if not sok then return nil, serr end
  local rok, rerr = check_restated(pred)
  if not rok then return nil, rerr end
  return statement, fingerprint
end

return M
