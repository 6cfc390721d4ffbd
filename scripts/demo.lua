-- `make demo`: the main job on an embedded default. Prints what confinement this host
-- can build (measured, not assumed), then confines a shell to a temporary directory
-- and shows, side by side, a write inside that succeeds and a read of a sibling
-- directory that is denied — both from the same confined shell.
local corral = require "corral"
local probe = require "corral.probe"
local shell = require "corral.shell"

local function say(fmt, ...) io.write(string.format(fmt, ...), "\n") end

say("corral demo — control-plane confinement on this host")
for _, r in ipairs(probe.probe()) do
  say("  %-24s %-6s  %s", r.name, r.holds and "holds" or "absent", r.detail)
end

-- Part one: the confinement wrapper. Each part returns an exit status; the census of
-- native ends the demo whatever they did.
local function confinement_part()
  local root = assert(corral.core.fs.mkdtemp("/tmp/corral-demo-"))
  local box, sibling = root .. "/box", root .. "/sibling"
  assert(os.execute(string.format("mkdir %s %s && echo 'credentials of the next tenant' > %s/secret.txt",
    box, sibling, sibling)))

  local script = [[
  if echo hello > hello.txt && [ "$(cat hello.txt)" = hello ]; then echo "write:allowed"; else echo "write:denied"; fi
  if out=$(cat "$1/secret.txt" 2>&1); then echo "read:allowed:$out"; else echo "read:denied:${out##*: }"; fi
  ]]
  local spec, err = corral.confine({ "sh", { "-c", script, "sh", sibling } }, {
    permit_path = box,
    env = { PATH = "/usr/bin:/bin", ANTHROPIC_API_KEY = "sk-demo-passes-through" },
  })
  if not spec then
    say("\nconfine refused: %s", tostring(err))
    os.execute("rm -rf " .. shell.quote(root))
    return 3
  end

  say("\nConfining /bin/sh to %s (layers: %s)", box, table.concat(spec.layers, " + "))
  say("  launch: %s %s", spec.cmd, shell.join({ table.unpack(spec.args, 1, 6) }) .. " …")
  local argv = { "env", "-i" }
  for _, pair in ipairs(spec.env) do argv[#argv + 1] = pair[1] .. "=" .. pair[2] end
  argv[#argv + 1] = spec.cmd
  for _, a in ipairs(spec.args) do argv[#argv + 1] = a end
  local out, status = shell.capture({ "sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", spec.cd,
    table.unpack(argv) })

  local write = out:match("write:(%a+)") or "?"
  local read, why = out:match("read:(%a+):([^\n]*)")
  say("\n  %-34s | %s", "inside the boundary", "a sibling directory")
  say("  %-34s | %s", "write box/hello.txt", "read sibling/secret.txt")
  say("  %-34s | %s", write == "allowed" and "ALLOWED (wrote and read back)" or "DENIED",
    read == "denied" and ("DENIED (" .. why .. ")") or ("ALLOWED: " .. tostring(why)))
  os.execute("rm -rf " .. shell.quote(root))
  if status ~= 0 or write ~= "allowed" or read ~= "denied" then
    say("\nunexpected result (exit %d):\n%s", status, out)
    return 1
  end
  say("\nThe control (the write) succeeded in the same confined shell whose read was denied.")
  return 0
end

-- Part two: a tenant with an egress allowlist (needs root for the test network).
local function egress_part()
  local core = corral.core
  if io.popen("id -u"):read("l") ~= "0" then
    say("\n(egress demo skipped: it builds a test network and needs root)")
    return 0
  end
  say("\ncorral demo — a tenant that may reach pypi.org:8080 and nothing else")
  local n = core.proc.getpid() % 200 + 20
  local ns, veth, ip = "corral-demo-" .. n, "crld" .. n, "10.78." .. n .. ".2"
  local www = assert(core.fs.mkdtemp("/tmp/corral-demo-www-"))
  local function net(cmd) return shell.capture({ "sh", "-c", cmd }) end
  local setup = string.format([[
    set -e
    ip netns add %s; ip link add %s type veth peer name %sp; ip link set %sp netns %s
    ip addr add 10.78.%d.1/24 dev %s; ip link set %s up
    ip -n %s link set lo up; ip -n %s addr add %s/24 dev %sp; ip -n %s link set %sp up
    echo 'hello from the (test) internet' > %s/index.html
    ip netns exec %s busybox httpd -p 8080 -h %s]], ns, veth, veth, veth, ns, n, veth, veth, ns, ns, ip, veth,
    ns, veth, www, ns, www)
  local built, built_status = net(setup)
  local function teardown()
    net(string.format("ip netns pids %s | xargs -r kill; ip link del %s; ip netns del %s", ns, veth, ns))
    os.execute("rm -rf " .. shell.quote(www))
  end
  if built_status ~= 0 then
    say("  could not build the test network: %s", built)
    teardown()
    return 0
  end
  local tenant = [[
  for url in http://pypi.org:8080/ http://evil.example:8080/ http://10.78.]] .. n .. [[.2:8080/; do
    if out=$(curl -sS --max-time 3 "$url" 2>&1); then echo "ALLOWED $url -> $out"
    else echo "DENIED  $url -> ${out#curl: }"; fi
  done]]
  local out = shell.capture({ corral.core.proc.host_executable(), "run", "--allow", "pypi.org:8080",
    "--resolve", "pypi.org=" .. ip, "--internal", "10.78." .. n .. ".0/24", "--", "sh", "-c", tenant })
  teardown()
  for line in out:gmatch("[^\n]+") do say("  %s", line) end
  if not out:find("ALLOWED http://pypi.org", 1, true) or out:find("ALLOWED http://evil", 1, true)
     or out:find("ALLOWED http://10.", 1, true) then
    say("\nunexpected egress result")
    return 1
  end
  say("\nThe allowed name was relayed (control); the other name got NXDOMAIN from the sandbox's own")
  say("responder, and the bare IP was reset by the acceptor — any program, no proxy variables.")
  return 0
end

local status = 0
for _, part in ipairs({ confinement_part, egress_part }) do
  local ok, st = pcall(part)
  if not ok then say("\nthe demo failed: %s", tostring(st)) end
  if status == 0 then status = ok and st or 1 end
end

say("\nThe conformance census of native (`corral conformance` prints every check):")
local report, err = corral.conformance("native")
if not report then
  say("  the suite could not run: %s", tostring(err))
  os.exit(status ~= 0 and status or 1)
end
require("corral.conformance.cli").print_census(report)
if status == 0 and report.census.breached > 0 then status = 1 end
os.exit(status)
