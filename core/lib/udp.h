/* Datagram I/O with text addresses, for the in-namespace DNS responder. */
#ifndef CORRAL_UDP_H
#define CORRAL_UDP_H

#include <stddef.h>
#include <sys/types.h>

/* Receives one datagram without blocking: its length, with the sender's address
 * (text, ≤ 46 bytes) and port, and the local address it arrived at (text, ≤ 46 bytes;
 * "" when unknown); -EAGAIN when none is waiting, or -errno. */
ssize_t corral_udp_recv(int fd, void *buf, size_t cap, char *addr, int *port, char *local);

/* Sends one datagram to addr:port, from the local address `local` when given (the one
 * the query arrived at). Returns bytes sent or -errno. */
ssize_t corral_udp_send(int fd, const void *buf, size_t len, const char *addr, int port,
                        const char *local);

#endif
