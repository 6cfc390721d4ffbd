/*
 * TCP helpers and the egress socket verbs (see sock.h). Connects are non-blocking with
 * poll, so a probe against a filtered destination reports a timeout instead of hanging.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/netfilter_ipv4.h>

#include "ns.h"
#include "sock.h"
#include "util.h"

#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80 /* linux/netfilter_ipv6/ip6_tables.h, which needs kernel types */
#endif

int corral_sockaddr_from(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *len)
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
    int family = corral_sockaddr_from(addr, port, &ss, &len);
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
    int family = corral_sockaddr_from(addr, port, &ss, &len);
    if (family < 0) return family;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    int err = 0;
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        err = errno;
        if (err == EINPROGRESS) {
            int n = corral_poll_fd(fd, POLLOUT, timeout_ms);
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
    int n = corral_poll_fd(listen_fd, POLLIN, timeout_ms);
    if (n == 0) return -ETIMEDOUT;
    if (n < 0) return n;
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int corral_sockaddr_text(const struct sockaddr_storage *ss, char *buf, size_t len, int *port)
{
    const void *addr;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)ss;
        addr = &in4->sin_addr;
        *port = ntohs(in4->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        addr = &in6->sin6_addr;
        *port = ntohs(in6->sin6_port);
    } else {
        return -EAFNOSUPPORT;
    }
    if (!inet_ntop(ss->ss_family, addr, buf, (socklen_t)len)) return -errno;
    return 0;
}

int corral_original_dst(int fd, struct sockaddr_storage *out)
{
    struct sockaddr_storage local;
    socklen_t len = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &len) < 0) return -errno;
    int v4 = local.ss_family == AF_INET;
    if (local.ss_family == AF_INET6)
        v4 = IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)&local)->sin6_addr);
    else if (!v4)
        return -EAFNOSUPPORT;

    memset(out, 0, sizeof *out);
    len = v4 ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    /* SOL_IP SO_ORIGINAL_DST on an AF_INET6 listener's accepted v4-mapped connection
     * returns the IPv4 original destination (tests/c/test_listen.c asserts it). */

    int r = v4 ? getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, out, &len)
               : getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, out, &len);
    if (r < 0) return -errno;
    if (out->ss_family != (v4 ? AF_INET : AF_INET6)) return -EPROTO;
    return 0;
}

int corral_set_mark_checked(int fd, uint32_t mark)
{
    uint32_t back = 0;
    socklen_t len = sizeof back;
    if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) < 0) return -errno;
    if (getsockopt(fd, SOL_SOCKET, SO_MARK, &back, &len) < 0) return -errno;
    return len == sizeof back && back == mark ? 0 : -EPROTO;
}

#ifndef IP_LOCAL_PORT_RANGE
#define IP_LOCAL_PORT_RANGE 51 /* linux/in.h, Linux 6.3; Debian 12's headers predate it */
#endif

/* The kernel's ephemeral range, read at most once a second: on every upstream connect it
 * cost an open, a read and a close (measured with scripts/bench/sni-latency.lua: about
 * 10 us of the acceptor's ~280 us per connection). Packed lo << 16 | hi in one atomic,
 * so a reader never sees half of an update. */
static _Atomic uint32_t port_range;
static _Atomic int64_t port_range_at;

static void port_range_now(unsigned *range_lo, unsigned *range_hi)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    int64_t now = (int64_t)t.tv_sec;
    uint32_t packed = atomic_load(&port_range);
    if (!packed || atomic_load(&port_range_at) != now) {
        unsigned a = 32768, b = 60999;
        FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
        if (f) {
            if (fscanf(f, "%u %u", &a, &b) != 2 || b <= a || b > 65535) {
                a = 32768;
                b = 60999;
            }
            fclose(f);
        }
        packed = (uint32_t)a << 16 | b;
        atomic_store(&port_range, packed);
        atomic_store(&port_range_at, now);
    }
    *range_lo = packed >> 16;
    *range_hi = packed & 0xffff;
}

void corral_port_slice(const char *key, unsigned *lo, unsigned *hi)
{
    unsigned range_lo, range_hi;
    port_range_now(&range_lo, &range_hi);
    unsigned n = range_hi - range_lo + 1, size = n / 2 < 4096 ? n / 2 : 4096;
    uint32_t h = 2166136261u;
    for (const char *c = key; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    *lo = range_lo + h % (n - size + 1);
    *hi = *lo + size - 1;
}

int corral_connect_marked_start(const struct sockaddr *sa, socklen_t len, uint32_t mark,
                                int netns_fd, const char *port_key, int *in_progress,
                                const char **step)
{
    const char *unused = "socket";
    if (!step) step = &unused;
    *step = "socket";
    if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return -EAFNOSUPPORT;
    _cleanup_close_ int fd = -1;
    if (netns_fd < 0) {
        fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return -errno;
    } else {
        fd = corral_ns_socket(netns_fd, sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            if (fd != -EMFILE && fd != -ENFILE && fd != -ENOMEM) *step = "setns";
            return fd;
        }
    }
    if (mark) {
        *step = "setsockopt_mark";
        int r = corral_set_mark_checked(fd, mark);
        if (r < 0) return r;
    }
    if (port_key) {
        unsigned lo, hi;
        corral_port_slice(port_key, &lo, &hi);
        uint32_t range = (uint32_t)hi << 16 | lo;
        /* An IPv6 socket takes the IPv4-level option as well. A kernel without it only
         * loses the slice, never the connection. */
        (void)setsockopt(fd, IPPROTO_IP, IP_LOCAL_PORT_RANGE, &range, sizeof range);
    }
    *step = "connect";
    *in_progress = 0;
    if (connect(fd, sa, len) < 0) {
        if (errno != EINPROGRESS) return -errno;
        *in_progress = 1;
    }
    return corral_take_fd(&fd);
}

int corral_connect_marked_ex(const struct sockaddr *sa, socklen_t len, uint32_t mark,
                             int timeout_ms, int netns_fd, const char **step)
{
    const char *unused = "socket";
    if (!step) step = &unused;
    int in_progress = 0;
    _cleanup_close_ int fd =
        corral_connect_marked_start(sa, len, mark, netns_fd, NULL, &in_progress, step);
    if (fd < 0) return fd;
    if (in_progress) {
        int n = corral_poll_fd(fd, POLLOUT, timeout_ms);
        if (n < 0) return n;
        if (n == 0) {
            *step = "timeout";
            return -ETIMEDOUT;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) return -errno;
        if (err) return -err;
    }
    if (mark) {
        /* Once more on the connected socket: the fd handed out is the one checked. */
        *step = "setsockopt_mark";
        uint32_t back = 0;
        socklen_t ml = sizeof back;
        if (getsockopt(fd, SOL_SOCKET, SO_MARK, &back, &ml) < 0) return -errno;
        if (back != mark) return -EPROTO;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) return -errno;
    return corral_take_fd(&fd);
}

int corral_connect_marked(const struct sockaddr *sa, socklen_t len, uint32_t mark, int timeout_ms,
                          int netns_fd)
{
    return corral_connect_marked_ex(sa, len, mark, timeout_ms, netns_fd, NULL);
}

int corral_reset(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    int err = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) < 0) err = -errno;
    close(fd);
    return err;
}
