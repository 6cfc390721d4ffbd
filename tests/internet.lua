-- A test "internet": a network namespace of the test's own, reached from the host over a
-- veth pair in a 10.x /24 routed only there, with an HTTP server and a TCP echo on it.
-- Nothing here sends traffic anywhere else. `stop` removes the netns, the link and the
-- servers, even after a failed test.
local h = require "helpers"

local M = {}

local function sh(fmt, ...)
  local out, status = h.sh(string.format(fmt, ...))
  return out, status
end

--- Starts the internet; returns {ns, host_ip, ip, ip6, http_port, echo_port, udp_log, blob, blob_sha}.
function M.start()
  -- each of up to 4 shards of scripts/run-tests has its own 50 subnets (its internet runs beside the other's)
  local shard = math.tointeger(tonumber(os.getenv("CORRAL_SHARD") or "0")) or 0
  local n = tonumber(h.sh("echo $$"):match("%d+")) % 50 + 20 + 50 * (shard % 4)
  local net = {
    ns = "corral-t-inet-" .. n, veth = "crlh" .. n, peer = "crli" .. n,
    host_ip = "10.77." .. n .. ".1", ip = "10.77." .. n .. ".2", cidr = "10.77." .. n .. ".0/24",
    ip6 = "fd77:" .. n .. "::2", host_ip6 = "fd77:" .. n .. "::1", cidr6 = "fd77:" .. n .. "::/64",
    http_port = 8080, echo_port = 9007, udp_port = 9443,
    dir = h.tmpdir("inet"),
  }
  -- readable to the unprivileged re-run of the tests (its servers' logs)
  assert(os.execute("chmod 0755 " .. h.quote(net.dir)))
  M.stop({ ns = net.ns, veth = net.veth }) -- a leftover from an interrupted run
  local script = [[
    set -e
    ip netns add "$NS"
    ip link add "$VETH" type veth peer name "$PEER"
    ip link set "$PEER" netns "$NS"
    ip addr add "$HOST_IP/24" dev "$VETH"
    ip -6 addr add "$HOST_IP6/64" dev "$VETH" nodad
    ip link set "$VETH" up
    ip netns exec "$NS" ip link set lo up
    ip netns exec "$NS" ip addr add "$IP/24" dev "$PEER"
    ip netns exec "$NS" ip -6 addr add "$IP6/64" dev "$PEER" nodad
    ip netns exec "$NS" ip link set "$PEER" up
    head -c 3000000 /dev/urandom > "$DIR/blob"
    echo hello-from-the-internet > "$DIR/index.html"
    ip netns exec "$NS" busybox httpd -p "$HTTP" -h "$DIR"
    ip netns exec "$NS" socat TCP6-LISTEN:"$ECHO",ipv6only=0,fork,reuseaddr EXEC:cat >/dev/null 2>&1 &
    ip netns exec "$NS" socat -u UDP6-RECV:"$UDP",ipv6only=0 OPEN:"$DIR/udp.log",creat,append >/dev/null 2>&1 &
    ip netns exec "$NS" socat -u TCP6-LISTEN:9444,ipv6only=0,fork,reuseaddr \
      OPEN:"$DIR/tcp9444.log",creat,append >/dev/null 2>&1 &
  ]]
  local out, status = h.capture({ "env", "NS=" .. net.ns, "VETH=" .. net.veth, "PEER=" .. net.peer,
    "HOST_IP=" .. net.host_ip, "HOST_IP6=" .. net.host_ip6, "IP=" .. net.ip, "IP6=" .. net.ip6,
    "HTTP=" .. net.http_port, "ECHO=" .. net.echo_port, "UDP=" .. net.udp_port, "DIR=" .. net.dir,
    "sh", "-c", script })
  assert(status == 0, "internet set-up failed: " .. out)
  net.blob_sha = h.capture({ "sha256sum", net.dir .. "/blob" }):match("^(%x+)")
  assert(h.wait_for(function()
    return h.sh(string.format("ip netns exec %s ss -ltn | grep -c ':%d '", net.ns, net.echo_port)):match("^1")
  end, 5), "echo server did not start")
  return net
end

--- The internet as text, for a test run in another process (`decode`).
function M.encode(net)
  return require("dkjson").encode(net)
end

--- The internet `encode` wrote, for a process that uses it but did not start it.
function M.decode(text)
  return assert(require("dkjson").decode(text), "not an internet: " .. tostring(text))
end

--- Removes everything start made.
function M.stop(net)
  sh("ip netns pids %s 2>/dev/null | xargs -r kill 2>/dev/null; ip link del %s 2>/dev/null; " ..
     "ip netns del %s 2>/dev/null; true", net.ns, net.veth, net.ns)
  if net.dir then h.rmrf(net.dir) end
end

return M
