/*
 * TCP helpers (see sock.h). Non-blocking connect with poll, so a probe against a
 * filtered destination reports a timeout instead of hanging.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sock.h"

static int fill(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *len)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (port < 0 || port > 65535) return -EINVAL;
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *len = sizeof *in4;
        return AF_INET;
    }
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *len = sizeof *in6;
        return AF_INET6;
    }
    return -EINVAL;
}

int corral_tcp_listen(const char *addr, int port, int *bound)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int family = fill(addr, port, &ss, &len);
    if (family < 0) return family;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 128) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    *bound = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                     : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return fd;
}

int corral_tcp_connect(const char *addr, int port, int timeout_ms)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int family = fill(addr, port, &ss, &len);
    if (family < 0) return family;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    int err = 0;
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n;
            do n = poll(&p, 1, timeout_ms);
            while (n < 0 && errno == EINTR);
            if (n == 0) {
                err = ETIMEDOUT;
            } else {
                socklen_t el = sizeof err;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
            }
        }
    }
    if (err) {
        close(fd);
        return -err;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

int corral_tcp_accept(int listen_fd, int timeout_ms)
{
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    int n;
    do n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    if (n == 0) return -ETIMEDOUT;
    if (n < 0) return -errno;
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    return fd < 0 ? -errno : fd;
}
