/*
 * Sockets created inside another network namespace (see listen.h).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/sockios.h>

#include "listen.h"
#include "sock.h"

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
}
#define cleanup_fd __attribute__((cleanup(close_fd)))

struct socket_req {
    int netns_fd, domain, type, protocol;
    int fd; /* the socket, or -errno */
};

static void *socket_thread(void *arg)
{
    struct socket_req *r = arg;
    /* The thread exits right after; its netns reference goes with it, and no other code
     * ever runs on it, so nothing else can be created in the tenant's netns by mistake. */
    if (setns(r->netns_fd, CLONE_NEWNET) < 0) {
        r->fd = -errno;
        return NULL;
    }
    r->fd = socket(r->domain, r->type | SOCK_CLOEXEC, r->protocol);
    if (r->fd < 0) r->fd = -errno;
    return NULL;
}

int corral_socket_netns_is(int fd, int netns_fd)
{
    cleanup_fd int ns = ioctl(fd, SIOCGSKNS);
    if (ns < 0) return -errno;
    struct stat a, b;
    if (fstat(ns, &a) < 0 || fstat(netns_fd, &b) < 0) return -errno;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int corral_socket_in_netns(int netns_fd, int domain, int type, int protocol)
{
    if (netns_fd < 0) return -EBADF;
    struct socket_req req = {netns_fd, domain, type, protocol, -EINVAL};
    sigset_t all, old;
    pthread_t t;

    /* Every signal blocked: no handler of the host's ever runs on a thread that sits in
     * the tenant's netns. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&t, NULL, socket_thread, &req);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) return -err;
    pthread_join(t, NULL);
    if (req.fd < 0) return req.fd;

    cleanup_fd int fd = req.fd;
    int same = corral_socket_netns_is(fd, netns_fd);
    if (same < 0) return same;
    if (!same) return -EXDEV;
    int ret = fd;
    fd = -1;
    return ret;
}

int corral_listen_in_netns(int netns_fd, int type, const char *addr, int port, int *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (type != SOCK_STREAM && type != SOCK_DGRAM) return -EINVAL;
    if (!addr) return -EINVAL;
    int family = corral_sockaddr_from(addr, port, &ss, &len);
    if (family < 0) return family;

    cleanup_fd int fd = corral_socket_in_netns(netns_fd, family, type, 0);
    if (fd < 0) return fd;
    int one = 1, zero = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) return -errno;
    if (family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr) &&
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0)
        return -errno;
    /* A datagram server answers from the address each query arrived at (core/lib/udp.c):
     * ask for that address with every datagram. */
    if (type == SOCK_DGRAM) {
        if (family == AF_INET6 &&
            setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one) < 0)
            return -errno;
        if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) < 0 && family == AF_INET)
            return -errno;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) < 0) return -errno;
    if (type == SOCK_STREAM && listen(fd, SOMAXCONN) < 0) return -errno;
    len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return -errno;
    if (bound_port)
        *bound_port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                              : ((struct sockaddr_in6 *)&ss)->sin6_port);
    int ret = fd;
    fd = -1;
    return ret;
}
