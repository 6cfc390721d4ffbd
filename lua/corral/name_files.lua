--- The tenant's own name-service files, bound over the runtime's (the host's /etc, shown
-- read-only): which files (`core.rootplan.name_files`) is the root plan's, what they say
-- is here. With the host's, a name the host's /etc/hosts lists (or a `hosts:` source of
-- its nsswitch.conf: mdns, myhostname, resolve) would resolve inside without ever
-- reaching the sandbox's own responder, to an address the host chose: every name a tenant
-- looks up goes to its own hosts file (localhost and its hostname alone), then to its own
-- DNS responder, which answers only what its allowlist allows.
--
-- One directory per sandbox (mode 0711 in /dev/shm, /tmp or $TMPDIR: `bases`; files
-- 0644, named with its maker's pid: one a SIGKILLed process left is removed by the next
-- maker).
-- @module corral.name_files
local core = require "corral.core"
local leftovers = require "corral.leftovers"

local M = {}

--- The tenant's hostname under the built-in mechanisms.
M.HOSTNAME = "corral"

--- The name of a directory of name files in $TMPDIR or /tmp: its maker's pid first.
M.DIR_PATTERN = leftovers.pattern("corral-names-")

--- The `hosts:` line every tenant's nsswitch.conf holds: its own hosts file, then DNS.
M.NSSWITCH_HOSTS = "hosts:          files dns"

local swept = {} -- the places swept by this process

-- A directory anyone may make scratch in safely and the tenant's id may search: root's,
-- sticky where others may write (no one renames another's entry), searchable by others.
local function shared_scratch(path)
  local st = core.fs.lstat(path)
  return st ~= nil and st.type == "dir" and st.uid == 0 and st.mode & 1 ~= 0
    and (st.mode & 2 == 0 or st.mode & tonumber("1000", 8) ~= 0)
end

--- Where name files are made, in order of preference. /dev/shm first: a tmpfs, where
-- making and removing the five files costs a fraction of a disk's /tmp (a run's ~0.3 ms
-- on this VM's ext4). Then /tmp: the tenant's root is built by a process of the tenant's
-- own id, which must reach the files (a private $TMPDIR would refuse it); then $TMPDIR,
-- where /tmp is read-only (inside a confinement), which then must be searchable by that
-- id too.
-- @treturn {string,...}
function M.bases()
  local bases = {}
  if shared_scratch("/dev/shm") then bases[1] = "/dev/shm" end
  bases[#bases + 1] = "/tmp"
  if leftovers.base() ~= "/tmp" then bases[#bases + 1] = leftovers.base() end
  return bases
end

--- The tenant's nsswitch.conf: the host's, with its `hosts:` line replaced by its own
-- files then DNS.
-- @tparam[opt] string host the host's nsswitch.conf (nil: it has none)
-- @treturn string
function M.nsswitch(host)
  local out, has_hosts = {}, false
  for line in (host or ""):gmatch("([^\n]*)\n?") do
    local db = line:match("^%s*(%a+)%s*:")
    if db == "hosts" then
      if not has_hosts then out[#out + 1] = M.NSSWITCH_HOSTS end
      has_hosts = true
    else
      out[#out + 1] = line
    end
  end
  while out[#out] == "" do out[#out] = nil end
  if not has_hosts then out[#out + 1] = M.NSSWITCH_HOSTS end
  return table.concat(out, "\n") .. "\n"
end

--- What each of the tenant's name files says, by its path in the tenant's root.
-- @tparam string hostname the tenant's hostname
-- @tparam[opt] string host_nsswitch the host's nsswitch.conf
-- @treturn table path → text
function M.contents(hostname, host_nsswitch)
  return {
    ["/etc/hosts"] = "# corral: this sandbox's own hosts file; every other name goes to its own DNS responder\n"
      .. "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
      .. "127.0.0.1\t" .. hostname .. "\n::1\t" .. hostname .. "\n",
    ["/etc/resolv.conf"] = "# corral: this sandbox's own DNS responder (it answers allowed names, forwards "
      .. "nothing; without an allowlist nothing answers)\nnameserver 127.0.0.1\n",
    ["/etc/nsswitch.conf"] = M.nsswitch(host_nsswitch),
    ["/etc/host.conf"] = "multi on\n",
    ["/etc/hostname"] = hostname .. "\n",
  }
end

--- Writes the name files for a tenant named hostname into a directory of their own.
-- @tparam string hostname
-- @treturn[1] table `{dir =, files = {[path in the tenant's root] = path on the host}}`
-- @return[2] nil
-- @treturn[2] string why
function M.write(hostname)
  local dir, err
  for _, base in ipairs(M.bases()) do
    -- each place is swept (once a process) by the makers that try it: one a SIGKILLed
    -- run left is where that run's successors make theirs
    if not swept[base] then
      swept[base] = true
      leftovers.sweep_own_soon(base, "corral-names-")
    end
    dir, err = leftovers.make(base, "corral-names-")
    if dir then break end
  end
  if not dir then return nil, err end
  local made = { dir = dir, files = {} }
  local function fail(why)
    M.remove(made)
    return nil, why
  end
  local ok, cerr = core.fs.chmod(dir, tonumber("711", 8))
  if not ok then return fail(cerr) end
  local nf = io.open("/etc/nsswitch.conf")
  local host_nsswitch = nf and nf:read("a")
  if nf then nf:close() end
  local contents = M.contents(hostname, host_nsswitch)
  for _, dest in ipairs(core.rootplan.name_files()) do
    local text = contents[dest]
    if not text then return fail("no content for " .. dest) end
    local path = dir .. "/" .. dest:match("[^/]+$")
    local f, ferr = io.open(path, "w")
    if not f then return fail(ferr) end
    local wok, werr = f:write(text)
    f:close()
    if not wok then return fail(werr) end
    made.files[dest] = path
    ok, cerr = core.fs.chmod(path, tonumber("644", 8))
    if not ok then return fail(cerr) end
  end
  return made
end

--- Removes what `write` made; idempotent.
-- @tparam table t
--- The host's CA bundle with the run's CA appended, written beside the name files
-- (`t.ca_bundle`), for the tenant's trust when a secret is bound.
-- @tparam table t what `write` made
-- @tparam string pem the run CA's certificate
-- @treturn[1] string the file's path
-- @return[2] nil
-- @treturn[2] string why
function M.write_ca_bundle(t, pem)
  local host = M.HOST_CA_BUNDLE and core.fs.read(M.HOST_CA_BUNDLE) or ""
  if host ~= "" and host:sub(-1) ~= "\n" then host = host .. "\n" end
  local path = t.dir .. "/ca-certificates.crt"
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  local ok, werr = f:write(host, pem)
  f:close()
  if not ok then return nil, werr end
  local cok, cerr = core.fs.chmod(path, tonumber("644", 8))
  if not cok then return nil, cerr end
  t.ca_bundle = path
  return path
end

--- The host's bundle of trusted CAs (Debian's ca-certificates).
M.HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

function M.remove(t)
  if t and t.dir then
    leftovers.remove_own_tree(t.dir)
    t.dir, t.files = nil, {}
  end
end

return M
