/*
 * Helpers every core/lib file shares: scope-bound cleanup of fds and heap memory (in
 * the style of bubblewrap's utils.h and systemd's _cleanup_ macros), one-write files,
 * poll that survives signals, and the one "is this path beneath that directory" test.
 *
 * The cleanup attributes are for core/lib only: a Lua error longjmps past them, so a
 * binding must never rely on one running.
 */
#ifndef CORRAL_UTIL_H
#define CORRAL_UTIL_H

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

static inline void corral_freep(void *p)
{
    free(*(void **)p);
}

/* Keeps errno: a cleanup runs after the return value was computed, but before a caller
 * that reads errno itself. */
static inline void corral_closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
    }
}

/* For what runs in a child left on a stack corral mapped itself (corral_ns_run_in_child,
 * and a tenant's init cloned from there, which keeps a copy of it): AddressSanitizer
 * cannot place such a stack and would print a warning into the tenant's stderr at the
 * first call of a noreturn function (`make asan`). */
#define CORRAL_OWN_STACK __attribute__((no_sanitize_address))

#define _cleanup_free_ __attribute__((cleanup(corral_freep)))
#define _cleanup_close_ __attribute__((cleanup(corral_closep)))

/* Hands the fd out of a _cleanup_close_ variable, which is left -1. */
static inline int corral_take_fd(int *fd)
{
    int r = *fd;
    *fd = -1;
    return r;
}

/* Hands the pointer out of a cleanup variable (pp points to it), which is left NULL. */
static inline void *corral_steal_pointer(void *pp)
{
    void **p = pp;
    void *r = *p;
    *p = NULL;
    return r;
}

/* Writes text (len bytes) to the existing file path in one write(2), as the kernel's
 * control files (/proc/PID/uid_map, cgroup.procs, …) want it. Returns 0, -errno, or
 * -EIO when the write was short. */
int corral_write_file(const char *path, const char *text, size_t len);

/* poll(2) on one fd for events, restarted when a signal interrupts it. Returns the
 * number of ready fds (0: timed out) or -errno. */
int corral_poll_fd(int fd, short events, int timeout_ms);

/* 1 when errno err (or -err) says a resource ran out for a moment (fds, memory, space, a
 * quota, a process limit, kernel buffers): a failure to retry, never a protection the
 * host lacks. The same set as lua/corral/transient.lua's. */
int corral_errno_transient(int err);

/* 1 when the absolute path is dir itself or lies beneath it, else 0. A plain string
 * test on resolved paths: "/a/bc" is not beneath "/a/b", and every absolute path is
 * beneath "/". */
int corral_is_beneath(const char *path, const char *dir);

/* A write to a pipe or socket whose reader is gone fails with EPIPE and raises SIGPIPE,
 * whose default action would end the host, every sandbox it serves, over one tenant's
 * closed connection; splice and write take no MSG_NOSIGNAL. Such writes run between
 * these two: SIGPIPE blocked in the calling thread, then a SIGPIPE the writes raised
 * (raised: one of them failed with EPIPE) taken back before the mask is restored. The
 * mask is the thread's, and only for that while: nothing the host starts inherits it. */
struct corral_sigpipe_guard {
    sigset_t old;
};
void corral_sigpipe_hold(struct corral_sigpipe_guard *g);
void corral_sigpipe_release(struct corral_sigpipe_guard *g, int raised);

/* write(2) between those two: -1 with errno EPIPE where the reader is gone, no signal. */
ssize_t corral_write_nosigpipe(int fd, const void *buf, size_t len);

#endif
