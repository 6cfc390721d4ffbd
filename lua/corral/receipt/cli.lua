--- `corral key`, `corral verify` and `corral policy`: the host key, a receipt checked and
-- said in words, and the canonical policy a receipt's commitment covers.
--
-- Registered by corral.cli; nothing here loads until one of them runs.
-- @module corral.receipt.cli
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

M.KEY_USAGE = [[corral key

Prints the host key's public half (PEM) and its fingerprint, the keyid of every receipt
this caller signs, and where the private key is: root's in /var/lib/corral/key, anyone
else's in $XDG_STATE_HOME/corral/key (default ~/.local/state/corral/key), or
$CORRAL_STATE_DIR/key when that is set. The key is made at first use (Ed25519, mode
0600, never inside a sandbox). Exit: 0, or 3 when no key can be made or read.]]
M.KEY_SPEC = {}

M.VERIFY_USAGE = [[corral verify FILE [--key PUB]

Checks a receipt (a DSSE envelope around an in-toto Statement, docs/receipts.md): its
signature with the public key in PUB (PEM; default this caller's host key), then its
commitment, recomputed from the policy the receipt carries. Prints what was enforced, in
words. Exit: 0 valid; 1 invalid (the message names the part that failed: payload,
signature, key or policy); 2 bad usage (FILE missing, not JSON, not a DSSE envelope of
an in-toto Statement, PUB unreadable).]]
M.VERIFY_SPEC = { key = "value" }

M.POLICY_USAGE = [[corral policy --canonical FILE

Prints the exact bytes a receipt's commitment covers (a run's or a census's policy as
canonical JSON, keys sorted; a step's tier serialisation), so that `corral policy
--canonical FILE | sha256sum` recomputes the commitment without corral's verifier. The
signature is not checked here: `corral verify` does that. Exit: 0, 2 bad usage.]]
M.POLICY_SPEC = { canonical = "flag" }

--- `corral key`.
function M.key(argv, cli)
  local opts, rest = cli.parse(argv, M.KEY_SPEC)
  if not opts then return cli.fail("key", rest) end
  if rest[1] then return cli.fail("key", errors.invalid_argument(rest[1], "corral key takes no operand")) end
  local k, err = require("corral.receipt.key").load()
  if not k then return cli.fail("key", err) end
  io.write(k.pem, "fingerprint ", k.fingerprint, "\n", "private key ", k.path, k.created and " (made now)" or "",
    "\n")
  return 0
end

-- A receipt's value as text a terminal shows as it is: control characters (newline, ESC,
-- C1), bidirectional overrides and bytes that are not UTF-8 written as escapes (\n, \x1b,
-- \u{202e}), a backslash doubled, so that no value can draw or hide a line; nil is
-- "missing".
local NAMED = { [10] = "\\n", [13] = "\\r", [9] = "\\t", [92] = "\\\\" }
local function hidden(cp)
  return cp < 32 or (cp >= 127 and cp < 160) or (cp >= 0x200e and cp <= 0x200f) or (cp >= 0x2028 and cp <= 0x202e)
    or (cp >= 0x2066 and cp <= 0x2069)
end
local function shown(v)
  if v == nil then return "missing" end
  local s, out, i = tostring(v), {}, 1
  while i <= #s do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xc2 and c <= 0xdf) and 2 or (c >= 0xe0 and c <= 0xef) and 3 or
      (c >= 0xf0 and c <= 0xf4) and 4 or 0
    local ch = len > 0 and s:sub(i, i + len - 1)
    local cp = ch and #ch == len and utf8.len(ch) == 1 and utf8.codepoint(ch)
    if not cp then
      out[#out + 1] = string.format("\\x%02x", c)
      i = i + 1
    elseif NAMED[cp] or hidden(cp) then
      out[#out + 1] = NAMED[cp] or (cp < 256 and string.format("\\x%02x", cp) or string.format("\\u{%x}", cp))
      i = i + len
    else
      out[#out + 1] = ch
      i = i + len
    end
  end
  return table.concat(out)
end

-- A value in words: "missing" where the receipt has none.
local function said(v)
  if v == nil then return "missing" end
  return tostring(v)
end

local function limits_words(limits)
  local parts = {}
  for _, k in ipairs({ "memory", "pids", "cpu", "wall", "fsize", "nofile", "disk" }) do
    if type(limits) == "table" and limits[k] ~= nil then parts[#parts + 1] = k .. " " .. said(limits[k]) end
  end
  return #parts > 0 and table.concat(parts, ", ") or "none"
end

local function verdict_words(counts)
  if type(counts) ~= "table" then return "none" end
  return string.format("%d allowed, %d denied", counts.allow or 0, counts.deny or 0)
end

local function command_words(argv)
  local words = {}
  for _, a in ipairs(type(argv) == "table" and argv or {}) do words[#words + 1] = said(a) end
  return #words > 0 and table.concat(words, " ") or "missing"
end

-- What a run's receipt says was enforced.
local function run_words(p, row)
  local pol = p.policy or {}
  row("command", command_words(p.argv))
  row("mechanism", said(p.mechanism))
  for _, g in ipairs(p.gate or {}) do
    -- the probe's evidence for the host, not a measurement of this run (its ids are the root row's)
    row("gate", string.format("%s %s when this host was probed%s: %s", g.capability, g.holds and "held" or "ABSENT",
      g.probed_at and " (" .. said(g.probed_at) .. ")" or "", said(g.detail)))
  end
  local plan = pol.root_plan or {}
  local binds = {}
  for _, m in ipairs(plan.mounts or {}) do
    if m.rw then binds[#binds + 1] = said(m.dest) .. " read-write" end
    if m.own then binds[#binds + 1] = said(m.dest) .. " its own (sha256 " .. said(m.sha256) .. ")" end
  end
  row("root", string.format("runtime read-only, %s; /tmp %s MiB; uid %s", table.concat(binds, ", "),
    said(plan.tmp_mib), said(plan.uid)))
  row("limits", limits_words(pol.limits))
  local allow = pol.allowlist
  row("egress", type(allow) == "table" and #allow > 0 and ("only " .. table.concat(allow, ", ")) or "none (no network)")
  local secrets = type(pol.secrets) == "table" and pol.secrets or {}
  row("secrets", #secrets > 0 and table.concat(secrets, ", ") or "none bound")
  row("exit", string.format("%s (%s%s)", said(p.exit and p.exit.status), said(p.exit and p.exit.how),
    p.exit and p.exit.limit and (", " .. p.exit.limit .. " limit") or ""))
  row("decisions", verdict_words(p.egress))
end

-- The digest of the subject named name, from the Statement.
local function subject_digest(statement, name)
  for _, sub in ipairs(type(statement.subject) == "table" and statement.subject or {}) do
    if type(sub) == "table" and sub.name == name and type(sub.digest) == "table" then return sub.digest.sha256 end
  end
end

local function step_words(p, row, statement)
  row("command", command_words(p.argv))
  row("tier", said(p.tier) .. " (" .. said(p.mechanism) .. ")")
  for line in said(p.policy and p.policy.canonical or ""):gmatch("[^\n]+") do row("policy", line) end
  row("exit", said(p.exit))
  if p.output then
    row("output", string.format("sha256 %s (%s bytes; as signed: the receipt does not carry the output)",
      said(subject_digest(statement, "stdout")), said(type(p.output) == "table" and p.output.bytes or nil)))
  end
  local code = subject_digest(statement, "s2 code")
  if code then row("code", "sha256 " .. said(code) .. " (as signed: the receipt does not carry the code)") end
end

local function census_words(p, row)
  row("mechanism", said(p.mechanism))
  local c = p.census or {}
  row("census", string.format("held %s of %s (breached %s, unavailable %s, void %s)", said(c.held),
    said(c.total), said(c.breached), said(c.unavailable), said(c.void)))
  for _, r in ipairs(p.checks or {}) do row("check", string.format("%-22s %s", said(r.id), said(r.outcome))) end
end

--- Prints a verified Statement in words.
function M.describe(statement, fingerprint, out)
  out = out or io.stdout
  local p = statement.predicate
  local function row(k, v) out:write(string.format("%-11s %s\n", k, shown(v))) end
  row("valid", said(p.kind) .. " receipt signed by " .. fingerprint)
  row("commitment", said(p.commitment) .. " (recomputed from the policy carried)")
  row("host", string.format("%s, boot %s, %s", said(p.host and p.host.name), said(p.host and p.host.boot_id),
    said(p.corral_version)))
  row("time", said(p.started) .. " to " .. said(p.ended))
  local words = { run = run_words, step = step_words, census = census_words }
  if words[p.kind] then words[p.kind](p, row, statement) end
end

--- `corral verify`.
function M.verify(argv, cli)
  local opts, rest = cli.parse(argv, M.VERIFY_SPEC)
  if not opts then return cli.fail("verify", rest) end
  if #rest ~= 1 then return cli.fail("verify", errors.invalid_argument("FILE", "exactly one receipt is needed")) end
  local receipt = require "corral.receipt"
  local pem
  if opts.key then
    -- never nil once --key is given: a key that cannot be read is refused, not replaced
    -- by this caller's own
    local kerr
    pem, kerr = core.fs.read_regular(opts.key, receipt.KEY_MAX)
    if not pem then return cli.fail("verify", errors.invalid_argument("--key", tostring(kerr))) end
  end
  local statement, why, usage = receipt.verify(rest[1], pem)
  if not statement then
    if usage then return cli.fail("verify", errors.invalid_argument("FILE", shown(why))) end
    if errors.is(why) then return cli.fail("verify", why) end
    io.stderr:write("corral verify: INVALID: ", shown(rest[1]), ": ", shown(why), "\n")
    return 1
  end
  M.describe(statement, why)
  return 0
end

--- `corral policy`.
function M.policy(argv, cli)
  local opts, rest = cli.parse(argv, M.POLICY_SPEC)
  if not opts then return cli.fail("policy", rest) end
  if not opts.canonical then return cli.fail("policy", errors.invalid_argument("--canonical", "is required")) end
  if #rest ~= 1 then return cli.fail("policy", errors.invalid_argument("FILE", "exactly one receipt is needed")) end
  local text, ferr = core.fs.read_regular(rest[1], require("corral.receipt").FILE_MAX)
  if not text then return cli.fail("policy", errors.invalid_argument("FILE", tostring(ferr))) end
  local json = require "corral.json"
  local ok, env = pcall(json.decode, text)
  local sign = ok and type(env) == "table" and type(env.payload) == "string" and
    require("corral.receipt.key").module()
  local payload = sign and sign.b64decode(env.payload)
  local st = payload and json.decode(payload)
  if type(st) ~= "table" or type(st.predicate) ~= "table" then
    return cli.fail("policy", errors.invalid_argument("FILE", rest[1] .. ": not a DSSE envelope of a corral receipt"))
  end
  io.write(require("corral.receipt").canonical(st.predicate))
  return 0
end

return M
