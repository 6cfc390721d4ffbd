-- Names a tenant looks up: every one reaches its own hosts file and its own DNS
-- responder, never the host's /etc/hosts (corral.name_files), under native, bwrap and oci;
-- and the host's own lookup of a permitted name, done off the shared loop.
local core = require "corral.core"
local name_files = require "corral.name_files"
local h = require "helpers"
local internet = require "internet"

local function mechanisms()
  local list = { "native" }
  if h.sh("command -v bwrap"):match("bwrap") then list[#list + 1] = "bwrap" end
  if require("corral.mechanism.oci").engine() then list[#list + 1] = "oci" end
  return list
end

-- The host's /etc/hosts with one line of the test's own added; `remove` takes out that
-- line alone, in place (other processes may edit the file meanwhile, and it may be a
-- bind mount that a rename would not replace).
local function add_host_line(line)
  local f = assert(io.open("/etc/hosts", "a"))
  assert(f:write(line .. "\n"))
  f:close()
  return function()
    local text = h.read("/etc/hosts") or ""
    local kept = {}
    for l in text:gmatch("([^\n]*)\n") do
      if l ~= line then kept[#kept + 1] = l .. "\n" end
    end
    local w = assert(io.open("/etc/hosts", "r+"))
    local out = table.concat(kept)
    assert(w:write(out))
    w:close()
    -- shorten to what was written (io has no truncate)
    assert(os.execute("truncate -s " .. #out .. " /etc/hosts"))
  end
end

-- Every directory of name files a process of `pid` made, in any place they are made.
local function own_dirs(pid)
  local out = {}
  for _, base in ipairs(name_files.bases()) do
    for _, name in ipairs(core.fs.listdir(base) or {}) do
      if name:match("^corral%-names%-" .. pid .. "%-") then out[#out + 1] = base .. "/" .. name end
    end
  end
  return out
end

describe("a tenant's own nsswitch.conf", function()
  it("sends hosts to its own files then DNS, whatever sources the host lists; other databases stay", function()
    local host = "passwd: files systemd\nhosts: files mdns4_minimal [NOTFOUND=return] myhostname resolve dns\n" ..
      "networks: files\n"
    local got = name_files.nsswitch(host)
    assert.is_nil(got:find("mdns", 1, true))
    assert.is_nil(got:find("myhostname", 1, true))
    assert.matches("\nhosts:%s+files dns\n", got)
    assert.matches("^passwd: files systemd\n", got) -- control: the rest as the host says
    assert.matches("\nnetworks: files\n", got)
    -- a host without one, or without a hosts line, still gets one
    assert.matches("^hosts:%s+files dns\n$", name_files.nsswitch(nil))
    assert.matches("^passwd: files\nhosts:%s+files dns\n$", name_files.nsswitch("passwd: files\n"))
  end)
end)

describe("a name the host's /etc/hosts lists #root #netns", function()
  local net, name, remove_line

  setup(function()
    net = internet.start()
    name = "corral-hosts-test-" .. h.own_pid() .. ".test"
    remove_line = add_host_line("127.0.0.1 " .. name)
  end)
  teardown(function()
    if remove_line then remove_line() end
    if net then internet.stop(net) end
    assert.is_nil((h.read("/etc/hosts") or ""):find(name, 1, true), "the test's line stayed in /etc/hosts")
  end)

  it("resolves to the host's address on the host (the premise)", function()
    assert.matches("^127%.0%.0%.1%s+" .. name:gsub("%-", "%%-"), h.sh("getent hosts " .. name))
  end)

  it("resolves inside to its synthetic address, and the relay reaches it, under every mechanism", function()
    for _, m in ipairs(mechanisms()) do
      local out, status = h.corral("run", "--mechanism", m, "--internal", net.cidr, "--resolve", name .. "=" .. net.ip,
        "--allow", name .. ":" .. net.http_port, "--", "sh", "-c",
        -- attempt: the host's line must not answer; control after it: the relay connects
        "getent ahostsv4 " .. name .. " | head -1; " ..
        "curl -sS --max-time 10 http://" .. name .. ":" .. net.http_port .. "/index.html")
      assert.are.equal(0, status, m .. ": " .. out)
      assert.matches("^198%.1[89]%.%d+%.%d+%s+STREAM " .. name:gsub("%-", "%%-") .. "\n", out, nil, m)
      assert.is_nil(out:find("127.0.0.1", 1, true), m .. ": " .. out)
      assert.matches("\nhello%-from%-the%-internet\n", out, nil, m)
    end
    assert.are.same({}, own_dirs(h.own_pid()))
  end)

  it("is unknown inside a sandbox without an allowlist, whose hosts file is its own", function()
    for _, m in ipairs(mechanisms()) do
      local out, status = h.corral("run", "--mechanism", m, "--", "sh", "-c", h.attempt_then_control(
        "getent hosts " .. name .. "; echo getent=$?",
        "grep -vc '^#' /etc/hosts; getent hosts localhost; hostname; getent -s files hosts $(hostname)"))
      assert.are.equal(0, status, m .. ": " .. out)
      local _, control, attempt = h.after_attempt(out, "localhost")
      assert.matches("^getent=2\n", attempt, nil, m)
      -- control, after the attempt: its own file, four lines, answers localhost and its hostname
      assert.matches("^4\n::1%s+localhost ip6%-localhost ip6%-loopback\ncorral\n::1%s+corral\n", control, nil, m)
    end
  end)
end)

-- The filesystem type and source path of the mount over the tenant's /etc/hosts, as
-- the tenant's /proc/self/mountinfo says; `prefix` runs before corral (in the same shell).
local function hosts_mount(prefix)
  local out, status = h.sh((prefix or "") .. h.quote(h.host) .. " run -- cat /proc/self/mountinfo")
  assert.are.equal(0, status, out)
  for line in out:gmatch("[^\n]+") do
    local root, point, fstype = line:match("^%S+ %S+ %S+ (%S+) (%S+) .- %- (%S+)")
    if point == "/etc/hosts" then return fstype, root end
  end
  error("no mount over /etc/hosts in:\n" .. out)
end

describe("a run's name files #root", function()
  it("are made on /dev/shm, a tmpfs, where it is a shared scratch directory; else on /tmp", function()
    local shm = core.fs.lstat("/dev/shm")
    if not (shm and shm.type == "dir" and shm.uid == 0 and shm.mode & tonumber("1777", 8) == tonumber("1777", 8))
      or h.sh("stat -f -c %T /dev/shm") ~= "tmpfs\n" then
      return pending("/dev/shm here is not root's sticky, world-writable tmpfs")
    end
    if h.sh("stat -f -c %T /tmp") == "tmpfs\n" then
      return pending("/tmp here is a tmpfs: the two cannot be told apart")
    end
    local fstype, root = hosts_mount()
    assert.are.equal("tmpfs", fstype)
    assert.matches("^/corral%-names%-%d+%-%w+/hosts$", root)
    -- a /dev/shm the tenant's id cannot search (mode 0700) is passed over for /tmp
    fstype, root = hosts_mount("unshare -m --propagation private sh -c 'mount -t tmpfs -o mode=0700 shm /dev/shm " ..
      "&& exec \"$0\" \"$@\"' ")
    assert.are_not.equal("tmpfs", fstype)
    assert.matches("/corral%-names%-%d+%-%w+/hosts$", root)
  end)
end)

describe("a tenant's /etc/hostname", function()
  it("is its own, naming the sandbox's hostname, never the host's, under every mechanism", function()
    local host_name = h.read("/etc/hostname")
    if not host_name then return pending("this host has no /etc/hostname: there is no name of its own to hide") end
    assert.are_not.equal("corral\n", host_name, "the premise: the host is not named corral")
    for _, m in ipairs(mechanisms()) do
      local out, status = h.corral("run", "--mechanism", m, "--", "sh", "-c", "cat /etc/hostname; hostname")
      assert.are.equal(0, status, m .. ": " .. out)
      assert.are.equal("corral\ncorral\n", out, m)
    end
  end)
end)

-- A DNS server on 127.0.0.1:53 of the test's network namespace: every name answers
-- 127.0.0.1 (A) or nothing (AAAA) at once, except slow.test, whose queries are held
-- (and "slow-asked" written into DIR) until DIR/release exists, or 60 s have passed.
local SLOW_DNS = [==[
import os, select, socket, sys, time
d = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
open(d + "/dns-ready", "w").close()
held, cap = [], time.time() + 60
def answer(q):
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
    qtype = int.from_bytes(q[i + 1:i + 3], "big")
    question = q[12:i + 5]
    a = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\x7f\x00\x00\x01" if qtype == 1 else b""
    return q[:2] + b"\x81\x80\x00\x01" + (b"\x00\x01" if a else b"\x00\x00") + b"\x00\x00\x00\x00" + question + a, \
        ".".join(labels)
while time.time() < cap + 5:
    if select.select([s], [], [], 0.05)[0]:
        q, peer = s.recvfrom(512)
        reply, name = answer(q)
        if name == "slow.test":
            open(d + "/slow-asked", "w").close()
            held.append((reply, peer))
        else:
            s.sendto(reply, peer)
    if held and (os.path.exists(d + "/release") or time.time() > cap):
        for reply, peer in held: s.sendto(reply, peer)
        held = []
]==]

describe("the host's lookup of a permitted name #root #netns", function()
  it("never holds another connection of the loop while it waits for a slow resolver", function()
    local dir = h.tmpdir("slow-dns")
    h.defer(finally, function() h.rmrf(dir) end)
    assert(os.execute("chmod 0777 " .. h.quote(dir)))
    h.write(dir .. "/dns.py", SLOW_DNS)
    h.write(dir .. "/index.html", "hello-from-loopback\n")
    -- the host process's own resolver: the slow server, waited for up to 30 s (glibc's most)
    h.write(dir .. "/resolv.conf", "nameserver 127.0.0.1\noptions timeout:30 attempts:1\n")
    h.write(dir .. "/nsswitch.conf", "hosts: files dns\n")
    local port = 8080
    -- the tenant starts the slow lookup, waits until the server holds it, then connects
    -- to fast.test: that must complete while slow.test is still unanswered (ordering,
    -- never a timing), and slow.test only after the tenant releases it
    local tenant = [[
      curl -sS --max-time 60 http://slow.test:PORT/index.html > /tmp/slow.out 2>&1 &
      i=0; while [ ! -e /workspace/slow-asked ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
      [ -e /workspace/slow-asked ] && echo slow-pending
      curl -sS --max-time 8 http://fast.test:PORT/index.html && echo fast-done
      [ -s /tmp/slow.out ] && echo slow-answered-early
      touch /workspace/release
      wait
      cat /tmp/slow.out; echo slow-done]]
    tenant = tenant:gsub("PORT", tostring(port))
    local script = [[
      set -e
      ip link set lo up
      mount --bind "$D/resolv.conf" /etc/resolv.conf
      mount --bind "$D/nsswitch.conf" /etc/nsswitch.conf
      /usr/bin/python3 "$D/dns.py" "$D" & dns=$!
      (cd "$D" && exec busybox httpd -f -p 127.0.0.1:$PORT) & web=$!
      trap 'kill $dns $web 2>/dev/null' EXIT
      i=0; while [ ! -e "$D/dns-ready" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
      echo "host: $(getent hosts fast.test)"
      set +e
      "$CORRAL" run --internal 127.0.0.0/8 --allow slow.test:$PORT --allow fast.test:$PORT \
        --workspace "$D" -- sh -c "$TENANT"
      echo "status=$?"]]
    local out = h.capture({ "env", "D=" .. dir, "PORT=" .. port, "CORRAL=" .. h.host, "TENANT=" .. tenant,
      "unshare", "-m", "-n", "sh", "-c", script })
    -- the premise: the host process's resolver is the test's server
    assert.matches("host: 127%.0%.0%.1%s+fast%.test\n", out)
    assert.matches("status=0", out, nil, true)
    assert.is_nil(out:find("slow-answered-early", 1, true), out)
    assert.is_true(h.in_order(out, { "slow-pending\n", "hello-from-loopback\nfast-done\n",
      "hello-from-loopback\nslow-done\n" }, true), out)
  end)
end)
