/*
 * SCM_RIGHTS over a unix stream socket (see fdpass.h).
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fdpass.h"

int corral_fdpass_send(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * CORRAL_FDPASS_MAX)];
        struct cmsghdr align;
    } control;
    const char *p = buf;
    if (nfds < 0 || nfds > CORRAL_FDPASS_MAX || len == 0) return -EINVAL;
    while (len > 0) {
        struct iovec iov = {(void *)p, len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nfds > 0) {
            memset(&control, 0, sizeof control);
            msg.msg_control = control.buf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        nfds = 0; /* sent with the first bytes that went */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void close_received(struct msghdr *msg)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            close(fd);
        }
    }
}

ssize_t corral_fdpass_recv(int sock, void *buf, size_t cap, int *fds, int *nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * CORRAL_FDPASS_MAX)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {buf, cap};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;
    *nfds = 0;
    do {
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    if (msg.msg_flags & MSG_CTRUNC) {
        close_received(&msg);
        return -EPROTO;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if ((size_t)*nfds + k > CORRAL_FDPASS_MAX) {
            close_received(&msg);
            *nfds = 0;
            return -EPROTO;
        }
        memcpy(fds + *nfds, CMSG_DATA(c), k * sizeof(int));
        *nfds += (int)k;
    }
    return n;
}
