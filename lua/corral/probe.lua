--- The capability probe: each capability is established by doing it.
--
-- A probe runs a control that must succeed and the breach that must be denied, under
-- the same set-up (docs/architecture.md, invariant 2). Results are cached per process,
-- and those that hold for the boot and host state (corral.probe_cache).
-- @module corral.probe
local core = require "corral.core"
local errors = require "corral.errors"
local leftovers = require "corral.leftovers"
local probe_cache = require "corral.probe_cache"
local probe_child = require "corral.probe_child"
local shell = require "corral.shell"
local transient = require "corral.transient"

local M = {}

local cache = {}
local check -- (name, signals) → result; M.check's body
local swept = false -- whether this process has swept the scratch of dead ones
local SCRATCH_PREFIX = "corral-probe-" -- probe_child's scratch (corral.leftovers)
-- what the probe cache held when this process first asked (nil: not read yet)
local kept

--- Removes the scratch directories (`corral-probe-<pid>-*`) of probing processes that are
-- gone: a probe SIGKILLed mid-way (a `corral run` killed in its gate) leaves its own.
-- @tparam[opt] string dir where to look (default: $TMPDIR, or /tmp)
-- @treturn integer how many were removed
function M.sweep(dir)
  return leftovers.sweep_own(dir or leftovers.base(), SCRATCH_PREFIX)
end

-- A write past the cap of the probe's disk, then the control in the same sandbox: room
-- made, a small file written and read back.
local DISK_SCRIPT = [[
dd if=/dev/zero of=/storage/fill bs=1M count=16 2>&1; echo "attempt=$?"
rm -f /storage/fill
echo control > /storage/control && read -r got < /storage/control && [ "$got" = control ] && echo control-ok]]

local function trim(s) return (tostring(s or ""):gsub("%s+$", "")) end

-- A child's words: its output, or why it did not start (probe_child.tenant's nil, why).
local function said(out, why)
  if out == nil then return "spawn failed: " .. tostring(why) end
  return trim(out)
end

-- What ran out when a probe did not hold for it (corral.transient): its child's spawn,
-- end or output (`noted`), or the system's text in its detail; never a breach, which
-- is a verdict. Such a probe is "not known", not "absent".
local function unknown_because(noted, detail)
  detail = tostring(detail)
  if detail:find("^breach") then return nil end
  return noted or transient.of(detail)
end

