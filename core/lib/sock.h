/*
 * TCP sockets: plain helpers for probes and tests (a loopback listener with a
 * kernel-chosen port, a connect with a deadline, an accept with a deadline), and the
 * egress data path's socket verbs: the original destination of a redirected
 * connection, mark-checked upstream sockets, and an immediate reset.
 */
#ifndef CORRAL_SOCK_H
#define CORRAL_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Listens on addr:port (port 0: the kernel chooses); returns a CLOEXEC fd and the bound
 * port in *bound, or -errno. addr is a numeric IPv4 or IPv6 address. */
int corral_tcp_listen(const char *addr, int port, int *bound);

/* Connects to addr:port within timeout_ms; returns a CLOEXEC fd or -errno
 * (-ETIMEDOUT, -ECONNREFUSED, -ENETUNREACH, …). */
int corral_tcp_connect(const char *addr, int port, int timeout_ms);

/* Accepts one connection within timeout_ms; returns a CLOEXEC fd or -errno. */
int corral_tcp_accept(int listen_fd, int timeout_ms);

/* Fills *ss and *len from a numeric IPv4 or IPv6 address (no brackets) and a port in
 * 0..65535. Returns the family (AF_INET or AF_INET6) or -EINVAL. */
int corral_sockaddr_from(const char *ip, int port, struct sockaddr_storage *ss, socklen_t *len);

/* Writes the numeric address of an AF_INET or AF_INET6 sockaddr into buf (IPv6 without
 * brackets; len >= 46 always suffices) and its port into *port. Returns 0 or -errno
 * (-EAFNOSUPPORT for another family, -ENOSPC for a short buffer). */
int corral_sockaddr_text(const struct sockaddr_storage *ss, char *buf, size_t len, int *port);

/*
 * The destination a redirected connection was addressed to before the nft redirect
 * rewrote it, from conntrack: SO_ORIGINAL_DST (SOL_IP) for an IPv4 connection,
 * IP6T_SO_ORIGINAL_DST (SOL_IPV6) for IPv6. The family is taken from the accepted
 * socket's local address, and an IPv4-mapped IPv6 address (a dual-stack listener
 * accepting an IPv4 connection) counts as IPv4. Returns 0 or -errno; -ENOENT means
 * conntrack has no entry (no ruleset in that netns), and every failure is a deny. A
 * connection that was tracked but not translated (a tenant dialling the acceptor's own
 * port) reads back its own destination, the acceptor's address: loopback, to be refused
 * (tests/c/test_listen.c asserts both cases).
 */
int corral_original_dst(int fd, struct sockaddr_storage *out);

/* Sets SO_MARK to mark, reads it back and compares (docs/architecture.md, invariant 5).
 * Returns 0, -errno from the kernel (-EPERM without CAP_NET_ADMIN over the socket's
 * netns), or -EPROTO when the value read back differs. */
int corral_set_mark_checked(int fd, uint32_t mark);

/*
 * Creates a TCP socket for sa's family in the netns netns_fd (-1: the caller's own;
 * the socket is made on a thread that enters it, see listen.h), sets and reads back
 * SO_MARK when mark is not 0, keeps its source port in port_key's slice (NULL: anywhere;
 * see corral_port_slice), then starts a non-blocking connect. Returns a CLOEXEC,
 * O_NONBLOCK fd and sets *in_progress (1: EINPROGRESS, wait for writability and read
 * SO_ERROR; 0: already connected), or -errno and no fd. When step is not NULL it names
 * the step that failed: "setns", "socket", "setsockopt_mark" or "connect".
 */
int corral_connect_marked_start(const struct sockaddr *sa, socklen_t len, uint32_t mark,
                                int netns_fd, const char *port_key, int *in_progress,
                                const char **step);

/*
 * The slice of the local port range a key's connections take their source ports from
 * (port_key above: a sandbox id): at most 4096 ports, placed by a hash of the key. A
 * relay that closes first leaves TIME_WAITs toward its upstream, so one tenant opening
 * short connections to one allowed address could fill the host's whole ephemeral range;
 * within its slice it can only exhaust its own ports.

 * Applied with IP_LOCAL_PORT_RANGE (Linux 6.3); where the kernel lacks it, nothing.
 */
void corral_port_slice(const char *key, unsigned *lo, unsigned *hi);

/*
 * Blocking form: as corral_connect_marked_start, then waits up to timeout_ms (-1: no
 * limit) for the connection, reads the mark back once more, and returns a connected,
 * blocking CLOEXEC fd or -errno and no fd. A mark that cannot be set or does not read
 * back is an error before connect is ever called. mark 0: no mark is set.
 */
int corral_connect_marked(const struct sockaddr *sa, socklen_t len, uint32_t mark, int timeout_ms,
                          int netns_fd);

/* corral_connect_marked, naming the failed step in *step (may be NULL) as above, or
 * "timeout" / "connect" for the wait. */
int corral_connect_marked_ex(const struct sockaddr *sa, socklen_t len, uint32_t mark,
                             int timeout_ms, int netns_fd, const char **step);

/* Closes fd with SO_LINGER {1, 0}, so the peer sees a reset at once instead of an
 * orderly end of stream (the acceptor's deny). The fd is closed in every case; returns
 * 0 or -errno from setsockopt (-ENOTSOCK, …). */
int corral_reset(int fd);

#endif
