--- `corral step`: one step at the highest tier this host earns, and its receipt.
--
-- Registered by corral.cli; nothing heavy is required until the command runs.
-- @module corral.tier.cli
local errors = require "corral.errors"

local M = {}

--- The usage text.
M.USAGE = [[corral step --grants FILE.lua [--tier S1] [--timeout SECONDS] [--json] [--receipts FILE]
            [--receipt FILE] [--output-digest] -- CMD ARGS...
corral step --s2 FILE.lua [--grants FILE.lua] [--fuel N] [--memory BYTES] [--timeout SECONDS]
            [--json] [--receipts FILE] [--receipt FILE]

Runs CMD under the grants in FILE.lua (a Lua file returning {read = {paths}, write =
{paths}, exec = {paths}, net = false|true|{"api.test:443", ...}, subprocess =
false|true, env = {names}, clock = true, random = true}; whatever it does not grant is
denied; an allowlist has the grammar of `corral run --allow` and runs behind the egress
plane) at the highest
tier the host earns by probe: S1 (Landlock + seccomp) where the probe holds, else S0
(a bare child, and the receipt says so; --tier S1 refuses instead). Grants withholding
the clock or randomness are refused: a native process cannot lose them. --s2 runs the
Lua in FILE.lua at S2: a fresh Lua state with --fuel instructions (default 1e8) and a
--memory cap (default 64 MiB), in a child confined at S1; the code may read files
granted `read` through read_file(path). Prints the receipt after the command's output;
--json prints it as one JSON line, the only thing on stdout (the command's stdout goes
to stderr, so `| jq` reads the receipt); --receipts appends that line to FILE and leaves
the command's stdout where it was; --receipt writes a signed receipt of the step to FILE
(docs/receipts.md; `corral verify FILE` checks it); with --output-digest the command's
standard output, passed on whole once it ends, is a second subject of that receipt.
Exit: the command's status (S2: 0 when the code returned, 1 when it was stopped),
the receipt's `exit`;
2 an invalid argument; 3 a protection this host cannot enforce.]]

