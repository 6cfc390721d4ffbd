/*
 * The rtnetlink verbs a sandbox netns needs: loopback up with default routes through it,
 * veth pairs, addresses, link up and delete, the mark rule of UDP relaying.
 *
 * Every verb takes the target netns as an fd (corral_netns_open, netlink.h) and talks
 * through a netlink socket opened there (corral_netlink_open_in), so the calling thread
 * never changes namespace. All functions return 0 (or a value) or -errno.
 */
#ifndef CORRAL_RTNL_H
#define CORRAL_RTNL_H

#include <stdint.h>

#include "netlink.h"

/* The ifindex of `ifname` in the netns, or -ENODEV. */
int corral_rtnl_link_index(int netns_fd, const char *ifname);

/*
 * Brings `lo` up and adds default routes for IPv4 (with preferred source 127.0.0.1) and
 * IPv6 through it, so that a connect to any address reaches the output hook where nft
 * redirects it. Fails with -EEXIST if a default route is already there.
 */
int corral_rtnl_lo_default_routes(int netns_fd);

/* Creates a veth pair: `host_name` in host_netns_fd, its peer `peer_name` in peer_netns_fd.
 * Both ends start down. */
int corral_rtnl_veth(int host_netns_fd, const char *host_name, int peer_netns_fd,
                     const char *peer_name);

/* Adds addr/prefixlen (family AF_INET: 4 bytes, AF_INET6: 16 bytes, network order) to
 * ifname. IPv6 addresses skip duplicate address detection. */
int corral_rtnl_addr(int netns_fd, const char *ifname, int family, const void *addr, int prefixlen);

int corral_rtnl_link_up(int netns_fd, const char *ifname);

/* Deletes ifname (a veth takes its peer with it). */
int corral_rtnl_link_del(int netns_fd, const char *ifname);

/* A default route in netns_fd via gateway (4 or 16 bytes, by family) on ifname: the
 * sandbox's own routed link, for operators who give it one. Returns 0 or -errno. */
int corral_rtnl_default_via(int netns_fd, int family, const void *gateway, const char *ifname);

/* The priority of corral_rtnl_mark_local's rule: ahead of the main table (32766). */
#define CORRAL_RTNL_MARK_RULE_PRIO 100

/*
 * Makes every packet carrying `mark` local to the netns: for IPv4 and IPv6 a rule
 * `fwmark mark lookup table` and, in `table` (1..251, not main, local or default), a
 * local default route through lo. A datagram the nft ruleset marks is then routed to lo
 * and comes back in there, where TPROXY can hand it to a socket with its destination
 * intact (nft.h, udp_port; TPROXY acts only on packets coming in, and on a local route).
 * Needs lo up. Returns 0 or -errno (-EEXIST when the rule or route is already there,
 * -EINVAL for mark 0 or a reserved table).
 */
int corral_rtnl_mark_local(int netns_fd, uint32_t mark, uint32_t table);

#endif
