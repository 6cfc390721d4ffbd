/*
 * Bytes and file descriptors over one unix stream socket (SCM_RIGHTS): what the session
 * socket's `exec` carries (the client's stdin, stdout and stderr one way, a pty's master
 * the other). Received fds are CLOEXEC from the moment they exist (invariant 8).
 */
#ifndef CORRAL_FDPASS_H
#define CORRAL_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

#define CORRAL_FDPASS_MAX 8

/* Sends all len bytes of buf, the nfds fds (at most CORRAL_FDPASS_MAX) riding with the
 * first part, without raising SIGPIPE. Returns 0 or -errno (-EPIPE: the peer is gone). */
int corral_fdpass_send(int sock, const void *buf, size_t len, const int *fds, int nfds);

/* One recvmsg into buf (cap bytes); the fds that came with those bytes are stored in
 * fds (up to CORRAL_FDPASS_MAX; *nfds set), the caller owns them. More fds than that,
 * or a truncated control message, closes every one received and returns -EPROTO.
 * Returns the byte count (0: the peer closed), or -errno (-EAGAIN on a non-blocking
 * socket with nothing to read). */
ssize_t corral_fdpass_recv(int sock, void *buf, size_t cap, int *fds, int *nfds);

#endif
