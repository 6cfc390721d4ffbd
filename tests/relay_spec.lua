-- The egress data plane from Lua: core.relay loops, core.listen.in_netns,
-- core.sock.original_dst, core.sock.connect_marked and core.sock.reset, against real sockets on
-- loopback and in throwaway iproute2 namespaces (corral-t-<pid>-<n>, always deleted in
-- after_each). 203.0.113.0/24 and 2001:db8::/32 are documentation ranges that exist only
-- through the redirect inside a test netns whose only link is lo.
local core = require "corral.core"
local relay, rtnl, nft = core.relay, core.rtnl, core.nft

local ECONNREFUSED, EINVAL, EPERM = core.errno.ECONNREFUSED, core.errno.EINVAL, core.errno.EPERM
local ECONNRESET, ETIMEDOUT = 104, 110

local testns = require "netns"
local run, is_root = testns.run, testns.is_root
local netns, cleanup = testns.netns, testns.cleanup

-- A connected pair of TCP sockets on loopback.
local function pair()
  local l, port = assert(core.sock.listen("127.0.0.1", 0))
  local x = assert(core.sock.connect("127.0.0.1", port, 1))
  local y = assert(core.sock.accept(l, 1))
  l:close()
  return x, y
end

-- Every event a loop returned, in order, whichever helper ran it.
local seen = setmetatable({}, { __mode = "k" })
local function step(loop, seconds)
  local list = seen[loop] or {}
  seen[loop] = list
  for _, e in ipairs(assert(loop:run(seconds))) do list[#list + 1] = e end
  return list
end

-- Runs the loop until pred(event) holds for one of its events.
local function wait_event(loop, pred, seconds)
  for _ = 1, math.floor((seconds or 2) * 100) + 1 do
    for _, e in ipairs(step(loop, 0)) do if pred(e) then return e end end
    step(loop, 0.01)
  end
  return nil
end

-- Receives up to n bytes from fd while the loop runs ("" is the end of stream).
local function recv(loop, fd, n)
  for _ = 1, 300 do
    step(loop, 0.005)
    local data, msg, err = core.sock.recv(fd, n or 65536, 0)
    if data then return data end
    if err ~= ETIMEDOUT then return nil, msg, err end
  end
  return nil, "timed out", ETIMEDOUT
end

local function recv_all(loop, fd)
  local parts = {}
  while true do
    local data, msg, err = recv(loop, fd, 65536)
    if not data then return nil, msg, err end
    if data == "" then return table.concat(parts) end
    parts[#parts + 1] = data
  end
end

describe("core.relay", function()
  it("relays both ways with half-close, and releases the fds into the loop", function()
    local loop <close> = relay.new()
    assert.is_true(math.type(loop:fileno()) == "integer")
    local c, a = pair()
    local b, s = pair()
    local id = assert(loop:add_pair(a, b, { key = "sb-1" }))
    assert.equal("corral.fd (closed)", tostring(a))
    assert.equal("corral.fd (closed)", tostring(b))
    assert.equal(1, loop:count())
    assert.equal(1, loop:count("sb-1"))
    assert.equal(0, loop:count("sb-2"))

    local request = ("GET / HTTP/1.0\r\n\r\n"):rep(1000)
    assert.equal(#request, core.sock.send(c, request))
    assert.is_true(core.sock.shutdown(c, "w"))
    assert.equal(request, recv_all(loop, s))
    -- The client has stopped writing and still receives the reply.
    assert.equal(5, core.sock.send(s, "reply"))
    s:close()
    assert.equal("reply", recv_all(loop, c))
    local e = wait_event(loop, function(ev) return ev.id == id end)
    assert.same({ id = id, kind = "closed", up = #request, down = 5, err = 0 }, e)
    assert.equal(0, loop:count())
    c:close()
  end)

  it("propagates a reset, where an orderly close stays orderly", function()
    local loop <close> = relay.new()
    -- The server resets; the client gets ECONNRESET.
    local c, a = pair()
    local b, s = pair()
    local id = loop:add_pair(a, b)
    assert.is_true(core.sock.reset(s))
    assert.equal("corral.fd (closed)", tostring(s))
    local data, msg, err = recv(loop, c, 16)
    assert.is_nil(data)
    assert.equal(ECONNRESET, err, msg)
    local e = wait_event(loop, function(ev) return ev.id == id end)
    assert.equal("closed", e.kind)
    assert.equal(ECONNRESET, e.err)
    assert.is_string(e.msg)
    c:close()
    -- Control, after it, on the same loop: the server closes; the client reads the end
    -- of stream.
    c, a = pair()
    b, s = pair()
    loop:add_pair(a, b)
    s:close()
    assert.equal("", recv(loop, c))
    c:close()
  end)

  it("closes an idle connection and keeps a busy one", function()
    local loop <close> = relay.new()
    local c1, a1 = pair()
    local b1, s1 = pair()
    local c2, a2 = pair()
    local b2, s2 = pair()
    local quiet = loop:add_pair(a1, b1, { idle = 0.25 })
    local busy = loop:add_pair(a2, b2, { idle = 0.25 })
    for _ = 1, 8 do
      core.sock.send(c2, "x")
      assert.equal("x", recv(loop, s2, 1))
      wait_event(loop, function() return false end, 0.05)
    end
    local e = wait_event(loop, function(ev) return ev.id == quiet end)
    assert.equal("closed", e.kind)
    assert.equal(ETIMEDOUT, e.err)
    -- Control: the busy one moved a byte every 50 ms for 400 ms and is still there.
    assert.is_nil(wait_event(loop, function(ev) return ev.id == busy end, 0))
    assert.equal(1, loop:count())
    local _, _, err = core.sock.recv(c1, 1, 0)
    assert.equal(ECONNRESET, err)
    for _, fd in ipairs({ c1, s1, c2, s2 }) do fd:close() end
  end)

  -- The issue's 10-minute idle connection is too long a wait for the suite: instead, the
  -- kernel's own timer shows nothing is scheduled that could cut a connection without an
  -- idle limit (tests/c/test_relay.c checks the same in C), and egress_conn_spec runs
  -- --idle end to end with seconds.
  it("sets no timer without an idle limit; one with it (the default keeps a connection forever)", function()
    local loop <close> = relay.new()
    local c1, a1 = pair()
    local b1, s1 = pair()
    loop:add_pair(a1, b1) -- idle 0, the default
    core.sock.send(c1, "x")
    assert.equal("x", recv(loop, s1, 1))
    assert.equal(0, loop:timer())
    local c2, a2 = pair()
    local b2, s2 = pair()
    loop:add_pair(a2, b2, { idle = 600 }) -- control: a limit arms the timer for it
    local left = loop:timer()
    assert.is_true(left > 590 and left <= 600, tostring(left))
    for _, fd in ipairs({ c1, s1, c2, s2 }) do fd:close() end
  end)

  it("holds a client's bytes until released, while upstream's reach it; peek reads without taking", function()
    local loop <close> = relay.new()
    local c, a = pair()
    local b, s = pair()
    local id = assert(loop:add_pair(a, b, { hold = true }))
    local _, _, err = loop:peek(id)
    assert.equal(core.errno.EAGAIN, err)
    core.sock.send(s, "banner\n")
    assert.equal("banner\n", recv(loop, c, 64))              -- upstream to client flows
    core.sock.send(c, "GET / HTTP/1.1\r\n")
    assert.truthy(wait_event(loop, function(ev) return ev.id == id and ev.kind == "held" end))
    wait_event(loop, function() return false end, 0.2)          -- the loop runs meanwhile
    local _, _, none = core.sock.recv(s, 64, 0)                 -- the attempt: nothing reached upstream
    assert.equal(ETIMEDOUT, none)
    local data, ended = loop:peek(id)
    assert.equal("GET / HTTP/1.1\r\n", data)
    assert.is_false(ended)
    assert.is_true(loop:release(id))
    assert.equal("GET / HTTP/1.1\r\n", recv(loop, s, 64))    -- control: released, relayed from byte one
    local _, _, notheld = loop:peek(id)
    assert.equal(EINVAL, notheld)
    assert.has_error(function() loop:add_pair(c, s, { hold = "yes" }) end)
    for _, fd in ipairs({ c, s }) do fd:close() end
  end)

  it("connects upstream, or fails and resets the client", function()
    local loop <close> = relay.new()
    -- Refused: a port whose listener is gone.
    local gone, port = assert(core.sock.listen("127.0.0.1", 0))
    gone:close()
    local c, a = pair()
    local id = assert(loop:add_connect(a, "127.0.0.1", port))
    local e = wait_event(loop, function(ev) return ev.id == id end)
    assert.equal("failed", e.kind)
    assert.equal(ECONNREFUSED, e.err)
    local data, _, err = recv(loop, c, 1)
    assert.is_nil(data)
    assert.equal(ECONNRESET, err)
    c:close()

    -- Control, after it, on the same loop: a listening upstream is connected and relayed.
    local up
    up, port = assert(core.sock.listen("127.0.0.1", 0))
    c, a = pair()
    assert.equal(5, core.sock.send(c, "early"))
    id = assert(loop:add_connect(a, "127.0.0.1", port, { mark = 42, timeout = 1 }))
    assert.is_not_nil(wait_event(loop, function(ev)
      return ev.id == id and ev.kind == "connected"
    end))
    local s = assert(core.sock.accept(up, 1))
    assert.equal("early", recv(loop, s, 5))
    s:close()
    c:close()
    e = wait_event(loop, function(ev) return ev.id == id and ev.kind ~= "connected" end)
    assert.same({ id = id, kind = "closed", up = 5, down = 0, err = 0 }, e)
    up:close()

    -- A malformed address is an argument error, not a failure.
    c, a = pair()
    assert.has_error(function() loop:add_connect(a, "localhost", 80) end)
    assert.has_error(function() loop:add_connect(a, "127.0.0.1", 0) end)
    assert.has_error(function() loop:add_pair(a, a) end)
    a:close()
    c:close()
  end)

  it("races a list of addresses: all refusing fails, one listening among them wins", function()
    local loop <close> = relay.new()
    local gone, dead = assert(core.sock.listen("127.0.0.1", 0))
    gone:close()
    -- every address refuses (::1 and 127.0.0.1, nothing on that port): failed, reset
    local c, a = pair()
    local id = assert(loop:add_connect(a, { "::1", "127.0.0.1" }, dead, { attempt_delay = 1 }))
    local e = wait_event(loop, function(ev) return ev.id == id end)
    assert.equal("failed", e.kind)
    assert.equal(ECONNREFUSED, e.err)
    local _, _, err = recv(loop, c, 1)
    assert.equal(ECONNRESET, err)
    c:close()
    -- control: the same race with a listener on 127.0.0.1 only; ::1 refuses first and
    -- hands over at once: with an hour's head start, only that handover connects within
    -- the wait
    local up, port = assert(core.sock.listen("127.0.0.1", 0))
    c, a = pair()
    id = assert(loop:add_connect(a, { "::1", "127.0.0.1" }, port, { attempt_delay = 3600 }))
    e = wait_event(loop, function(ev) return ev.id == id end, 10)
    assert.truthy(e, "no handover: the second address waited for the head start")
    assert.equal("connected", e.kind)
    assert.equal(2, e.addr)
    local s = assert(core.sock.accept(up, 1))
    assert.equal(2, core.sock.send(c, "he"))
    assert.equal("he", recv(loop, s, 2))
    -- both legs probe with TCP keepalive (ss shows the timer on each relayed socket)
    local ss = io.popen("ss -tnoH state established '( sport = :" .. port .. " or dport = :" .. port .. " )'")
    local text = ss:read("a")
    ss:close()
    local _, upstream_keepalive = text:gsub("timer:%(keepalive", "")
    assert.truthy(upstream_keepalive >= 1, text) -- the relay's upstream end
    s:close()
    c:close()
    up:close()
    assert.has_error(function() loop:add_connect(a, {}, 80) end)
    assert.has_error(function() loop:add_connect(a, { "localhost" }, 80) end)
  end)

  it("keeps TCP keepalive on both legs of a pair", function()
    local loop <close> = relay.new()
    -- a: accepted on port pa (its local port); b: connected to port pb (its peer's)
    local la, pa = assert(core.sock.listen("127.0.0.1", 0))
    local c = assert(core.sock.connect("127.0.0.1", pa, 1))
    local a = assert(core.sock.accept(la, 1))
    local lb, pb = assert(core.sock.listen("127.0.0.1", 0))
    local b = assert(core.sock.connect("127.0.0.1", pb, 1))
    local s = assert(core.sock.accept(lb, 1))
    la:close()
    lb:close()
    local function timers(filter)
      local p = io.popen("ss -tnoH state established '( " .. filter .. " )'")
      local text = p:read("a")
      p:close()
      return text
    end
    -- before the loop takes it the socket has no keepalive timer: the timer is the loop's doing
    assert.is_nil(timers("sport = :" .. pa):find("keepalive", 1, true))
    loop:add_pair(a, b)
    assert.matches("timer:%(keepalive", timers("sport = :" .. pa)) -- the client leg
    local up = timers("dport = :" .. pb)
    assert.matches("timer:%(keepalive", up)                       -- the upstream leg
    c:close()
    s:close()
  end)

  it("refuses the connection over a key's cap, and only for that key", function()
    local loop <close> = relay.new()
    local keep = {}
    local function add(key)
      local c, a = pair()
      local b, s = pair()
      keep[#keep + 1] = c
      keep[#keep + 1] = s
      return c, loop:add_pair(a, b, { key = key, max_per_key = 2 })
    end
    assert.is_not_nil(select(2, add(7)))
    assert.is_not_nil(select(2, add(7)))
    local c3, id, msg, err = add(7)
    assert.is_nil(id)
    assert.equal(relay.EUSERS, err)
    assert.matches("^relay: ", msg)
    local _, _, rerr = recv(loop, c3, 1)
    assert.equal(ECONNRESET, rerr)
    -- Control: another key still has room; the integer key and its string are one key.
    assert.is_not_nil(select(2, add("other")))
    assert.equal(2, loop:count(7))
    assert.equal(2, loop:count("7"))
    assert.equal(3, loop:count())
    -- add_connect checks the cap before dialling.
    local c, a = pair()
    local r2, _, e2 = loop:add_connect(a, "127.0.0.1", 9, { key = 7, max_per_key = 2 })
    assert.is_nil(r2)
    assert.equal(relay.EUSERS, e2)
    c:close()
    assert.has_error(function() loop:add_pair(a, a, { max_per_key = 1 }) end)
    for _, fd in ipairs(keep) do fd:close() end
  end)

  it("relays while poll waits; poll returns for another fd, or for an event that waits for run", function()
    local loop <close> = relay.new()
    local c, a = pair()
    local b, s = pair()
    local id = assert(loop:add_pair(a, b))
    local x, y = pair() -- an fd of the caller's
    assert.equal(5, core.sock.send(c, "hello"))
    -- nothing but the relay's own work: the bytes cross inside poll, which returns
    -- empty at its timeout, run never called
    assert.same({}, loop:poll({ loop, y }, 0.2))
    assert.equal("hello", (core.sock.recv(s, 64, 0)))
    -- the caller's fd readable: its index
    assert.equal(1, core.sock.send(x, "!"))
    assert.same({ 2 }, loop:poll({ loop, y }, 5))
    assert.equal("!", (core.sock.recv(y, 1, 0)))
    -- both ends closed: the closed event waits for run, and poll says so by the loop's index
    c:close()
    s:close()
    assert.same({ 1 }, loop:poll({ loop, y }, 5))
    local e = assert(loop:run(0))[1]
    assert.same({ id = id, kind = "closed", up = 5, down = 0, err = 0 }, e)
    x:close()
    y:close()
  end)

  it("is done with close: idempotent, and a closed loop is an argument error", function()
    local loop = relay.new()
    local c, a = pair()
    local b, s = pair()
    loop:add_pair(a, b)
    assert.same({}, loop:run(0))
    loop:close()
    loop:close()
    assert.equal("corral.relay (closed)", tostring(loop))
    -- Closing the loop reset what it held.
    local _, _, err = core.sock.recv(c, 1, 1)
    assert.equal(ECONNRESET, err)
    assert.has_error(function() loop:run(0) end)
    c:close()
    s:close()
  end)
end)

describe("core.listen.in_netns and core.sock.original_dst #root #netns", function()
  before_each(function()
    if not is_root then pending("needs root: network namespaces and nftables") end
  end)
  after_each(cleanup)

  it("puts the listener in the netns: refused from the host, accepted inside", function()
    local _, ns = netns()
    assert.is_true(rtnl.lo_default_routes(ns))
    local l, port = assert(core.listen.in_netns(ns, "tcp", "127.0.0.1", 0))
    -- The load-bearing half: that port does not exist in the host netns.
    local r, _, err = core.sock.connect("127.0.0.1", port, 1)
    if r then r:close() end
    -- (another process may by chance listen on the same port here; then this proves
    -- nothing and must not pass)
    assert.is_nil(r)
    assert.equal(ECONNREFUSED, err)
    local c = assert(core.sock.connect_marked("127.0.0.1", port, 0, 1, ns))
    local a = assert(core.sock.accept(l, 1))
    assert.equal(2, core.sock.send(c, "in"))
    assert.equal("in", core.sock.recv(a, 2, 1))
    a:close()
    c:close()
    l:close()
  end)

  it("binds nothing when the namespace cannot be entered", function()
    local _, ns = netns()
    local notns = assert(core.sock.listen("127.0.0.1", 0))
    local l, msg, err = core.listen.in_netns(notns, "tcp", "::", 0)
    assert.is_nil(l)
    assert.equal(EINVAL, err)
    assert.matches("^listen_in_netns: ", msg)
    notns:close()
    -- Control: the same call with a netns fd.
    local u, port = assert(core.listen.in_netns(ns, "udp", "::", 0))
    assert.is_true(port > 0)
    u:close()
    assert.has_error(function() core.listen.in_netns(ns, "sctp", "::", 0) end)
    assert.has_error(function() core.listen.in_netns(ns, "tcp", "any", 0) end)
  end)

  it("reads the original destination of a redirected connection, v4 and v6", function()
    local _, ns = netns()
    assert.is_true(rtnl.lo_default_routes(ns))
    local l, port = assert(core.listen.in_netns(ns, "tcp", "::", 0))
    -- Before the ruleset nothing is translated: no original destination, a deny.
    local c = assert(core.sock.connect_marked("127.0.0.1", port, 0, 1, ns))
    local a = assert(core.sock.accept(l, 1))
    local ip, msg, err = core.sock.original_dst(a)
    assert.is_nil(ip)
    assert.equal(core.errno.ENOENT, err, msg)
    a:close()
    c:close()

    assert.is_true(nft.apply(ns, { dns_port = port, acceptor_port = port }))
    for _, dst in ipairs({ { "203.0.113.7", 80 }, { "2001:db8::7", 443 } }) do
      c = assert(core.sock.connect_marked(dst[1], dst[2], 0, 1, ns))
      a = assert(core.sock.accept(l, 1))
      local oip, oport = core.sock.original_dst(a)
      assert.equal(dst[1], oip)
      assert.equal(dst[2], oport)
      a:close()
      c:close()
    end
    -- Control: the mark exempts a socket from the redirect, so a marked connect to the
    -- same address is not caught (it goes nowhere and times out).
    local m, _, merr = core.sock.connect_marked("203.0.113.7", 80, 42, 0.2, ns)
    assert.is_nil(m)
    assert.equal(ETIMEDOUT, merr)
    l:close()
  end)
end)

describe("core.sock.connect_marked #root", function()
  it("returns a marked socket, and no socket when the mark cannot be set", function()
    local l, port = assert(core.sock.listen("127.0.0.1", 0))
    -- From a host process without CAP_NET_ADMIN / CAP_NET_RAW (still uid 0): the message
    -- names the step, and the unmarked control in that process connects after it.
    local host = os.getenv("CORRAL_HOST") or "build/corral"
    local script = ([[
      local core = require "corral.core"
      local fd, msg, err = core.sock.connect_marked("127.0.0.1", %d, 42, 1)
      print(tostring(fd), msg, err)
      print(core.sock.connect_marked("127.0.0.1", %d, 0, 1) and "unmarked ok" or "unmarked failed")
    ]]):format(port, port)
    local ok, out = run("setpriv --inh-caps=-net_admin,-net_raw --bounding-set=-net_admin,-net_raw "
      .. host .. " -e '" .. script .. "'")
    assert.is_true(ok, out)
    assert.matches("nil\tsetsockopt_mark: Operation not permitted\t" .. EPERM, out, 1, true)
    assert.matches("unmarked ok", out, 1, true)
    -- Control, after it: the same marked call with CAP_NET_ADMIN.
    local fd = assert(core.sock.connect_marked("127.0.0.1", port, 42, 1))
    assert.is_not_nil(core.sock.accept(l, 1))
    fd:close()
    l:close()
  end)
end)
