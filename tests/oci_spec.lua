-- The oci mechanism against the real engine (podman here; CI installs it): its life
-- cycle leaving nothing behind, the published address, the caps, an egress allowlist
-- through corral's own netns, and its conformance census. Pending only where no engine
-- is installed.
local core = require "corral.core"
local corral = require "corral"
local oci = require "corral.mechanism.oci"
local seccomp = require "corral.mechanism.oci.seccomp"
local h = require "helpers"

local function engine() return oci.engine() end

local function lines(text)
  local t = {}
  for l in (text or ""):gmatch("[^\n]+") do t[#t + 1] = l end
  table.sort(t)
  return t
end

-- Every container of a sandbox id the engine still has, and every image.
local function containers(id)
  return lines(oci.call({ "ps", "--all", "--format", "{{.Names}}", "--filter", "label=corral.sandbox=" .. id,
    "--filter", "label=corral.owner=" .. core.proc.getpid() }))
end
local function images() return lines(oci.call({ "images", "--quiet", "--no-trunc" })) end

local function nsfs_fds()
  local n = 0
  for _, fd in ipairs(core.fs.listdir("/proc/self/fd") or {}) do
    if (core.fs.readlink("/proc/self/fd/" .. fd) or ""):match("^net:") then n = n + 1 end
  end
  return n
end

-- What a TCP server at host:port sends within 2 s ("" when nothing answers).
local function dial(host, port)
  local fd = core.sock.connect(host, tonumber(port), 2)
  if not fd then return "" end
  local got, deadline = "", core.clock.monotime() + 2
  while core.clock.monotime() < deadline do
    local r = core.io.poll({ fd }, 0.1)
    if r and r[1] then
      local d = core.io.read(fd, 4096)
      if not d or d == "" then break end
      got = got .. d
    end
  end
  fd:close()
  return got
end

local ALLOC = "import sys\nb = bytearray(int(sys.argv[1]) << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n" ..
  "print('ALLOC-OK', flush=True)\n"

describe("the oci seccomp profile", function()
  it("refuses exactly the calls corral's own tenant filter refuses outright", function()
    local src = h.read("core/lib/seccomp.c")
    local list = assert(src:match("deny_eperm%[%] = {(.-)};"))
    local c = {}
    for name in list:gmatch('"([%w_]+)"') do c[#c + 1] = name end
    local lua = {}
    for i, v in ipairs(seccomp.DENY) do lua[i] = v end
    table.sort(c)
    table.sort(lua)
    assert.are.same(c, lua)
    local p = seccomp.profile()
    assert.are.equal("SCMP_ACT_ALLOW", p.defaultAction)
    assert.are.same(seccomp.DENY, p.syscalls[1].names)
  end)
end)

describe("the oci mechanism #root #oci", function()
  local root
  before_each(function()
    root = assert(core.fs.mkdtemp("/tmp/corral-oci-spec-"))
    core.fs.chmod(root, tonumber("711", 8))
  end)
  after_each(function() h.rmrf(root) end)

  local function box(id, fields)
    local t = { id = id, storage_root = root }
    for k, v in pairs(fields or {}) do t[k] = v end
    return assert(corral.sandbox(t))
  end

  local function exec(sb, script)
    local out = root .. "/out-" .. sb.id
    local r, err = corral.exec(oci, sb, { "/bin/sh", "-c", script }, { output = out })
    local text = h.read(out) or ""
    os.remove(out)
    return r, err, text
  end

  local function need_engine()
    if engine() then return true end
    pending("no podman or docker installed")
  end

  it("provisions, starts, execs in the started container, stops and destroys, leaving nothing", function()
    if not need_engine() then return end
    local sb = box("life")
    assert(corral.provision(oci, sb))
    local imgs = images()
    assert.are.equal("provisioned", corral.status(oci, sb))
    assert(corral.start(oci, sb, { "/bin/sh", "-c", "echo started > /storage/s; exec sleep 30" },
      { output = root .. "/start" }))
    assert.truthy(h.wait_for(function() return h.read(root .. "/life/s") end, 10))
    assert.are.equal("running", corral.status(oci, sb))
    local name = oci.containers(sb)[1]
    local id = assert(oci.call({ "inspect", "--format", "{{.Id}}", name })):gsub("%s+", "")
    local cgroup_dirs = {}
    for _, ctl in ipairs({ "memory", "pids", "cpu" }) do
      for _, d in ipairs(core.fs.listdir("/sys/fs/cgroup/" .. ctl .. "/libpod_parent") or {}) do
        local dir = "/sys/fs/cgroup/" .. ctl .. "/libpod_parent/" .. d
        if d:find(id, 1, true) then cgroup_dirs[#cgroup_dirs + 1] = dir end
      end
    end
    -- exec joins the started container: it sees the same /tmp and the sleep
    local r, _, out = exec(sb, "cat /proc/1/comm; id -u; touch /usr/x 2>&1; true")
    assert.are.equal(0, r.code, out)
    assert.matches("sleep", out)
    assert.matches(tostring(require("corral.sandbox").host_id(sb)), out)
    assert.matches("Read%-only file system", out)
    assert.are.same({ name }, containers("life"))
    assert(corral.stop(oci, sb))
    assert.are.equal("stopped", corral.status(oci, sb))
    assert(corral.destroy(oci, sb))
    assert.are.equal("absent", corral.status(oci, sb))
    assert.are.same({}, containers("life"))
    assert.are.same(imgs, images())
    for _, d in ipairs(cgroup_dirs) do assert.is_nil(core.fs.lstat(d), d) end
    assert.truthy(h.read(root .. "/life/s")) -- the storage outlives the sandbox
  end)

  it("runs with every capability dropped, no_new_privs, the seccomp profile and no network", function()
    if not need_engine() then return end
    local sb = box("hard")
    assert(corral.provision(oci, sb))
    local r, _, out = exec(sb, "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; " ..
      "unshare -U true 2>&1 || echo USERNS-REFUSED; cat /sys/class/net/*/operstate 2>/dev/null | wc -l; " ..
      "echo ok > /storage/ok && cat /storage/ok")
    corral.destroy(oci, sb)
    assert.are.equal(0, r.code, out)
    assert.matches("CapEff:%s*0+\n", out)
    assert.matches("CapBnd:%s*0+\n", out)
    assert.matches("NoNewPrivs:%s*1", out)
    assert.matches("Seccomp:%s*2", out)
    assert.matches("USERNS%-REFUSED", out)
    assert.matches("\nok\n", out) -- control: its own storage is written
  end)

  it("answers nil without a service port, and 127.0.0.1:N the engine allocated with one, reached from the host",
    function()
      if not need_engine() then return end
      local plain = box("plain")
      assert(corral.provision(oci, plain))
      local ok, addr = corral.address(oci, plain)
      assert.is_true(ok)
      assert.is_nil(addr)
      corral.destroy(oci, plain)
      local a, b = box("sva", { service_port = 8000 }), box("svb", { service_port = 8000 })
      assert(corral.provision(oci, a))
      assert(corral.provision(oci, b))
      local _, addr_a = corral.address(oci, a)
      local _, addr_b = corral.address(oci, b)
      assert.matches("^127%.0%.0%.1:%d+$", addr_a)
      assert.matches("^127%.0%.0%.1:%d+$", addr_b)
      assert.are_not.equal(addr_a, addr_b)
      local token = "svc-" .. require("corral.conformance").token()
      assert(corral.start(oci, a, { "python3", "-c", "import socket\ns = socket.socket()\n" ..
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', 8000)); s.listen(4)\n" ..
        "open('/storage/ready', 'w').write('1')\nwhile True:\n  c, _ = s.accept(); c.sendall(b'" .. token ..
        "\\n'); c.close()\n" }, { output = root .. "/svc" }))
      assert.truthy(h.wait_for(function() return h.read(root .. "/sva/ready") end, 10), h.read(root .. "/svc"))
      local host, port = addr_a:match("^(.*):(%d+)$")
      assert.truthy(dial(host, port):find(token, 1, true))
      -- control: nothing answers at b's address (nothing listens in b)
      local bh, bp = addr_b:match("^(.*):(%d+)$")
      assert.is_falsy(dial(bh, bp):find(token, 1, true))
      corral.destroy(oci, a)
      corral.destroy(oci, b)
      assert.are.same({}, containers("sva"))
      assert.are.same({}, containers("svb"))
      -- that sandbox's reduction is stated, not claimed
      assert.truthy(oci.reductions(a).network_restriction)
      local claimed = {}
      for _, c in ipairs(oci.constructed_capabilities(a)) do claimed[c] = true end
      assert.is_nil(claimed.network_restriction)
      assert.truthy(claimed.filesystem_confinement)
    end)

  it("kills a memory hog at its cap (limit memory), and a smaller allocation then runs", function()
    if not need_engine() then return end
    local sb = box("mem", { limits = { memory = "64M" } })
    assert(corral.provision(oci, sb))
    h.write(root .. "/mem/alloc.py", ALLOC)
    local r, err, out = exec(sb, "exec python3 /storage/alloc.py 256")
    local r2, _, out2 = exec(sb, "exec python3 /storage/alloc.py 8")
    corral.destroy(oci, sb)
    assert.truthy(r, tostring(err))
    assert.are.equal("memory", r.limit, out)
    assert.is_falsy(out:find("ALLOC-OK", 1, true))
    assert.are.equal(0, r2.code, out2)
    assert.matches("ALLOC%-OK", out2)
    assert.are.same({}, containers("mem"))
  end)

  it("caps a fork bomb at limits.pids, and a child then still starts", function()
    if not need_engine() then return end
    local sb = box("bomb", { limits = { pids = 16, wall = 20 } })
    assert(corral.provision(oci, sb))
    local _, _, out = exec(sb, "i=0; while [ $i -lt 64 ]; do sleep 5 & i=$((i+1)); echo F$i; done; " ..
      "kill $(jobs -p) 2>/dev/null")
    local r2, _, out2 = exec(sb, "sleep 0 & wait $! && echo CHILD-OK")
    corral.destroy(oci, sb)
    local _, forks = out:gsub("F%d+\n", "")
    assert.truthy(forks > 0 and forks < 64, out)
    assert.are.equal(0, r2.code, out2)
    assert.matches("CHILD%-OK", out2)
  end)

  it("ends a run at limits.wall: the container is removed before its command goes on", function()
    if not need_engine() then return end
    -- the limit covers the engine's own start too (a few hundred ms, more on a busy
    -- machine): 2 s leaves the quick command room, and the slow one overruns it
    local sb = box("wall", { limits = { wall = 2 } })
    assert(corral.provision(oci, sb))
    local r = exec(sb, "sleep 4; echo late > /storage/late")
    core.io.poll({}, 3)
    local r2, _, out2 = exec(sb, "echo quick > /storage/quick && cat /storage/quick")
    corral.destroy(oci, sb)
    assert.are.equal("wall", r.limit)
    assert.is_nil(h.read(root .. "/wall/late"))
    assert.are.equal(0, r2.code)
    assert.matches("quick", out2)
  end)

  it("applies an egress allowlist through corral's netns: allowed reached, denied name NXDOMAIN, bare IP reset",
    function()
      if not need_engine() then return end
      local lfd, port = assert(core.sock.listen("127.0.0.1", 0))
      local before = nsfs_fds()
      local sb = box("egr", { network = { allow = { "allowed.test:" .. port }, internal = { "127.0.0.0/8" },
        resolve = function() return { "127.0.0.1" } end } })
      assert(corral.provision(oci, sb))
      local client = [[
import socket, sys
def go(host):
    try:
        s = socket.create_connection((host, int(sys.argv[1])), 3); s.sendall(b"TOKEN-" + host.encode() + b"\n")
        print(host, "connected", flush=True)
    except socket.gaierror as e:
        print(host, "gaierror", e.errno, flush=True)
    except OSError as e:
        print(host, "oserror", e.errno, flush=True)
for h in sys.argv[2:]: go(h)
]]
      h.write(root .. "/egr/dial.py", client)
      local r, err, out = exec(sb, "python3 /storage/dial.py " .. port .. " allowed.test denied.test 127.0.0.1")
      corral.destroy(oci, sb)
      local got = ""
      for _ = 1, 4 do
        local c = core.sock.accept(lfd, 0.2)
        if c then
          got = got .. (core.io.read(c, 4096) or "")
          c:close()
        end
      end
      lfd:close()
      assert.truthy(r, tostring(err))
      assert.matches("allowed%.test connected", out)
      assert.matches("TOKEN%-allowed%.test", got)
      assert.matches("denied%.test gaierror %-2", out) -- EAI_NONAME: NXDOMAIN
      assert.matches("127%.0%.0%.1 oserror 111", out) -- ECONNREFUSED: reset at its SYN
      assert.is_falsy(got:find("TOKEN-127", 1, true))
      assert.are.equal(before, nsfs_fds())
      assert.are.same({}, containers("egr"))
    end)

  it("returns the engine's error verbatim with the command that failed", function()
    if not need_engine() then return end
    local saved = oci.config.image
    oci.config.image = "localhost/corral-no-such-image:none"
    local ok, err = corral.provision(oci, box("noimg"))
    oci.config.image = saved
    assert.is_nil(ok)
    assert.matches("image inspect", tostring(err))
    assert.matches("corral%-no%-such%-image", tostring(err))
    assert.matches("status 125", tostring(err))
    -- control: with corral's own image it provisions
    local sb = box("noimg2")
    assert(corral.provision(oci, sb))
    corral.destroy(oci, sb)
  end)

  it("runs through corral run --mechanism oci --engine podman", function()
    if not need_engine() then return end
    local out, status = h.corral("run", "--mechanism", "oci", "--engine", engine().path, "--storage",
      root .. "/cli", "--", "/bin/sh", "-c", "echo in-oci; cat /proc/1/cgroup | grep -c libpod; exit 3")
    assert.are.equal(3, status, out)
    assert.matches("in%-oci\n[1-9]", out)
  end)
end)

describe("the oci conformance census #root #oci", function()
  it("runs every check against oci, holds exactly its floor, and shows each omission with its reason", function()
    if not engine() then
      pending("no podman or docker installed")
      return
    end
    local conformance = require "corral.conformance"
    local report = assert(conformance.run("oci"))
    local by = {}
    for _, r in ipairs(report.results) do
      by[r.id] = r
      assert.are_not.equal("breached", r.outcome, r.id .. ": " .. r.detail)
      assert.are_not.equal("void", r.outcome, r.id .. ": " .. r.detail)
    end
    require("census").assert_floor("oci", report)
    assert.are.equal("unavailable", by["res.disk"].outcome)
    assert.matches("disk_quota.*measured", by["res.disk"].detail)
    -- what only a claim of privilege_separation makes a breach: the tenant's capabilities
    for _, id in ipairs({ "priv.setuid", "priv.nested_userns", "priv.capabilities", "priv.low_port",
                          "proc.tiocsti" }) do
      assert.are.equal("unavailable", by[id].outcome, id)
      assert.matches("privilege_separation.*user namespace", by[id].detail)
    end
    -- the environment, every mechanism's duty; the host's and a sibling's processes, /tmp
    -- and IPC outside its own root (filesystem_confinement), their sockets (network_restriction)
    for _, id in ipairs({ "cred.forbidden_env", "cred.host_environ", "proc.host_pids", "proc.signal_host",
                          "proc.ptrace", "proc.keyring", "cross.pids", "cross.signal", "cross.loopback",
                          "cross.abstract_unix", "cross.tmp", "cross.sysv_ipc" }) do
      assert.are.equal("held", by[id] and by[id].outcome, id)
    end
    for _, id in ipairs({ "res.memory", "res.pids", "res.cpu", "res.wall", "net.connect_out", "net.sibling_service",
                          "egress.denied_name", "egress.denied_ip", "fs.sibling_read" }) do
      assert.are.equal("held", by[id] and by[id].outcome, id)
    end
  end)
end)
