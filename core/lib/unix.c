/*
 * Unix stream sockets (see unix.h). The connect is non-blocking with poll, as sock.c's
 * TCP connect is, so a server that stopped accepting costs a caller its deadline, not
 * its session.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "unix.h"
#include "util.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

static int unix_addr(const char *path, struct sockaddr_un *sa)
{
    size_t n = strlen(path);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (n == 0) return -EINVAL;
    if (n >= sizeof sa->sun_path) return -ENAMETOOLONG;
    memcpy(sa->sun_path, path, n + 1);
    return 0;
}

int corral_unix_listen(const char *path, int backlog, mode_t mode)
{
    struct sockaddr_un sa;
    int err = unix_addr(path, &sa);
    if (err) return err;
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) return -errno;
    if (chmod(path, mode) < 0 || listen(fd, backlog) < 0) {
        err = -errno;
        unlink(path);
        return err;
    }
    return corral_take_fd(&fd);
}

/* A unix listener whose backlog is full refuses a non-blocking connect with EAGAIN and
 * starts nothing (no later POLLOUT means connected): the connect is made again blocking,
 * the kernel waiting for room up to the send timeout. */
static int connect_when_room(int *fdp, const struct sockaddr_un *sa, int timeout_ms)
{
    int fd = *fdp;
    struct timeval tv = {0};
    if (timeout_ms >= 0) {
        tv.tv_sec = timeout_ms / 1000;
        tv.tv_usec = (timeout_ms % 1000) * 1000 + (timeout_ms == 0); /* 0 would mean never */
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) return -errno;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) return -errno;
    int r;
    do
        r = connect(fd, (const struct sockaddr *)sa, sizeof *sa);
    while (r < 0 && errno == EINTR);
    if (r < 0) return errno == EAGAIN || errno == EINPROGRESS ? -ETIMEDOUT : -errno;
    struct timeval none = {0};
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none) < 0) return -errno;
    return corral_take_fd(fdp);
}

int corral_unix_connect(const char *path, int timeout_ms)
{
    struct sockaddr_un sa;
    int err = unix_addr(path, &sa);
    if (err) return err;
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        if (errno == EAGAIN) return connect_when_room(&fd, &sa, timeout_ms);
        if (errno != EINPROGRESS) return -errno;
        int r = corral_poll_fd(fd, POLLOUT, timeout_ms);
        if (r < 0) return r;
        if (r == 0) return -ETIMEDOUT;
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0) return -errno;
        if (soerr) return -soerr;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) return -errno;
    return corral_take_fd(&fd);
}

int corral_unix_accept(int listen_fd, int send_timeout_ms)
{
    _cleanup_close_ int fd = -1;
    do
        fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    if (send_timeout_ms > 0) {
        struct timeval tv = {.tv_sec = send_timeout_ms / 1000,
                             .tv_usec = (send_timeout_ms % 1000) * 1000};
        if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) return -errno;
    }
    return corral_take_fd(&fd);
}

int corral_unix_peercred(int fd, pid_t *pid, uid_t *uid, gid_t *gid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) return -errno;
    if (len != sizeof cred) return -EPROTO;
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

int corral_unix_peer_in_own_userns(int fd)
{
    pid_t pid;
    uid_t uid;
    gid_t gid;
    int r = corral_unix_peercred(fd, &pid, &uid, &gid);
    if (r < 0) return r;
    /* 0: the peer's pid is not visible in our pid namespace */
    if (pid <= 0) return -ESRCH;
    _cleanup_close_ int pidfd = -1;
    socklen_t len = sizeof pidfd;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0) {
        if (errno != ENOPROTOOPT) return -errno;
        pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0) return -errno;
    }
    if (fcntl(pidfd, F_SETFD, FD_CLOEXEC) < 0) return -errno;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    struct stat peer, mine;
    if (stat(path, &peer) < 0 || stat("/proc/self/ns/user", &mine) < 0) return -errno;
    /* Still alive: the pid named the pinned process when its namespace was read. */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0) return -errno;
    return peer.st_dev == mine.st_dev && peer.st_ino == mine.st_ino;
}

ssize_t corral_unix_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t n)
{
    if (len == 0 || n > CORRAL_UNIX_FDS_MAX) return -EINVAL;
    union {
        char buf[CMSG_SPACE(sizeof(int) * CORRAL_UNIX_FDS_MAX)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n > 0) {
        memset(&ctl, 0, sizeof ctl);
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    }
    ssize_t r;
    do
        r = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

ssize_t corral_unix_recv_fds(int fd, void *buf, size_t cap, int *fds, size_t max, size_t *n,
                             int dontwait)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * CORRAL_UNIX_FDS_MAX)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    *n = 0;
    ssize_t r;
    do
        r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | (dontwait ? MSG_DONTWAIT : 0));
    while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    size_t got = 0;
    int over = (msg.msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (got < max)
                fds[got++] = in[i];
            else {
                close(in[i]);
                over = 1;
            }
        }
    }
    if (over) {
        for (size_t i = 0; i < got; i++)
            close(fds[i]);
        return -EPROTO;
    }
    *n = got;
    return r;
}
