/*
 * Sockets that live in another network namespace: the egress acceptor and DNS
 * responder must sit inside the sandbox's netns, because an nft redirect is DNAT to the
 * local machine as that netns sees it and can reach no socket anywhere else.
 *
 * The socket itself comes from corral_ns_socket (ns.h): made on a short-lived thread
 * inside the target netns, and checked to belong to it before it is returned.
 */
#ifndef CORRAL_LISTEN_H
#define CORRAL_LISTEN_H

/*
 * A listening (SOCK_STREAM, backlog SOMAXCONN) or bound (SOCK_DGRAM) socket on
 * addr:port inside the netns netns_fd. addr is numeric: "127.0.0.1", "::1", "::" (dual
 * stack: IPV6_V6ONLY is cleared, so one socket takes IPv4 and IPv6 redirects), …;
 * port 0 lets the kernel choose, and *bound_port (may be NULL) receives the port bound.
 * SO_REUSEADDR is set. Returns a CLOEXEC fd or -errno (see corral_ns_socket in ns.h).
 * A loopback address needs lo up in the netns (-EADDRNOTAVAIL otherwise).
 */
int corral_listen_in_netns(int netns_fd, int type, const char *addr, int port, int *bound_port);

#endif
