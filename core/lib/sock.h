/*
 * Plain TCP sockets for probes and tests: a listener on a loopback address with a
 * kernel-chosen port, and a connect with a deadline. (Mark-checked and setns sockets
 * for the egress plane build on these.)
 */
#ifndef CORRAL_SOCK_H
#define CORRAL_SOCK_H

/* Listens on addr:port (port 0: the kernel chooses); returns a CLOEXEC fd and the bound
 * port in *bound, or -errno. addr is a numeric IPv4 or IPv6 address. */
int corral_tcp_listen(const char *addr, int port, int *bound);

/* Connects to addr:port within timeout_ms; returns a CLOEXEC fd or -errno
 * (-ETIMEDOUT, -ECONNREFUSED, -ENETUNREACH, …). */
int corral_tcp_connect(const char *addr, int port, int timeout_ms);

/* Accepts one connection within timeout_ms; returns a CLOEXEC fd or -errno. */
int corral_tcp_accept(int listen_fd, int timeout_ms);

#endif
