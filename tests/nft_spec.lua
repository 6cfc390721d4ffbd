-- core.nft and core.rtnl against the real kernel, in throwaway iproute2 namespaces
-- (corral-t-<pid>-<n>, always deleted in after_each). The nft and ip CLIs are only used
-- here, to read back what the bindings programmed (the control) and to tamper with it.
-- 192.0.2.0/24 is a documentation range that exists only on the veth between two test
-- namespaces.
local core = require "corral.core"
local nft, rtnl = core.nft, core.rtnl

local EPROTO, ENOENT, EEXIST = 71, core.errno.ENOENT, core.errno.EEXIST

local h = require "helpers"
local testns = require "netns"
local run, is_root = testns.run, testns.is_root
local netns, cleanup = testns.netns, testns.cleanup

local plan = { dns_port = 5353, acceptor_port = 4000 }

describe("core.nft #root #netns", function()
  before_each(function()
    if not is_root then pending("needs root: network namespaces and nftables") end
  end)
  after_each(cleanup)

  it("applies one table, reads back the same, notices tampering, deletes it", function()
    local name, ns = netns()
    local nsx = "ip netns exec " .. name .. " "

    assert.is_true(nft.apply(ns, plan))
    local ok, out = run(nsx .. "nft list table inet corral")
    assert.is_true(ok, out)
    assert.is_true(h.in_order(out, {
      "chain nat_out", "type nat hook output priority -100",
      "meta mark 0x0000002a return", "ip daddr 127.0.0.0/8 return", "ip6 daddr ::1 return",
      "udp dport 53 redirect to :5353", "tcp dport 53 redirect to :5353",
      "meta l4proto tcp redirect to :4000",
      "chain filter_out", "policy drop;",
      "ct state established,related meta l4proto != udp accept", 'oif "lo" ct state established,related accept',
      "meta mark 0x0000002a accept",
      "ct status dnat accept", 'oif "lo" ip daddr 127.0.0.0/8 accept',
      'oif "lo" ip6 daddr ::1 accept', "meta l4proto tcp reject with tcp reset",
      "reject with icmpx admin-prohibited",
    }, true))
    assert.is_true(nft.verify(ns, plan))

    local r, msg, err = nft.apply(ns, plan)
    assert.is_nil(r)
    assert.equal(EEXIST, err)
    assert.matches("^nft apply: ", msg)

    -- A rule added behind our back.
    assert.is_true((run(nsx .. "nft add rule inet corral nat_out meta l4proto udp return")))
    r, msg, err = nft.verify(ns, plan)
    assert.is_nil(r)
    assert.equal(EPROTO, err)
    assert.matches("^nft verify: ", msg)

    assert.is_true(nft.delete(ns))
    ok = run(nsx .. "nft list table inet corral")
    assert.is_false(ok)
    r, msg, err = nft.verify(ns, plan)
    assert.is_nil(r)
    assert.matches("^nft verify: ", msg)
    assert.equal(ENOENT, err)
  end)

  it("creates nothing when one message of the batch is bad", function()
    local name, ns = netns()
    local bad = { dns_port = 5353, acceptor_port = 4000, test_bad_message = true }
    local r, _, err = nft.apply(ns, bad)
    assert.is_nil(r)
    assert.equal(ENOENT, err)
    local ok, out = run("ip netns exec " .. name .. " nft list ruleset")
    assert.is_true(ok)
    assert.equal("", (out:gsub("%s", "")))

    -- Control: the same batch without it, under a custom table name and mark.
    local good = { dns_port = 5353, acceptor_port = 4000, table = "sbx", mark = 7 }
    assert.is_true(nft.apply(ns, good))
    ok, out = run("ip netns exec " .. name .. " nft list ruleset")
    assert.is_true(ok)
    assert.matches("table inet sbx", out, 1, true)
    assert.matches("meta mark 0x00000007 return", out, 1, true)
    assert.is_true(nft.verify(ns, good))
    assert.is_true(nft.delete(ns, "sbx"))
  end)

  it("records each SYN it refuses by destination and port, read without a packet waking anyone", function()
    local name, ns = netns()
    assert.is_true(rtnl.lo_default_routes(ns))
    local p = { dns_port = 5353, acceptor_port = 4000, tcp_ports = { 443 } }
    assert.is_true(nft.apply(ns, p))
    local list, total = nft.refused(ns)
    assert.are.same({}, list)
    assert.are.equal(0, total)
    -- documentation addresses, routed to lo inside this throwaway netns only
    local nsx = "ip netns exec " .. name .. " "
    run(nsx .. "sh -c 'nc -z -w 1 192.0.2.1 9443; nc -z -w 1 192.0.2.1 9443; nc -z -w 1 2001:db8::1 22; " ..
      "nc -z -w 1 192.0.2.1 443; echo x | nc -u -w 1 192.0.2.1 9443'")
    list, total = nft.refused(ns)
    local by = {}
    for _, r in ipairs(list) do by[r.proto .. " " .. core.inet.format(r.ip) .. " " .. r.port] = r.count end
    -- 443 went to the redirect; a datagram is refused (and kept apart from the same port's SYNs)
    assert.are.same({ ["tcp 192.0.2.1 9443"] = 2, ["tcp 2001:db8::1 22"] = 1, ["udp 192.0.2.1 9443"] = 1 }, by)
    assert.are.equal(3, #list) -- each destination once
    assert.are.equal(4, total)
    -- the counts are the traffic's: the read-back still matches the plan
    assert.is_true(nft.verify(ns, p))
    -- control: with every port redirected nothing is refused at the SYN
    assert.is_true(nft.apply(ns, { dns_port = 5353, acceptor_port = 4000, replace = true }))
    run(nsx .. "nc -z -w 1 192.0.2.1 9443")
    list, total = nft.refused(ns)
    assert.are.same({}, list)
    assert.are.equal(0, total)
  end)

  it("rejects malformed plans and fds as argument errors", function()
    local _, ns = netns()
    assert.has_error(function() nft.apply(ns, { dns_port = 0, acceptor_port = 4000 }) end)
    assert.has_error(function() nft.apply(ns, { dns_port = 53, acceptor_port = 70000 }) end)
    assert.has_error(function() nft.apply(ns, { dns_port = 53, acceptor_port = 1, mark = 0 }) end)
    assert.has_error(function() nft.apply(ns, { dns_port = 53, acceptor_port = 1, table = "" }) end)
    assert.has_error(function() nft.apply(42, plan) end)
    local closed = assert(rtnl.netns_open("/proc/self/ns/net"))
    closed:close()
    assert.has_error(function() nft.apply(closed, plan) end)
    -- Control: the same call with a good plan and an open fd.
    assert.is_true(nft.apply(ns, plan))
  end)
end)

describe("core.rtnl #root #netns", function()
  before_each(function()
    if not is_root then pending("needs root: network namespaces") end
  end)
  after_each(cleanup)

  it("opens only network namespaces", function()
    local r, _, err = rtnl.netns_open("/")
    assert.is_nil(r)
    assert.equal(core.errno.EINVAL, err)
    local fd = assert(rtnl.netns_open("/proc/self/ns/net"))
    fd:close()
  end)

  it("brings lo up with default routes through it", function()
    local name, ns = netns()
    local _, before = run("ip -n " .. name .. " route show default")
    assert.equal("", before)
    assert.is_true(rtnl.lo_default_routes(ns))
    assert.equal(1, rtnl.link_index(ns, "lo"))
    local _, v4 = run("ip -n " .. name .. " route show default")
    local _, v6 = run("ip -n " .. name .. " -6 route show default")
    assert.matches("default dev lo proto static scope link src 127.0.0.1", v4, 1, true)
    assert.matches("default dev lo", v6, 1, true)
    local _, link = run("ip -n " .. name .. " link show lo")
    assert.matches("UP", link, 1, true)
    local r, _, err = rtnl.lo_default_routes(ns)
    assert.is_nil(r)
    assert.equal(EEXIST, err)
  end)

  it("joins two namespaces with a veth that carries a ping, then deletes it", function()
    local a, nsa = netns()
    local b, nsb = netns()
    assert.is_true(rtnl.veth(nsa, "corral-t0a", nsb, "corral-t0b"))
    assert.is_true(rtnl.addr(nsa, "corral-t0a", "192.0.2.1", 24))
    assert.is_true(rtnl.addr(nsb, "corral-t0b", "192.0.2.2", 24))
    assert.is_true(rtnl.addr(nsa, "corral-t0a", "2001:db8::1", 64))
    -- Down: no reply.
    assert.is_false((run("ip netns exec " .. a .. " busybox ping -c1 -W1 192.0.2.2")))
    assert.is_true(rtnl.link_up(nsa, "corral-t0a"))
    assert.is_true(rtnl.link_up(nsb, "corral-t0b"))
    local ok, out = run("ip netns exec " .. a .. " busybox ping -c1 -W1 192.0.2.2")
    assert.is_true(ok, out)
    local _, addrs = run("ip -n " .. a .. " addr show corral-t0a")
    assert.matches("inet 192.0.2.1/24", addrs, 1, true)
    assert.matches("inet6 2001:db8::1/64", addrs, 1, true)

    assert.is_true(rtnl.link_del(nsa, "corral-t0a"))
    local r, _, err = rtnl.link_index(nsb, "corral-t0b")
    assert.is_nil(r)
    assert.equal(19, err) -- ENODEV: the peer went with it
    assert.is_false((run("ip -n " .. b .. " link show corral-t0b")))
  end)

  it("rejects bad addresses as argument errors", function()
    local _, ns = netns()
    assert.has_error(function() rtnl.addr(ns, "lo", "not-an-address", 8) end)
    assert.has_error(function() rtnl.addr(ns, "lo", "192.0.2.9", 33) end)
    -- Control: a good one.
    assert.is_true(rtnl.addr(ns, "lo", "192.0.2.9", 32))
  end)
end)