local probes = {
  {
    name = "filesystem_confinement",
    gates = { "native", "bwrap" },
    run = function()
      return probe_child.with_scratch(function(dir)
        core.fs.chmod(dir, tonumber("755", 8))
        for _, sub in ipairs({ "a", "b" }) do
          assert(core.fs.mkdir(dir .. "/" .. sub, tonumber("755", 8)))
          local f = assert(io.open(dir .. "/" .. sub .. "/f", "w"))
          f:write(sub == "a" and "own\n" or "sibling\n")
          f:close()
          core.fs.chmod(dir .. "/" .. sub .. "/f", tonumber("644", 8))
        end
        local out, code = probe_child.tenant({ "/bin/sh", "-c",
          'cat /storage/f || exit 10; if cat "$1/b/f" 2>/dev/null || ls "$1" 2>/dev/null; then exit 11; fi',
          "sh", dir }, { binds = { { src = dir .. "/a", dest = "/storage", rw = true } } })
        if code == 0 then return true, "a confined child read its own storage; a sibling's was absent" end
        if code == 10 then return false, "control failed: the child could not read its own storage: " .. trim(out) end
        if code == 11 then return false, "breach: the sibling's storage was readable" end
        return false, "child failed: " .. (out and trim(out) .. " (" .. tostring(code) .. ")" or said(out, code))
      end)
    end,
  },
  {
    name = "network_restriction",
    gates = { "native", "bwrap" },
    run = function()
      local lfd, port = core.sock.listen("127.0.0.1", 0)
      if not lfd then return false, "cannot listen on loopback: " .. tostring(port) end
      local c, cerr = core.sock.connect("127.0.0.1", port, 2)
      if not c then lfd:close(); return false, "control failed: the host cannot reach its own listener: " .. cerr end
      c:close()
      local host = core.proc.host_executable()
      if not host then lfd:close(); return false, "the corral executable was not found for the child" end
      -- the child is corral itself, so the attempt needs no client program inside
      local out, code = probe_child.tenant({ host, "-e", string.format(
        "local fd = require('corral.core').sock.connect('127.0.0.1', %d, 1) os.exit(fd and 11 or 0)", port) },
        { binds = { { src = host, dest = host } } })
      lfd:close()
      if code == 0 then return true, "the host reached its loopback listener; a child in an empty netns could not" end
      if code == 11 then return false, "breach: the child reached the host's loopback listener" end
      return false, "child failed: " .. said(out, code)
    end,
  },
  {
    name = "resource_limits",
    gates = { "native", "bwrap" },
    run = function()
      if not core.cgroup then return false, "no cgroup support in this build" end
      local cg, err = core.cgroup.create({ pids = 6 })
      if not cg then return false, "cannot create a cgroup beneath our own: " .. tostring(err) end
      local procs = {}
      for _, dir in pairs(cg:paths()) do procs[#procs + 1] = dir .. "/cgroup.procs" end
      -- init + sh are 2 of the 6; dash exits when a fork fails, so each success is printed
      -- as it happens
      local out, code = probe_child.tenant({ "/bin/sh", "-c",
        'for i in 1 2 3 4 5 6; do sleep 3 & echo forked; done; kill $(jobs -p) 2>/dev/null' },
        { cgroup_procs = procs })
      cg:destroy()
      if not out then return false, "spawn failed: " .. tostring(code) end
      local _, n = out:gsub("forked", "")
      if n == 0 then return false, "control failed: no fork succeeded under a pids cap of 6" end
      if n >= 6 then return false, "breach: all 6 forks succeeded under a pids cap of 6" end
      local info = core.cgroup.info()
      return true, string.format("pids cap 6: %d forks succeeded, the next failed (cgroup %s)", n,
        info and (info.v2 and not info.v1 and "v2" or "v1") or "?")
    end,
  },
  {
    name = "privilege_separation",
    gates = { "native", "bwrap" },
    run = function()
      local out, code = probe_child.tenant({ "/bin/sh", "-c", [[
        grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
        unshare -U true 2>/dev/null && echo nested-userns-ok; exit 0]] })
      if code ~= 0 then return false, "control failed: the child did not run: " .. said(out, code) end
      local eff, bnd = out:match("CapEff:%s*(%x+)"), out:match("CapBnd:%s*(%x+)")
      local nnp = out:match("NoNewPrivs:%s*(%d)")
      if not eff then return false, "control failed: no status read: " .. trim(out) end
      if tonumber(eff, 16) ~= 0 or tonumber(bnd, 16) ~= 0 or nnp ~= "1" then
        return false, "breach: capabilities or no_new_privs not dropped: " .. trim(out)
      end
      if out:find("nested-userns-ok", 1, true) then
        return false, "breach: the tenant entered a nested user namespace"
      end
      return true, "tenant root holds no capability (CapEff/CapBnd 0, NoNewPrivs 1); nested user namespace refused"
    end,
  },
  {
    name = "disk_quota",
    gates = { "--disk (native, bwrap)" },
    run = function()
      if core.proc.geteuid() ~= 0 then
        return false, "a storage on a disk of its own needs corral to run as root (a loop device and its mount)"
      end
      return probe_child.with_scratch(function(dir)
        local disk = require "corral.disk"
        local path = dir .. "/probe.disk"
        local image, err = core.disk.open(path, disk.MIN_BYTES)
        if not image then return false, tostring(err) end
        local ok, why = disk.format(path, 65534)
        local mount, derr
        if ok then mount, derr = core.disk.attach(image) end
        image:close()
        if not ok or not mount then return false, tostring(why or derr) end
        local tree, terr = core.idmap.tree(mount, nil, { rw = true })
        mount:close() -- the tree holds the filesystem now
        if not tree then return false, tostring(terr) end
        local out, code = probe_child.tenant({ "/bin/sh", "-c", DISK_SCRIPT },
          { binds = { { src = path, dest = "/storage", rw = true, tree = tree } } })
        tree:close()
        if not out then return false, "spawn failed: " .. tostring(code) end
        local filled = out:match("attempt=(%d+)")
        if not filled then return false, "child failed: " .. trim(out) end
        if filled == "0" then return false, "breach: 16 MiB were written into a disk of 8 MiB" end
        if not (out:find("No space left", 1, true) or out:find("quota exceeded", 1, true)) then
          return false, "the write failed, but not for want of room: " .. trim(out)
        end
        -- the control's words only: the attempt's ENOSPC is the verdict, not a host running out
        if not out:find("control-ok", 1, true) then
          return false, "control failed: " .. trim(out:match("attempt=%d+\n(.*)"))
        end
        return true, "a write of 16 MiB into a disk of 8 MiB failed with ENOSPC; a small write then succeeded"
      end)
    end,
  },
  {
    name = "user_namespaces",
    gates = { "native" },
    run = function()
      local out, code = probe_child.tenant({ "/bin/cat", "/proc/self/uid_map", "/proc/self/status" },
        { seccomp = false })
      if not out then return false, "spawn failed: " .. tostring(code) end
      if code ~= 0 then return false, "child failed: " .. said(out, code) end
      local first, outside = out:match("^%s*(%d+)%s+(%d+)%s+%d+")
      local uid = out:match("\nUid:%s*(%d+)")
      if first ~= "0" or outside == "0" or uid ~= "0" then return false, "unexpected mapping: " .. trim(out) end
      return true, "tenant root maps to host uid " .. outside
    end,
  },
  {
    name = "seccomp",
    gates = { "native" },
    run = function()
      local unshare = core.path.resolve_executable("unshare")
      if unshare:sub(1, 1) ~= "/" then return false, "no unshare(1) to attempt the breach with" end
      local argv = { unshare, "-U", "/bin/true" }
      local control, ccode = probe_child.tenant(argv, { seccomp = false })
      local filtered, fcode = probe_child.tenant(argv, { seccomp = true })
      if ccode ~= 0 then
        return false, "control failed: unshare(CLONE_NEWUSER) fails even without the filter: " .. said(control, ccode)
      end
      if fcode == 0 then return false, "breach: the filter let unshare(CLONE_NEWUSER) through" end
      if not (filtered or ""):find("not permitted", 1, true) then
        return false, "the filtered child failed otherwise than EPERM: " .. said(filtered, fcode)
      end
      return true, "without the filter a nested user namespace is created; with it, refused (EPERM)"
    end,
  },
  {
    name = "cgroups",
    gates = { "native" },
    run = function()
      if not core.cgroup then return false, "no cgroup support in this build" end
      local info, err = core.cgroup.info()
      if not info then return false, tostring(err) end
      local cg, cerr = core.cgroup.create({ pids = 16, memory = 64 * 1024 * 1024 })
      if not cg then return false, "cannot create a cgroup beneath our own: " .. tostring(cerr) end
      local ok, derr = cg:destroy()
      if ok == nil and derr then return false, "cannot remove it: " .. tostring(derr) end
      local names = {}
      for k in pairs(info.paths or {}) do names[#names + 1] = k end
      table.sort(names)
      return true, "created and removed beneath our own cgroup (" .. tostring(info.version) .. "): " ..
        table.concat(names, ", ")
    end,
  },
  {
    name = "nftables",
    gates = { "native (egress)" },
    run = function()
      -- the netns a plane of this caller's would get (root: the host's user namespace
      -- owns it; anyone else: a user namespace of the caller's own), made as the plane
      -- makes it, then programmed and attacked from a tenant spawned as a plane's is
      local netns, err, _, owner = require("corral.egress.plane").new_netns()
      if not netns then return false, "cannot create a network namespace: " .. tostring(err) end
      local where = owner == "host" and "" or " (in a user namespace of the caller's own)"
      local plan = { dns_port = 5353, acceptor_port = 15001, mark = core.nft.DEFAULT_MARK }
      local ok
      ok, err = core.nft.apply(netns, plan)
      if ok then ok, err = core.nft.verify(netns, plan) end
      if not ok then
        netns:close()
        return false, "control failed: ruleset not applied and read back: " .. tostring(err)
      end
      -- the breach: a tenant in this netns (root in its own user namespace) flushes the
      -- table; ownership order must make that EPERM (invariant 4)
      local out, code = probe_child.tenant({ "/bin/sh", "-c",
        'command -v nft >/dev/null || exit 20; nft flush ruleset 2>&1 && exit 11; exit 0' },
        { netns = netns })
      local intact = core.nft.verify(netns, plan)
      netns:close()
      if code == 20 then
        return intact and true or false, "ruleset applied and read back" .. where ..
          "; no nft binary to attempt the breach with"
      end
      if code == 11 or not intact then return false, "breach: a tenant flushed the ruleset: " .. trim(out) end
      if code ~= 0 then return false, "child failed: " .. said(out, code) end
      return true, "ruleset applied in one batch and read back" .. where ..
        "; a tenant's `nft flush ruleset` was refused"
    end,
  },
  {
    name = "confinement.namespace",
    gates = { "confine" },
    run = function() return probe_child.layer("ns") end,
  },
  {
    name = "confinement.bwrap",
    gates = { "confine (when the namespace layer is absent)" },
    run = function() return probe_child.layer("bwrap") end,
  },
  {
    name = "confinement.landlock",
    gates = { "confine" },
    run = function()
      local abi, err = core.landlock.abi()
      if not abi then return false, err end
      local ok, detail = probe_child.layer("landlock")
      return ok, string.format("ABI %d; %s", abi, detail), { abi = abi }
    end,
  },
  {
    name = "tier",
    gates = { "step" },
    run = function()
      local e = require("corral.tier").earned()
      return e.tier == "S1", e.tier .. ": " .. tostring(e.detail), { tier = e.tier, mechanism = e.mechanism }
    end,
  },
  {
    name = "bwrap",
    gates = {},
    run = function()
      local out, status = shell.capture({ "bwrap", "--version" })
      if status ~= 0 then return false, "bwrap not runnable: " .. out:gsub("%s+$", "") end
      return true, (out:gsub("%s+$", ""))
    end,
  },
}

--- Runs (once per process) and returns one probe's result.
-- @tparam string name a probe name, e.g. "confinement.landlock"
-- @treturn table `{name =, holds =, detail =, gates =, probed_at =}` (`kept` when read from what
--   an earlier process probed this boot), and `advice` (corral.probe_advice's
--   missing pieces) when it does not hold for a reason a setting would change, or
--   `ran_out` (what ran out, corral.transient) when it is not known: a resource ran out
--   for a moment, and the probe runs again at the next call
function M.check(name)
  return check(name)
end

--- A result as `corral probe` prints it: name, "holds", "absent" or "unknown" (a
-- resource ran out while probing: neither), the detail, when it was kept, what it gates.
-- @tparam table r from `M.check`
-- @treturn string
function M.line(r)
  local verdict, detail = r.holds and "holds" or "absent", tostring(r.detail)
  if r.ran_out then verdict, detail = "unknown", detail .. transient.suffix(r.ran_out) end
  return string.format("%-26s %-7s %s%s%s", r.name, verdict, detail,
    r.kept and os.date(" (probed at %H:%M:%S)", r.probed_at) or "",
    #r.gates > 0 and ("  [gates: " .. table.concat(r.gates, ", ") .. "]") or "")
end

--- The refusal for a result that does not hold: `resource` when it is not known (a
-- resource ran out while probing), else `cannot_enforce` naming the capability.
-- @tparam table result from `M.check`
-- @treturn table|nil nil when it holds
function M.refusal(result)
  if result.holds then return nil end
  if result.ran_out then
    return errors.resource(result.name, "probing " .. result.name .. ": " .. tostring(result.detail), result.ran_out)
  end
  return errors.new("cannot_enforce", { capability = result.name, detail = tostring(result.detail) })
end

-- One probe; with `signals` (a core.signal.fd the caller holds), a signal that arrived
-- while it ran spoils its result (a terminal's Ctrl-C reaches the probe's own children
-- too): `{name =, interrupted = N}` is returned, and nothing is cached or kept.
check = function(name, signals)
  if cache[name] then return cache[name] end
  kept = kept or probe_cache.load()
  if not swept then
    -- once a process, before its first probe or gate: what a killed one left goes
    swept = true
    leftovers.sweep_own_soon(leftovers.base(), SCRATCH_PREFIX)
  end
  for _, p in ipairs(probes) do
    if p.name == name then
      local k = kept[name]
      if k then
        cache[name] = { name = name, holds = true, detail = k.detail, gates = p.gates, extra = k.extra,
                        probed_at = k.at, kept = true }
        return cache[name]
      end
      probe_child.take_ran_out()
      local ok, holds, detail, extra = pcall(p.run)
      local sig = signals and core.signal.read(signals)
      if sig then return { name = name, interrupted = sig, gates = p.gates } end
      if not ok then holds, detail = false, "probe error: " .. tostring(holds) end
      local advice, ran_out = nil, probe_child.take_ran_out()
      if not holds then
        -- What is missing and the setting that provides it (corral.probe_advice).
        local suffix, pieces = require("corral.probe_advice").advice(name)
        if suffix then detail, advice = tostring(detail) .. suffix, pieces end
        ran_out = not advice and unknown_because(ran_out, detail)
      end
      local r = { name = name, holds = holds and true or false, detail = detail, gates = p.gates, extra = extra,
                  advice = advice, ran_out = ran_out or nil, probed_at = os.time() }
      -- not known is not kept, even for this process: the resource may be back
      if ran_out then return r end
      cache[name] = r
      if holds then
        kept[name] = { detail = detail, extra = extra, at = os.time() }
        probe_cache.store(kept)
      end
      return cache[name]
    end
  end
  error("unknown capability probe: " .. tostring(name), 2)
end

--- Runs every probe (cached) and returns the results in a stable order.
-- @tparam[opt] table opts `signals`: a core.signal.fd the caller holds (INT, TERM, HUP);
--   when one arrives, probing stops after the current probe, whose result is dropped
-- @treturn {table,...} the results
-- @treturn[opt] integer the signal that stopped it (the results are those before it)
function M.probe(opts)
  local signals = opts and opts.signals
  local out = {}
  for i, p in ipairs(probes) do
    local r = check(p.name, signals)
    if r.interrupted then return out, r.interrupted end
    out[i] = r
  end
  return out
end

--- The names of every probe.
-- @treturn {string,...}
function M.names()
  local out = {}
  for i, p in ipairs(probes) do out[i] = p.name end
  return out
end

--- Forgets cached results, this process's and the boot's (tests that change the host,
-- and `corral probe --fresh`).
function M.reset()
  cache, kept = {}, {}
  probe_cache.invalidate()
  require("corral.probe_advice").reset()
end

--- An enforcement step failed for a capability a probe said holds: the host changed.
-- Every kept result goes (the next process probes again) and the refusal stands.
-- @tparam string capability what the failed step enforces
-- @tparam[opt] table err the refusal, returned as it is
-- @return err
function M.failed(capability, err)
  if cache[capability] and cache[capability].holds then cache[capability] = nil end
  kept = {}
  probe_cache.invalidate()
  return err
end

return M
