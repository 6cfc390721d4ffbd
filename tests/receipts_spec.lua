-- Signed receipts (docs/receipts.md): a receipt of a run, a step and a census verifies
-- with the host key (the control), and one changed byte of the payload, the signature,
-- the key or the policy fails, the verifier naming that part; a receipt signed by
-- another key fails against this one; the tenant cannot read the host key.
local json = require "dkjson"
local h = require "helpers"

local function with_state(dir, argv)
  local out = { "env", "CORRAL_STATE_DIR=" .. dir, h.host }
  for _, a in ipairs(argv) do out[#out + 1] = a end
  return h.capture(out)
end

local function envelope(path)
  return assert(json.decode(h.read(path)))
end

local function write_envelope(path, env)
  h.write(path, json.encode(env, { indent = true }))
end

-- One character of base64 text at i replaced by another of the alphabet.
local function flip(text, i)
  local c = text:sub(i, i)
  return text:sub(1, i - 1) .. (c == "A" and "B" or "A") .. text:sub(i + 1)
end

describe("corral receipts", function()
  local state, other, dir

  setup(function()
    dir = h.tmpdir("receipts")
    state, other = dir .. "/state", dir .. "/other"
  end)

  teardown(function() h.rmrf(dir) end)

  it("corral key makes the key at first use, 0600, and prints its public half and fingerprint", function()
    local out, status = with_state(state, { "key" })
    assert.are.equal(0, status, out)
    assert.matches("BEGIN PUBLIC KEY", out, 1, true)
    assert.matches("fingerprint sha256:%x+", out)
    assert.matches("(made now)", out, 1, true)
    assert.are.equal("600", h.sh("stat -c %a " .. h.quote(state .. "/key")):match("%d+"))
    local again = with_state(state, { "key" })
    assert.are.equal(out:match("fingerprint (%S+)"), again:match("fingerprint (%S+)"))
    assert.is_nil(again:find("(made now)", 1, true))
  end)

  it("a run's receipt verifies, and fails on a changed payload, signature, key or policy", function()
    local r = dir .. "/run.json"
    local out, status = with_state(state, { "run", "--receipt", r, "--memory", "256M", "--", "sh", "-c", "exit 3" })
    assert.are.equal(3, status, out)
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out) -- control
    assert.matches("valid +run receipt", out)
    assert.matches("limits +memory 268435456", out)
    assert.matches("exit +3 %(exited%)", out)
    -- the gate is the host's probe's evidence, said as such (not this run's ids)
    assert.matches("gate +user_namespaces held when this host was probed", out)
    local env = envelope(r)
    local bad = dir .. "/bad.json"

    -- the payload: one character of its base64 changed
    local e = envelope(r)
    e.payload = flip(e.payload, 40)
    write_envelope(bad, e)
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*signature: signature does not verify over the payload", out)

    -- the signature
    e = envelope(r)
    e.signatures[1].sig = flip(e.signatures[1].sig, 10)
    write_envelope(bad, e)
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*signature:", out)

    -- the key: one character of the public key's PEM changed, then another key's
    local pem = with_state(state, { "key" }):match("%-%-%-%-%-BEGIN.-END PUBLIC KEY%-%-%-%-%-\n")
    h.write(dir .. "/host.pub", pem)
    local b64 = pem:match("\n(.-)\n")
    h.write(dir .. "/changed.pub", pem:gsub(b64:gsub("%p", "%%%0"), flip(b64, 20)))
    out, status = with_state(state, { "verify", r, "--key", dir .. "/changed.pub" })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*key", out)
    pem = with_state(other, { "key" }):match("%-%-%-%-%-BEGIN.-END PUBLIC KEY%-%-%-%-%-\n")
    h.write(dir .. "/other.pub", pem)
    out, status = with_state(state, { "verify", r, "--key", dir .. "/other.pub" })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*key: the signature's keyid", out)

    -- the policy: changed and signed again with the same key, so that only the
    -- commitment can tell
    local script = [[
      local j = require "corral.json"
      local key = require "corral.receipt.key"
      local env = j.decode(io.open(arg[1]):read("a"))
      local st = j.decode(key.module().b64decode(env.payload))
      st.predicate.policy.limits.memory = st.predicate.policy.limits.memory * 2
      local dsse = require "corral.receipt.dsse"
      local f = io.open(arg[2], "w")
      f:write(dsse.encode(assert(dsse.seal(st, assert(key.load())))))
      f:close()]]
    h.write(dir .. "/resign.lua", script)
    out, status = with_state(state, { dir .. "/resign.lua", r, bad })
    assert.are.equal(0, status, out)
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*policy: the commitment", out)

    -- control after the attempts: the receipt as written still verifies, also with
    -- --key, and its commitment is the SHA-256 of `corral policy --canonical`
    write_envelope(bad, env)
    out, status = with_state(state, { "verify", bad, "--key", dir .. "/host.pub" })
    assert.are.equal(0, status, out)
    local commitment = out:match("commitment +sha256:(%x+)")
    local canon = with_state(state, { "policy", "--canonical", r })
    h.write(dir .. "/canon", canon)
    assert.are.equal(commitment, h.sh("sha256sum " .. h.quote(dir .. "/canon")):match("^(%x+)"))
  end)

  it("a receipt signed by another key fails against this one", function()
    local r = dir .. "/other-run.json"
    local out, status = with_state(other, { "run", "--receipt", r, "--", "true" })
    assert.are.equal(0, status, out)
    out, status = with_state(state, { "verify", r })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*key", out)
    out, status = with_state(other, { "verify", r }) -- control: its own key accepts it
    assert.are.equal(0, status, out)
  end)

  it("a step's receipt verifies and fails once its payload changes", function()
    local grants = dir .. "/grants.lua"
    h.write(grants, 'return { read = {"/etc"}, exec = {"/bin/cat", "/usr/bin/cat"} }')
    local r = dir .. "/step.json"
    local out, status = with_state(state, { "step", "--grants", grants, "--receipt", r, "--", "cat", "/etc/hostname" })
    assert.are.equal(0, status, out)
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out)
    assert.matches("valid +step receipt", out)
    assert.matches("policy +grant read /etc", out)
    local e = envelope(r)
    e.payload = flip(e.payload, 60)
    write_envelope(dir .. "/bad-step.json", e)
    out, status = with_state(state, { "verify", dir .. "/bad-step.json" })
    assert.are.equal(1, status, out)
    assert.matches("INVALID.*signature:", out)
  end)

  it("--output-digest makes a step's standard output a subject whose digest is what the reader got; " ..
    "refused without --receipt, then the control", function()
    local grants = dir .. "/grants-out.lua"
    h.write(grants, 'return { read = {"/etc"}, exec = {"/bin/cat", "/usr/bin/cat"} }')
    local r, got = dir .. "/step-out.json", dir .. "/step-out.txt"
    -- attempt: a digest with nowhere to go
    local out, status = with_state(state,
      { "step", "--grants", grants, "--output-digest", "--", "cat", "/etc/hostname" })
    assert.are.equal(2, status, out)
    assert.matches("%-%-output%-digest: needs %-%-receipt FILE", out)
    -- control: with --receipt (and --json, so stdout holds the receipt and the command's
    -- output goes to stderr, into `got`)
    local rc = os.execute(table.concat({ "env", "CORRAL_STATE_DIR=" .. h.quote(state), h.quote(h.host), "step",
      "--grants", h.quote(grants), "--receipt", h.quote(r), "--output-digest", "--json", "--", "cat", "/etc/hostname",
      ">/dev/null", "2>" .. h.quote(got) }, " "))
    assert.is_true(rc)
    assert.are.equal(h.read("/etc/hostname"), h.read(got))
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out)
    h.write(dir .. "/payload.b64", envelope(r).payload)
    local statement = assert(json.decode(h.sh("base64 -d < " .. h.quote(dir .. "/payload.b64"))))
    local digest
    for _, sub in ipairs(statement.subject) do
      if sub.name == "stdout" then digest = sub.digest.sha256 end
    end
    assert.are.equal(h.sh("sha256sum < " .. h.quote(got)):match("^%x+"), digest)
    assert.are.equal(#h.read(got), statement.predicate.output.bytes)
    -- and `corral verify` prints that subject's digest
    assert.matches("output +sha256 " .. digest .. " %(" .. #h.read(got) .. " bytes;", out)
  end)

  it("a census's receipt verifies, each check with its evidence digest", function()
    local r = dir .. "/census.json"
    local out, status = with_state(state, { "conformance", "--only", "credentials", "--receipt", r })
    assert.is_true(status == 0 or status == 1, out)
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out)
    assert.matches("valid +census receipt", out)
    assert.matches("check +cred%.forbidden_env", out)
    local e = envelope(r)
    e.signatures[1].sig = flip(e.signatures[1].sig, 5)
    write_envelope(dir .. "/bad-census.json", e)
    out, status = with_state(state, { "verify", dir .. "/bad-census.json" })
    assert.are.equal(1, status, out)
  end)

  it("bad input is a usage error naming the argument, and leaves nothing", function()
    local out, status = with_state(state, { "verify", dir .. "/missing.json" })
    assert.are.equal(2, status, out)
    assert.matches("FILE: .*missing.json", out)
    h.write(dir .. "/text", "not json at all")
    out, status = with_state(state, { "verify", dir .. "/text" })
    assert.are.equal(2, status, out)
    assert.matches("FILE: .*not JSON", out)
    h.write(dir .. "/other-type.json", '{"payloadType":"text/plain","payload":"","signatures":[]}')
    out, status = with_state(state, { "verify", dir .. "/other-type.json" })
    assert.are.equal(2, status, out)
    assert.matches("FILE: .*payloadType text/plain", out)
    out, status = with_state(state, { "verify", dir .. "/run.json", "--key", dir .. "/nope.pub" })
    assert.are.equal(2, status, out)
    assert.matches("%-%-key", out)
    out, status = with_state(state, { "run", "--receipt", dir .. "/no/such/dir/r.json", "--", "true" })
    assert.are.equal(2, status, out)
    assert.matches("%-%-receipt", out)
    assert.is_nil(io.open(dir .. "/no"))
    -- an empty --receipt is refused before the command runs, not found unwritable after it
    out, status = with_state(state, { "run", "--receipt", "", "--", "sh", "-c", "echo ran; touch /tmp/ran" })
    assert.are.equal(2, status, out)
    assert.matches("%-%-receipt: empty", out)
    assert.is_nil(out:find("ran", 1, true), out)
    -- control: the same run with a writable path writes a receipt that verifies
    out, status = with_state(state, { "run", "--receipt", dir .. "/ok.json", "--", "true" })
    assert.are.equal(0, status, out)
    out, status = with_state(state, { "verify", dir .. "/ok.json" })
    assert.are.equal(0, status, out)
  end)

  it("verify reads only a regular file, bounded, as FILE and as --key: never another key in --key's place, " ..
    "never a hang; control: the key's own file", function()
    local r = dir .. "/bounded.json"
    local out, status = with_state(state, { "run", "--receipt", r, "--", "true" })
    assert.are.equal(0, status, out)
    local fifo = dir .. "/fifo"
    h.must("mkfifo " .. h.quote(fifo))
    -- each would have been read as no key at all (then the caller's own key verifies it),
    -- or forever (a FIFO's open waits for a writer; /dev/zero has no end)
    for _, key in ipairs({ dir, fifo, "/dev/zero" }) do
      out, status = with_state(state, { "verify", r, "--key", key })
      assert.are.equal(2, status, key .. ": " .. out)
      assert.truthy(out:find("invalid_argument: --key: " .. key .. ": not a regular file", 1, true), out)
    end
    for _, file in ipairs({ dir, fifo, "/dev/zero" }) do
      out, status = with_state(state, { "verify", file })
      assert.are.equal(2, status, file .. ": " .. out)
      assert.truthy(out:find("invalid_argument: FILE: " .. file .. ": not a regular file", 1, true), out)
    end
    h.must("truncate -s 17M " .. h.quote(dir .. "/huge.json"))
    out, status = with_state(state, { "verify", dir .. "/huge.json" })
    assert.are.equal(2, status, out)
    assert.matches("larger than 16777216 bytes", out)
    -- control: the public key printed by corral key, in a file of its own
    h.write(dir .. "/own.pub", with_state(state, { "key" }):match("%-%-%-%-%-BEGIN.-END PUBLIC KEY%-%-%-%-%-\n"))
    out, status = with_state(state, { "verify", r, "--key", dir .. "/own.pub" })
    assert.are.equal(0, status, out)
  end)
end)

-- Payload changed by `change` (Lua over `st`, the Statement) and signed again with the
-- same key: only the verifier's own checks can tell.
local RESIGN = [[
  local j = require "corral.json"
  local key = require "corral.receipt.key"
  local env = j.decode(io.open(arg[1]):read("a"))
  local st = j.decode(key.module().b64decode(env.payload))
  assert(load("local st = ...; " .. arg[3]))(st)
  local dsse = require "corral.receipt.dsse"
  local f = io.open(arg[2], "w")
  f:write(dsse.encode(assert(dsse.seal(st, assert(key.load())))))
  f:close()]]

local function sha256_of(text)
  local out = h.sh('printf %s "$1" | sha256sum', text)
  return out:match("^(%x+)")
end

describe("corral receipts against a forger (issue 23)", function()
  local dir, state

  setup(function()
    dir = h.tmpdir("receipts-forger")
    state = dir .. "/state"
    h.write(dir .. "/resign.lua", RESIGN)
  end)

  teardown(function() h.rmrf(dir) end)

  local function resign(from, to, change)
    local out, status = with_state(state, { dir .. "/resign.lua", from, to, change })
    assert.are.equal(0, status, out)
  end

  -- The receipt at from, changed by change and signed again, is refused saying why.
  local function refused(from, change, why)
    local bad = dir .. "/resigned.json"
    resign(from, bad, change)
    local out, status = with_state(state, { "verify", bad })
    assert.are.equal(1, status, change .. ": " .. out)
    assert.matches(why, out)
    assert.is_nil(out:find("nil", 1, true), out)
  end

  it("verify escapes what argv says: no forged line, no hidden one; the real exit is shown (control)", function()
    local r = dir .. "/forged.json"
    local out, status = with_state(state, { "run", "--receipt", r, "--", "sh", "-c", "exit 3",
      "x\nexit        0 (exited)\n\27[8m" })
    assert.are.equal(3, status, out)
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out)
    assert.is_nil(out:find("\nexit +0 %(exited%)"), out) -- the attempt: a line of argv's own
    assert.is_nil(out:find("\27", 1, true), out)
    assert.matches("command +sh %-c exit 3 x\\nexit        0 %(exited%)\\n\\x1b%[8m\n", out)
    assert.matches("\nexit +3 %(exited%)\n", out) -- control: the real one
  end)

  it("the policy carries --resolve's addresses: two identical runs commit alike, another address not", function()
    local storage = dir .. "/storage"
    h.sh("mkdir -p " .. h.quote(storage))
    local function commit(name, addr)
      local r = dir .. "/" .. name .. ".json"
      local out, status = with_state(state, { "run", "--receipt", r, "--storage", storage, "--allow", "a.test:443",
        "--resolve", "a.test=" .. addr, "--", "true" })
      assert.are.equal(0, status, out)
      local canon = with_state(state, { "policy", "--canonical", r })
      return canon, sha256_of(canon)
    end
    local canon1, c1 = commit("resolve1", "127.0.0.1")
    local _, c2 = commit("resolve2", "127.0.0.1")
    assert.is_nil(canon1:find("table: ", 1, true), canon1)
    assert.matches('"resolve":%["a%.test=127%.0%.0%.1"%]', canon1)
    assert.are.equal(c1, c2)
    local _, c3 = commit("resolve3", "127.0.0.2") -- control: the commitment does see the address
    assert.are_not.equal(c1, c3)
  end)

  it("the signed root plan binds the tenant's own name files, each with the digest of what it reads", function()
    local r = dir .. "/names.json"
    local files = { "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf" }
    local out, status = with_state(state, { "run", "--receipt", r, "--", "sha256sum", table.unpack(files) })
    assert.are.equal(0, status, out)
    local read = {}
    for sum, path in out:gmatch("(%x+)  (%S+)") do read[path] = sum end
    h.write(dir .. "/names.b64", envelope(r).payload)
    local st = assert(json.decode(h.sh("base64 -d < " .. h.quote(dir .. "/names.b64"))))
    local bound = {}
    for _, m in ipairs(st.predicate.policy.root_plan.mounts) do
      if m.own then bound[m.dest] = m end
    end
    for _, f in ipairs(files) do
      assert.is_truthy(read[f], out)
      assert.is_truthy(bound[f], f .. " is not in the signed root plan")
      assert.are.equal(read[f], bound[f].sha256, f)
      assert.are.equal("the sandbox's own", bound[f].src)
    end
    out, status = with_state(state, { "verify", r })
    assert.are.equal(0, status, out)
    assert.matches("/etc/hosts its own %(sha256 " .. read["/etc/hosts"] .. "%)", out)
  end)

  it("verify refuses trailing data, an unknown kind, a subject or a restated field that differs, " ..
    "says missing not nil; the receipt as written verifies (control)", function()
    local r, bad = dir .. "/strict.json", dir .. "/strict-bad.json"
    local out, status = with_state(state, { "run", "--receipt", r, "--", "true" })
    assert.are.equal(0, status, out)
    -- trailing data after the envelope
    h.write(bad, h.read(r) .. "{}\n")
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(2, status, out)
    assert.matches("data after the envelope", out)
    local cases = {
      { 'st.predicate.kind = "bogus"', "INVALID.*payload: kind bogus" },
      { 'st.predicate.argv = {"rm", "-rf", "/"}', "INVALID.*payload: subject argv has digest" },
      { 'st.subject[1].name = "stdout"', "INVALID.*payload: subject stdout is not one a run receipt has" },
      { 'st.predicate.mechanism = "bwrap"', "INVALID.*policy: mechanism bwrap is not the committed policy's %(native" },
      { "st.predicate.commitment = nil", "INVALID.*policy: the commitment missing is not" },
    }
    for _, c in ipairs(cases) do refused(r, c[1], c[2]) end
    h.write(bad, '{"payload":"","signatures":[]}')
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(2, status, out)
    assert.matches("payloadType missing", out)
    -- control: unchanged, resigned, the receipt verifies
    resign(r, bad, "")
    out, status = with_state(state, { "verify", bad })
    assert.are.equal(0, status, out)
    assert.matches("valid +run receipt", out)
  end)

  it("a step's receipt: its argv subject and its tier are checked against what is committed", function()
    local r, grants = dir .. "/step.json", dir .. "/grants.lua"
    h.write(grants, 'return { read = {"/etc"}, exec = {"/bin/cat", "/usr/bin/cat"} }')
    assert.are.equal(0, select(2, with_state(state, { "step", "--grants", grants, "--receipt", r, "--", "cat",
      "/etc/hostname" })))
    refused(r, 'st.predicate.argv = {"cat", "/etc/shadow"}', "INVALID.*subject argv has digest")
    refused(r, 'st.predicate.tier = "S2"', "INVALID.*policy: tier S2 is not the committed policy's")
    refused(r, 'st.predicate.mechanism = "none"', "INVALID.*policy: mechanism none")
    local out, status = with_state(state, { "verify", r }) -- control
    assert.are.equal(0, status, out)
  end)

  it("corral key refuses a directory others may write to and a symbolic link as the key; " ..
    "then accepts them made private (control)", function()
    local open = dir .. "/open"
    h.sh("mkdir -m 777 " .. h.quote(open))
    local out, status = with_state(open, { "key" })
    assert.are.equal(3, status, out)
    assert.matches("mode 777: others may replace the key", out)
    local linked = dir .. "/linked"
    h.sh("mkdir -m 700 " .. h.quote(linked))
    out, status = with_state(dir .. "/real", { "key" })
    assert.are.equal(0, status, out)
    h.sh("ln -s " .. h.quote(dir .. "/real/key") .. " " .. h.quote(linked .. "/key"))
    out, status = with_state(linked, { "key" })
    assert.are.equal(3, status, out)
    assert.matches("key is a symbolic link", out)
    -- control: the same directories, private and with no link
    h.sh("chmod 700 " .. h.quote(open) .. " && rm " .. h.quote(linked .. "/key"))
    out, status = with_state(open, { "key" })
    assert.are.equal(0, status, out)
    out, status = with_state(linked, { "key" })
    assert.are.equal(0, status, out)
  end)

  it("corral key says a missing $HOME is missing (not Permission denied)", function()
    if h.sh("id -u"):match("^(%d+)") ~= "0" or not h.sh("command -v setpriv"):match("setpriv") then
      return pending("needs root and setpriv to run as uid 65534")
    end
    local home = dir .. "/home"
    h.sh("mkdir -m 700 " .. h.quote(home) .. " && chown 65534:65534 " .. h.quote(home) .. " && chmod 755 " ..
      h.quote(dir))
    local function as_nobody(home_dir)
      return h.capture({ "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-u",
        "CORRAL_STATE_DIR", "-u", "XDG_STATE_HOME", "HOME=" .. home_dir, h.host, "key" })
    end
    local out, status = as_nobody("/nonexistent")
    assert.are.equal(3, status, out)
    assert.matches("%$HOME %(/nonexistent%) does not exist", out)
    assert.is_nil(out:find("Permission denied", 1, true), out)
    out, status = as_nobody(home) -- control
    assert.are.equal(0, status, out)
  end)
end)

describe("the host key #root", function()
  it("is not readable by a tenant; the host reads it (control)", function()
    if h.sh("id -u"):match("^(%d+)") ~= "0" then return pending("root's key is /var/lib/corral/key") end
    -- the default location, as every root run uses it
    local out, status = h.capture({ "env", "-u", "CORRAL_STATE_DIR", h.host, "key" })
    assert.are.equal(0, status, out)
    local path = assert(out:match("private key (%S+)"))
    assert.are.equal("/var/lib/corral/key", path)
    out, status = h.capture({ "env", "-u", "CORRAL_STATE_DIR", h.host, "run", "--", "sh", "-c",
      "cat " .. path .. " && echo READ; ls -d /var/lib/corral 2>&1; echo ATTEMPTED" })
    assert.are.equal(0, status, out)
    assert.matches("ATTEMPTED", out, 1, true)
    assert.is_nil(out:find("PRIVATE KEY", 1, true), out)
    assert.is_nil(out:find("READ\n", 1, true), out)
    -- control, after the attempt: the host reads it
    local f = assert(io.open(path))
    assert.matches("BEGIN PRIVATE KEY", f:read("a"), 1, true)
    f:close()
  end)
end)
