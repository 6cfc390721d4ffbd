/* Shared helpers of core/lib (see util.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

int corral_write_file(const char *path, const char *text, size_t len)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t w = write(fd, text, len);
    if (w < 0) return -errno;
    return (size_t)w == len ? 0 : -EIO;
}

int corral_poll_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    int n;
    do
        n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

int corral_is_beneath(const char *path, const char *dir)
{
    if (path[0] != '/') return 0;
    if (strcmp(dir, "/") == 0) return 1;
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

void corral_sigpipe_hold(struct corral_sigpipe_guard *g)
{
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &g->old);
}

void corral_sigpipe_release(struct corral_sigpipe_guard *g, int raised)
{
    if (sigismember(&g->old, SIGPIPE)) return; /* the caller's own block: left as it was */
    int saved = errno;
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    const struct timespec none = {0, 0};
    while (raised && sigtimedwait(&pipe_only, NULL, &none) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    errno = saved;
}

ssize_t corral_write_nosigpipe(int fd, const void *buf, size_t len)
{
    struct corral_sigpipe_guard g;
    corral_sigpipe_hold(&g);
    ssize_t n = write(fd, buf, len);
    int err = n < 0 ? errno : 0;
    corral_sigpipe_release(&g, err == EPIPE);
    errno = err;
    return n;
}

int corral_errno_transient(int err)
{
    switch (err < 0 ? -err : err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOSPC:
    case EDQUOT:
    case EAGAIN:
    case ENOBUFS:
        return 1;
    default:
        return 0;
    }
}
