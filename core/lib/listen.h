/*
 * Sockets that live in another network namespace: the egress acceptor and DNS
 * responder must sit inside the sandbox's netns, because an nft redirect is DNAT to the
 * local machine as that netns sees it and can reach no socket anywhere else.
 *
 * setns(2) with CLONE_NEWNET moves only the calling thread, and a socket belongs for
 * life to the netns it was created in. So each socket is created on a short-lived
 * thread that enters the target netns and exits (its netns dies with it); the calling
 * thread never changes namespace. Before an fd is returned, SIOCGSKNS on it must name
 * the target netns. There is no fallback: a netns that cannot be entered gives an error
 * and no socket, never a socket in the caller's own netns.
 */
#ifndef CORRAL_LISTEN_H
#define CORRAL_LISTEN_H

/*
 * Creates socket(domain, type | SOCK_CLOEXEC, protocol) inside the netns netns_fd
 * (which must be a network namespace fd; there is no "current netns" value). Returns
 * the fd or -errno: -EINVAL (or -EBADF) when the netns cannot be entered, -EXDEV when
 * the socket turns out not to belong to it.
 */
int corral_socket_in_netns(int netns_fd, int domain, int type, int protocol);

/* 1 when socket fd belongs to the netns netns_fd, 0 when it does not, or -errno. */
int corral_socket_netns_is(int fd, int netns_fd);

/*
 * A listening (SOCK_STREAM, backlog SOMAXCONN) or bound (SOCK_DGRAM) socket on
 * addr:port inside the netns netns_fd. addr is numeric: "127.0.0.1", "::1", "::" (dual
 * stack: IPV6_V6ONLY is cleared, so one socket takes IPv4 and IPv6 redirects), …;
 * port 0 lets the kernel choose, and *bound_port (may be NULL) receives the port bound.
 * SO_REUSEADDR is set. Returns a CLOEXEC fd or -errno (see corral_socket_in_netns).
 * A loopback address needs lo up in the netns (-EADDRNOTAVAIL otherwise).
 */
int corral_listen_in_netns(int netns_fd, int type, const char *addr, int port, int *bound_port);

#endif
