--- `corral conformance`: one row per check, the census per group, the run's time last.
--
-- Exit status: 0 nothing breached, 1 something breached, 2 bad usage.
-- @module corral.conformance.cli
local M = {}

M.USAGE = [[corral conformance [--mechanism native|bwrap|oci|FILE.lua] [--session] [--runtime PATH]
  [--only GROUP] [--json] [--receipt FILE]

Runs every conformance check against the mechanism (default native): one breach
attempted from inside a sandbox, then a control in the same sandbox. Each check is
held, breached, unavailable (with the reason) or void (the control failed). Groups:
filesystem credentials process privilege resources network egress cross_sandbox.
Exits 1 when anything is breached. Ctrl-C, SIGTERM or SIGHUP end the running check
through its tear-down (its sandboxes, targets and scratch removed) and exit 128+N.
--receipt FILE writes the census as a signed receipt (each check's outcome and the
digest of its evidence; docs/receipts.md), which `corral verify FILE` checks.
--session runs every command of every check as `corral exec` runs it: exec'd into a
live sandbox (its waiting init already there) instead of a sandbox of its own, so the
census is that of exec'd processes (native and bwrap; docs/sessions.md).
--runtime PATH (with --mechanism oci) runs each container under the OCI runtime PATH
(podman --runtime PATH), an egress allowlist handed to it as corral.dev/ annotations:
with corral-runtime, the egress group is its keepers' planes (docs/kubernetes.md).]]

--- The flags `corral conformance` accepts (corral.cli.parse's spec).
M.SPEC = { mechanism = "value", only = "value", json = "flag", receipt = "value", session = "flag",
           runtime = "value" }

-- The mechanism the suite runs against: its name, or with --session that mechanism with
-- every command exec'd into a live sandbox (corral.mechanism.session).
local function mechanism_of(opts)
  local name = opts.mechanism or "native"
  if not opts.session then return name end
  local errors = require "corral.errors"
  local base, err = require("corral.mechanism").load(name)
  if not base then return nil, err end
  local mech, werr = require("corral.mechanism.session").wrap(base)
  if not mech then return nil, errors.invalid_argument("--session", werr.detail .. ", not " .. name) end
  return mech
end

-- --runtime PATH: oci's podman runs its containers under PATH; nil, or an error naming the flag.
local function use_runtime(opts)
  local errors = require "corral.errors"
  if (opts.mechanism or "native") ~= "oci" then
    return errors.invalid_argument("--runtime", "only with --mechanism oci (podman runs the containers under it)")
  end
  local core = require "corral.core"
  local path = opts.runtime:find("/", 1, true) and opts.runtime or core.path.resolve_executable(opts.runtime)
  -- the path given is kept (corral-runtime is a link to the host, which acts on the name it
  -- was called by); the resolver says whether it leads to an executable file
  local real = path and core.path.resolve_executable(path)
  local st = real and core.fs.lstat(real)
  if not (st and st.type == "file" and st.mode & tonumber("111", 8) ~= 0) then
    return errors.invalid_argument("--runtime", tostring(opts.runtime) .. ": not an executable file")
  end
  require("corral.mechanism.oci").config.runtime = path
end

-- The census as a signed receipt: every check's outcome and its evidence's digest (the
-- SHA-256 of the result's canonical JSON, which --json prints whole).
local function seal_census(prepared, report, opts, started)
  local receipts = require "corral.receipt"
  local json = require "corral.json"
  local checks = {}
  for _, r in ipairs(report.results) do
    checks[#checks + 1] = { id = r.id, outcome = r.outcome,
                            evidence = "sha256:" .. receipts.subject("", json.encode(r)).digest.sha256 }
  end
  local pred = { mechanism = report.mechanism, census = report.census, checks = checks,
    policy = { mechanism = report.mechanism, only = opts.only or "all", suite = #checks },
    started = receipts.time(started), ended = receipts.time(receipts.now()) }
  return receipts.write(prepared, receipts.statement("census",
    { receipts.subject("census", json.encode(checks)) }, pred))
end

local function census_lines(report, groups)
  local lines = {}
  for _, g in ipairs(groups) do
    local c = report.census.groups[g]
    if c then
      lines[#lines + 1] = string.format("  %-14s held %2d of %2d  (breached %d, unavailable %d, void %d)", g, c.held,
        c.total, c.breached, c.unavailable, c.void)
    end
  end
  local c = report.census
  lines[#lines + 1] = string.format("  %-14s held %2d of %2d  (breached %d, unavailable %d, void %d)", "overall",
    c.held, c.total, c.breached, c.unavailable, c.void)
  return lines
end

--- Prints a report as the CLI does (to `out`, default io.stdout).
function M.print(report, out)
  out = out or io.stdout
  out:write(string.format("%-22s %-11s %s\n", "check", "outcome", "attempted / control (or reason)"))
  for _, r in ipairs(report.results) do
    out:write(string.format("%-22s %-11s %s\n%-34s %s\n", r.id, r.outcome, r.attempt or "", "",
      r.outcome == "held" and ("control: " .. (r.detail ~= "" and r.detail or (r.control or ""))) or r.detail))
  end
  M.print_census(report, out)
end

--- Prints a report's census per group and overall, then the run's time.
function M.print_census(report, out)
  out = out or io.stdout
  out:write("\ncensus of ", tostring(report.mechanism), ":\n")
  for _, l in ipairs(census_lines(report, require("corral.conformance").GROUPS)) do out:write(l, "\n") end
  out:write(string.format("suite against %s: %.1f s\n", tostring(report.mechanism), report.seconds))
end

--- Runs the command. `cli` is corral.cli (its option parser and failure printer).
-- @treturn integer exit status
function M.run(argv, cli)
  local errors = require "corral.errors"
  for _, a in ipairs(argv) do
    if a == "--help" or a == "-h" then
      io.write(M.USAGE, "\n")
      return 0
    end
  end
  local opts, rest = cli.parse(argv, M.SPEC)
  if not opts then return cli.fail("conformance", rest) end
  if #rest > 0 then
    return cli.fail("conformance", errors.invalid_argument(rest[1], "unexpected argument"))
  end
  if opts.runtime then
    local rerr = use_runtime(opts)
    if rerr then return cli.fail("conformance", rerr) end
  end
  local prepared, started
  if opts.receipt then
    local perr
    prepared, perr = require("corral.receipt").prepare(opts.receipt)
    if not prepared then
      if errors.is(perr, "invalid_argument") then perr = errors.invalid_argument("--receipt", perr.detail) end
      return cli.fail("conformance", perr)
    end
    started = require("corral.receipt").now()
  end
  -- the run's errors name Lua fields (group, mechanism); the user typed a flag
  local FLAG = { group = "--only", mechanism = "--mechanism" }
  -- held while the suite runs, so that a signal ends the running check through its
  -- tear-down (sandboxes, targets, scratch) instead of killing the host mid-way
  local core = require "corral.core"
  local STOP = { "INT", "TERM", "HUP" }
  local held = core.signal.fd(STOP)
  local mech, merr = mechanism_of(opts)
  if not mech then
    if held then
      held:close()
      core.signal.unblock(STOP)
    end
    return cli.fail("conformance", merr)
  end
  local report, err = require("corral.conformance").run(mech, {
    only = opts.only,
    signals = held,
    progress = function(r, i, n)
      io.stderr:write(string.format("[%d/%d] %-22s %s\n", i, n, r.id, r.outcome))
    end,
  })
  if held then
    held:close()
    core.signal.unblock(STOP)
  end
  if report and report.stopped then
    io.stderr:write(string.format("corral conformance: stopped by signal %d after %d of %d checks; the one it " ..
      "interrupted was torn down and not reported\n", report.stopped, #report.results, report.planned))
    return 128 + report.stopped
  end
  if not report then
    local arg = type(err) == "table" and err.argument
    if arg and FLAG[arg] then err = errors.invalid_argument(FLAG[arg], err.detail) end
    return cli.fail("conformance", err)
  end
  if prepared then
    local ok, serr = seal_census(prepared, report, opts, started)
    if not ok then return cli.fail("conformance", "--receipt: not written: " .. tostring(serr)) end
  end
  if opts.json then
    io.write(cli.json().encode(report), "\n")
  else
    M.print(report)
  end
  return report.census.breached > 0 and 1 or 0
end

return M
