--- macOS sandbox-exec (SBPL) profiles: the runtime read set of the control-plane
-- profile, which `corral.confinement.sandbox_exec_spec` has `core.sbpl.emit` write (deny
-- by default, then the runtime, the boundary and the extras: SBPL applies the last
-- matching rule), and the profile of a tier step. Every path is resolved first: SBPL
-- matches resolved paths, and a grant on a symlink silently never matches.
-- @module corral.sbpl
local core = require "corral.core"
local errors = require "corral.errors"

local M = {}

-- Generous about the runtime (read-only) while the data boundary stays one path: a
-- deny-default profile that omits the runtime's own reads aborts every process (exit
-- 134), control included. Entries are resolved spellings: /etc, /var and /tmp are links
-- into /private on macOS.
local RUNTIME_READ_PATHS = {
  "/usr/lib",       -- dyld itself and the system dylibs outside the shared cache
  "/usr/libexec",   -- helpers system tools exec (path_helper from /etc/profile, …)
  "/usr/bin",       -- the commands a process runs; exec needs the binary readable
  "/bin",           -- sh, bash, zsh, cat: what scripts and `system()` start
  "/usr/sbin",      -- system commands on the default PATH (sysctl, scutil, …)
  "/sbin",          -- the same, the rest of the default PATH
  "/System",        -- frameworks and the dyld shared cache (/System/Library/dyld since
                    -- macOS 12, NixOS/nix#5888; under /System/Volumes/Preboot/Cryptexes
                    -- since 13): without it nothing links
  "/Library/Apple", -- Apple components kept off the sealed volume (the Rosetta runtime)
  "/private/etc",   -- /etc: passwd, hosts, ssl/cert.pem for TLS egress, shell profiles
  "/private/var/run/resolv.conf", -- /etc/resolv.conf's target: resolvers that read it
                                  -- directly (Go's, c-ares) need it for egress
  "/private/var/db/timezone",     -- /etc/localtime's target: localtime(3)
  "/private/var/db/dyld",         -- the dyld shared cache before macOS 11
  "/private/var/db/xcode_select_link", -- xcrun (behind /usr/bin/git, cc, …) reads it
  "/Library/Developer/CommandLineTools", -- what those /usr/bin shims exec
  "/Library/Preferences", -- system-wide preferences: CFPreferences and the network stack
                          -- read them (Apple's sandbox-violation guide shows networkd
                          -- settings read from here)
  "/usr/share",     -- locale, terminfo, zoneinfo and other read-only data
  "/opt/homebrew",  -- Homebrew on Apple silicon: the interpreters and CLIs users run
  "/usr/local",     -- Homebrew on Intel, and other installers' binaries and libraries
}

--- The runtime read set: directories a confined process may read (never write) to start,
-- link, run the system's commands and reach the network.
-- @treturn {string,...} a fresh list of resolved macOS paths
function M.runtime_read_paths()
  local out = {}
  for i, p in ipairs(RUNTIME_READ_PATHS) do out[i] = p end
  return out
end

-- An SBPL string literal (TinyScheme's reader); a newline or CR refused, as core.sbpl.emit does.
local function literal(path)
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" or path:find("[\n\r%z]") then return nil end
  return '"' .. path:gsub('[\\"]', "\\%0") .. '"'
end

local TIER_DEVICES = { "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom" }

--- The SBPL profile for a tier step (corral.tier on macOS): deny by default, the runtime
-- read-only, then each grant; with subprocess = false only `program` may be exec'd and
-- nothing forked. An allowlist has no egress plane here and is refused. The runtime's
-- mach services come from core.sbpl.emit, so the two profiles never disagree on them.
-- @tparam table g normalised grants (corral.tier.policy.check)
-- @tparam string program resolved
-- @treturn string the profile text, or nil and `invalid_argument`/`cannot_enforce`
function M.tier_profile(g, program)
  if type(g.net) == "table" then
    return nil, errors.cannot_enforce("grants.net", "an allowlist needs the egress plane, which has no " ..
      "seatbelt counterpart here")
  end
  local lines = { "(version 1)", "(deny default)", "; corral tier S1: the runtime",
    "(allow sysctl-read)", "(allow signal (target same-sandbox))" }
  local control = assert(core.sbpl.emit("/", {}, {}))
  lines[#lines + 1] = assert(control:match("%(allow mach%-lookup.-%)%)\n")):sub(1, -2)
  lines[#lines + 1] = "(allow ipc-posix-shm)"
  local function rule(ops, filter, path, what)
    local lit = literal(path)
    if not lit then return nil, errors.invalid_argument(what, tostring(path) .. ": not a path SBPL can spell") end
    lines[#lines + 1] = string.format("(allow %s (%s %s))", ops, filter, lit)
    return true
  end
  local steps = { { "file-read*", "literal", "/", "runtime" } }
  for _, p in ipairs(M.runtime_read_paths()) do steps[#steps + 1] = { "file-read*", "subpath", p, "runtime" } end
  for _, p in ipairs(TIER_DEVICES) do
    steps[#steps + 1] = { "file-read* file-write* file-ioctl", "literal", p, "runtime" }
  end
  local exec_ops = g.subprocess and "file-read* process-exec" or "file-read*"
  steps[#steps + 1] = { "process-exec", "literal", program, "cmd" }
  for _, p in ipairs(g.read) do steps[#steps + 1] = { "file-read*", "subpath", p, "grants.read" } end
  for _, p in ipairs(g.write) do steps[#steps + 1] = { "file-read* file-write*", "subpath", p, "grants.write" } end
  for _, p in ipairs(g.exec) do steps[#steps + 1] = { exec_ops, "subpath", p, "grants.exec" } end
  for _, st in ipairs(steps) do
    local ok, err = rule(st[1], st[2], st[3], st[4])
    if not ok then return nil, err end
  end
  if g.subprocess then
    lines[#lines + 1] = "(allow process-fork)"
    for _, p in ipairs(M.runtime_read_paths()) do rule("process-exec", "subpath", p, "runtime") end
  end
  if g.net == true then lines[#lines + 1] = "(allow network*)" end
  return table.concat(lines, "\n") .. "\n"
end

return M
