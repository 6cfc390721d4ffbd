/*
 * UDP helpers (see udp.h). The responder's socket may be dual-stack: v4-mapped senders
 * are reported in their IPv4 form and answered through the same family they came from.
 *
 * Replies leave from the address the query was received on (IP_PKTINFO / IPV6_PKTINFO,
 * enabled by corral_listen_in_netns). A redirected query arrives at 127.0.0.1; without
 * pktinfo the kernel picks the source by route, which on a sandbox with its own link is
 * the link address, so conntrack cannot match the reply to the query and every lookup
 * times out.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "udp.h"

static void text_of(const struct sockaddr_storage *ss, char *addr, int *port)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, addr, 46);
        *port = ntohs(s4->sin_port);
    } else {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, addr, 46);
        *port = ntohs(s6->sin6_port);
    }
}

ssize_t corral_udp_recv(int fd, void *buf, size_t cap, char *addr, int *port, char *local)
{
    struct sockaddr_storage ss;
    char control[256];
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg = {.msg_name = &ss,
                         .msg_namelen = sizeof ss,
                         .msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control,
                         .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n < 0) return -errno;
    text_of(&ss, addr, port);
    local[0] = '\0';
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo pi;
            memcpy(&pi, CMSG_DATA(c), sizeof pi);
            inet_ntop(AF_INET, &pi.ipi_addr, local, 46);
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
            struct in6_pktinfo pi;
            memcpy(&pi, CMSG_DATA(c), sizeof pi);
            inet_ntop(AF_INET6, &pi.ipi6_addr, local, 46);
        }
    }
    return n;
}

static int to_sockaddr(int family, const char *addr, int port, struct sockaddr_storage *ss,
                       socklen_t *sl)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (family == AF_INET && inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        *sl = sizeof *s4;
    } else if (family == AF_INET6 && inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        *sl = sizeof *s6;
    } else if (family == AF_INET6 && inet_pton(AF_INET, addr, &s6->sin6_addr.s6_addr[12]) == 1) {
        s6->sin6_addr.s6_addr[10] = s6->sin6_addr.s6_addr[11] = 0xff; /* v4-mapped */
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        *sl = sizeof *s6;
    } else {
        return -EINVAL;
    }
    return 0;
}

ssize_t corral_udp_send(int fd, const void *buf, size_t len, const char *addr, int port,
                        const char *local)
{
    int family;
    socklen_t fl = sizeof family;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &fl) < 0) return -errno;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (to_sockaddr(family, addr, port, &ss, &sl) < 0) return -EINVAL;
    char control[256];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_name = &ss, .msg_namelen = sl, .msg_iov = &iov, .msg_iovlen = 1};
    if (local && *local) {
        struct in_addr a4;
        struct in6_addr a6;
        struct cmsghdr *c;
        msg.msg_control = control;
        if (inet_pton(AF_INET, local, &a4) == 1) {
            msg.msg_controllen = CMSG_SPACE(sizeof(struct in_pktinfo));
            c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = IPPROTO_IP;
            c->cmsg_type = IP_PKTINFO;
            c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
            struct in_pktinfo pi = {.ipi_spec_dst = a4};
            memcpy(CMSG_DATA(c), &pi, sizeof pi);
        } else if (inet_pton(AF_INET6, local, &a6) == 1) {
            msg.msg_controllen = CMSG_SPACE(sizeof(struct in6_pktinfo));
            c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = IPPROTO_IPV6;
            c->cmsg_type = IPV6_PKTINFO;
            c->cmsg_len = CMSG_LEN(sizeof(struct in6_pktinfo));
            struct in6_pktinfo pi = {.ipi6_addr = a6};
            memcpy(CMSG_DATA(c), &pi, sizeof pi);
        } else {
            return -EINVAL;
        }
    }
    ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT);
    return n < 0 ? -errno : n;
}
