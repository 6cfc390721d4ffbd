/*
 * Unix stream sockets for corral's control channel (a running sandbox's owner talks to
 * it from another corral process): a listener bound at a path, a connect with a
 * deadline, a non-blocking accept, and the peer's credentials as the kernel recorded
 * them at connect (SO_PEERCRED), which is what the server checks, not anything the
 * peer says about itself.
 */
#ifndef CORRAL_UNIX_H
#define CORRAL_UNIX_H

#include <sys/types.h>

/* Binds and listens on path (which must not exist), then sets the socket file's mode
 * to mode: bind(2) creates it with 0777 & ~umask, so the directory holding it is what
 * keeps others out during that moment. Returns a CLOEXEC, O_NONBLOCK fd or -errno
 * (-ENAMETOOLONG when path does not fit sun_path, -EADDRINUSE when it exists). */
int corral_unix_listen(const char *path, int backlog, mode_t mode);

/* Connects to the socket at path within timeout_ms (-1: no limit); returns a blocking
 * CLOEXEC fd or -errno (-ECONNREFUSED: nothing listens there, a stale socket file). */
int corral_unix_connect(const char *path, int timeout_ms);

/* Accepts one pending connection without waiting; returns a blocking CLOEXEC fd whose
 * sends time out after send_timeout_ms (0: never), or -errno (-EAGAIN: none pending). */
int corral_unix_accept(int listen_fd, int send_timeout_ms);

/* The pid, uid and gid of the process that connected fd's peer (SO_PEERCRED), in the
 * caller's namespaces. Returns 0 or -errno. */
int corral_unix_peercred(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* Whether the process that connected fd's peer is in the caller's own user namespace:
 * 1 yes, 0 no (a process of a user namespace beneath, such as a tenant whose ids map to
 * the caller's own: the same uid is then no proof of being the caller), or -errno when
 * that cannot be told (-ESRCH: the peer is gone). The peer is pinned by a pidfd
 * (SO_PEERPIDFD; pidfd_open of SO_PEERCRED's pid on a kernel without it) that must still
 * name a live process once its namespace is read, so a pid reused in between is never
 * judged in its place. */
int corral_unix_peer_in_own_userns(int fd);

/* Most fds one message carries (a session's exec passes 3, its answer 1). */
#define CORRAL_UNIX_FDS_MAX 8

/* Sends len bytes of buf (len > 0) as one message with the n fds (n <= CORRAL_UNIX_FDS_MAX)
 * attached by SCM_RIGHTS. Returns the bytes sent or -errno. */
ssize_t corral_unix_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t n);

/* Receives one message of at most cap bytes and the fds attached to it, each installed
 * CLOEXEC; dontwait: fail with -EAGAIN instead of waiting. Returns the bytes read (0: the
 * peer closed) with *n set, or -errno; -EPROTO when more than max fds came (those that
 * fit are closed: a message the caller cannot account for is refused whole). */
ssize_t corral_unix_recv_fds(int fd, void *buf, size_t cap, int *fds, size_t max, size_t *n,
                             int dontwait);

#endif
