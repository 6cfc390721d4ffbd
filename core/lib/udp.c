/*
 * UDP helpers (see udp.h). The responder's socket may be dual-stack: v4-mapped senders
 * are reported in their IPv4 form and answered through the same family they came from.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "udp.h"

ssize_t corral_udp_recv(int fd, void *buf, size_t cap, char *addr, int *port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    ssize_t n = recvfrom(fd, buf, cap, MSG_DONTWAIT, (struct sockaddr *)&ss, &len);
    if (n < 0) return -errno;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, addr, 46);
        *port = ntohs(s4->sin_port);
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, addr, 46);
        *port = ntohs(s6->sin6_port);
    }
    return n;
}

ssize_t corral_udp_send(int fd, const void *buf, size_t len, const char *addr, int port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    int family;
    socklen_t fl = sizeof family;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &fl) < 0) return -errno;
    if (family == AF_INET && inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        sl = sizeof *s4;
    } else if (family == AF_INET6 && inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        sl = sizeof *s6;
    } else if (family == AF_INET6 && inet_pton(AF_INET, addr, &s6->sin6_addr.s6_addr[12]) == 1) {
        s6->sin6_addr.s6_addr[10] = s6->sin6_addr.s6_addr[11] = 0xff; /* v4-mapped */
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        sl = sizeof *s6;
    } else {
        return -EINVAL;
    }
    ssize_t n = sendto(fd, buf, len, MSG_DONTWAIT, (struct sockaddr *)&ss, sl);
    return n < 0 ? -errno : n;
}
