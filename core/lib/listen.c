/* Listening and bound sockets inside another network namespace (see listen.h). */
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "listen.h"
#include "ns.h"
#include "sock.h"
#include "util.h"

int corral_listen_in_netns(int netns_fd, int type, const char *addr, int port, int *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (type != SOCK_STREAM && type != SOCK_DGRAM) return -EINVAL;
    if (!addr) return -EINVAL;
    int family = corral_sockaddr_from(addr, port, &ss, &len);
    if (family < 0) return family;

    _cleanup_close_ int fd = corral_ns_socket(netns_fd, family, type, 0);
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
    return corral_take_fd(&fd);
}