--- The flags `corral step` accepts (corral.cli.parse's spec).
M.SPEC = { grants = "value", s2 = "value", json = "flag", receipts = "value", tier = "value", timeout = "value",
  fuel = "value", memory = "value", receipt = "value", ["output-digest"] = "flag" }

-- The signed receipt of a step (corral.receipt): the step's own receipt, its times, and
-- its policy's canonical serialisation, which the commitment covers.
-- With --output-digest, the command's standard output is a second subject ("stdout").
local function seal_step(prepared, rec, started, subject, output)
  local receipts = require "corral.receipt"
  local canonical = require("corral.tier.receipt").canonical_of[rec]
  local pred = { argv = rec.cmd, tier = rec.tier, mechanism = rec.mechanism, commitment = rec.commitment,
    policy = { canonical = canonical }, exit = rec.exit, started = receipts.time(started),
    ended = receipts.time(receipts.now()), step = receipts.as_carried(rec),
    output = output and { bytes = #output } or nil }
  local subjects = { subject }
  if output then subjects[2] = receipts.subject("stdout", output) end
  return receipts.write(prepared, receipts.statement("step", subjects, pred))
end

-- The command's standard output, held in an unnamed file while it runs, then passed on
-- to `to` whole and returned, so that its digest covers exactly what the reader got.
local function pass_on(held, to)
  held:seek("set")
  local text = held:read("a") or ""
  held:close()
  to:write(text)
  to:flush()
  return text
end

-- Names the CLI flag a refusal came from.
local function as_flag(err, flag)
  if not errors.is(err) then return err end
  local what = err.capability or err.argument
  local named = (what and what ~= flag) and (flag .. " " .. what) or flag
  -- `resource`: what ran out, which a resource error's text names
  if err.capability then
    return errors.new(err.code, { capability = named, detail = err.detail, resource = err.resource })
  end
  return errors.new(err.code, { argument = named, detail = err.detail, resource = err.resource })
end

local function load_grants(path)
  if not path then return {} end
  local chunk, err = loadfile(path, "t", {})
  if not chunk then return nil, errors.invalid_argument("--grants", tostring(err)) end
  local ok, grants = pcall(chunk)
  if not ok or type(grants) ~= "table" then
    return nil, errors.invalid_argument("--grants", path .. ": must return a table of grants" ..
      (ok and "" or (" (" .. tostring(grants) .. ")")))
  end
  return grants
end

local function probe_line(p)
  local parts = { "control " .. (p.control and "succeeded" or "failed") }
  for _, a in ipairs(p.attempts or {}) do
    parts[#parts + 1] = string.format("%s %s%s, control after %s", a.attempt, a.denied and "denied" or "NOT denied",
      a.errno and (" (" .. a.errno .. ")") or "", a.control_after and "ok" or "failed")
  end
  return table.concat(parts, "; ")
end

local function print_receipt(rec)
  local function row(k, v) io.write(string.format("%-11s %s\n", k, tostring(v))) end
  row("tier", rec.tier)
  row("mechanism", rec.mechanism or "none")
  row("commitment", rec.commitment)
  if rec.cmd then row("cmd", table.concat(rec.cmd, " ")) end
  row("exit", rec.exit)
  if rec.failure then row("stopped", rec.failure.kind .. ": " .. tostring(rec.failure.message)) end
  if rec.s2 then
    row("fuel", string.format("%s of %d", tostring(rec.s2.fuel_used), rec.s2.fuel))
    row("memory", string.format("peak %s of %d bytes", tostring(rec.s2.memory_peak), rec.s2.memory))
  end
  row("wall_s", string.format("%.6f", rec.wall_s))
  row("cpu_s", string.format("%.6f", rec.cpu_s))
  row("max_rss", tostring(rec.max_rss) .. " KiB")
  row("energy", string.format("%.6f J (%s: %s)", rec.energy.joules, rec.energy.method, rec.energy.model))
  row("probe", probe_line(rec.probe))
  for i, r in ipairs(rec.residue) do row(i == 1 and "residue" or "", r) end
end

local function number_opt(opts, name)
  if not opts[name] then return nil end
  local v = tonumber(opts[name])
  if not v then return nil, errors.invalid_argument("--" .. name, "must be a number") end
  return v
end

--- Runs `corral step`.
-- @tparam {string,...} argv `argv[1]` is "step"
-- @tparam function parse corral.cli.parse
-- @tparam function fail corral.cli's refusal printer (returns the exit status)
-- @treturn integer exit status
function M.run(argv, parse, fail)
  local opts, rest = parse(argv, M.SPEC)
  if not opts then return fail("step", rest) end
  local grants, gerr = load_grants(opts.grants)
  if not grants then return fail("step", gerr) end
  if opts.tier and opts.tier ~= "S1" then
    return fail("step", errors.invalid_argument("--tier", "only S1 can be required (S2 is --s2)"))
  end
  local values = {}
  for _, name in ipairs({ "timeout", "fuel", "memory" }) do
    local v, err = number_opt(opts, name)
    if err then return fail("step", err) end
    values[name] = v
  end
  local prepared, started
  if opts.receipt then
    local perr
    prepared, perr = require("corral.receipt").prepare(opts.receipt)
    if not prepared then return fail("step", as_flag(perr, "--receipt")) end
    started = require("corral.receipt").now()
  end
  if opts["output-digest"] and not (prepared and not opts.s2) then
    return fail("step", errors.invalid_argument("--output-digest", opts.s2
      and "digests a command's output; an S2 step's result is in its receipt already"
      or "needs --receipt FILE: the digest is part of the signed receipt"))
  end
  local tier = require "corral.tier"
  local result, rec, subject, output
  if opts.s2 then
    if #rest > 0 then return fail("step", errors.invalid_argument("--s2", "takes a Lua file, not a command")) end
    local f, ferr = io.open(opts.s2)
    if not f then return fail("step", errors.invalid_argument("--s2", tostring(ferr))) end
    local code = f:read("a")
    f:close()
    subject = require("corral.receipt").subject("s2 code", code)
    result, rec = tier.s2({ code = code, grants = grants, fuel = values.fuel, memory = values.memory,
      timeout = values.timeout })
  else
    if not opts.grants then
      return fail("step", errors.invalid_argument("--grants", "a grants file is required (or --s2 FILE.lua)"))
    end
    if #rest == 0 then return fail("step", errors.invalid_argument("CMD", "missing (after --)")) end
    if prepared then subject = require("corral.receipt").subject("argv", require("corral.json").encode(rest)) end
    io.stdout:flush()
    -- with --json, stdout carries the receipt alone (`| jq` reads one document), so the
    -- command's stdout goes where its stderr goes
    local out_to = opts.json and io.stderr or io.stdout
    local held = opts["output-digest"] and assert(io.tmpfile())
    result, rec = tier.step({ cmd = rest, grants = grants, min_tier = opts.tier, timeout = values.timeout,
      stdout = held or (opts.json and io.stderr or nil) })
    if held then output = pass_on(held, out_to) end
  end
  if not result then
    local from = errors.is(rec) and (rec.argument or rec.capability) or ""
    local flag = ({ fuel = "--fuel", memory = "--memory", code = "--s2", cmd = "CMD", receipts = "--receipts",
      ["tier S1"] = "--tier", ["tier S2"] = "--s2" })[from] or "--grants"
    return fail("step", as_flag(rec, flag))
  end
  if opts.s2 and result.ok then
    -- a JSON array, nil as null, so that positions survive
    local json = require "corral.json"
    rec.result = setmetatable({}, { __jsontype = "array" })
    for i = 1, result.values.n do
      local v = result.values[i]
      if v == nil then v = json.null end
      rec.result[i] = v
    end
  end
  if opts.receipts then
    local ok, aerr = require("corral.tier.receipt").append(rec, opts.receipts)
    if not ok then return fail("step", errors.invalid_argument("--receipts", tostring(aerr))) end
  end
  if prepared then
    local ok, serr = seal_step(prepared, rec, started, subject, output)
    if not ok then return fail("step", "--receipt: not written: " .. tostring(serr)) end
  end
  if opts.json then
    io.write(require("corral.tier.receipt").encode(rec), "\n")
  else
    if opts.s2 and result.ok then
      local shown = {}
      for i = 1, result.values.n do shown[i] = tostring(result.values[i]) end
      io.write(string.format("%-11s %s\n", "result", table.concat(shown, ", ")))
    end
    print_receipt(rec)
  end
  return rec.exit
end

return M
