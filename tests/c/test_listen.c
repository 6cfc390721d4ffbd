/*
 * corral_listen_in_netns / corral_ns_socket, and corral_original_dst end to end.
 *
 * A listener made for a netns is in that netns: from the host netns its port refuses
 * (the load-bearing half: the port does not exist here), from inside it accepts and
 * bytes flow. A netns fd that cannot be entered binds nothing, anywhere. With lo up,
 * default routes via lo and the corral ruleset redirecting TCP to the listener's port, a
 * connect inside the netns to 203.0.113.7:80 or [2001:db8::7]:80 arrives at one
 * dual-stack [::] listener and corral_original_dst reads the address the client dialled.
 *
 * Each netns is anonymous (a thread's unshare, held only by an fd), so nothing outlives
 * the test. 203.0.113.0/24 and 2001:db8::/32 are documentation ranges that exist here
 * only through the redirect inside a netns whose only link is lo.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "check.h"
#include "ns.h"
#include "listen.h"
#include "nft.h"
#include "rtnl.h"
#include "sock.h"

/* A client inside a netns, made independently of the code under test: a thread that
 * setns()es and connects (or sends one datagram). */
struct inside {
    int ns, type;
    const char *ip;
    int port;
    int fd;  /* connected socket, or -1 */
    int err; /* errno of the failed step */
};

static void *inside_thread(void *arg)
{
    struct inside *in = arg;
    struct sockaddr_storage ss;
    socklen_t len;
    in->fd = -1;
    int family = corral_sockaddr_from(in->ip, in->port, &ss, &len);
    if (family < 0 || setns(in->ns, CLONE_NEWNET) < 0) {
        in->err = family < 0 ? EINVAL : errno;
        return NULL;
    }
    int fd = socket(family, in->type | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) < 0) {
        in->err = errno;
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (in->type == SOCK_DGRAM && send(fd, "ping", 4, 0) != 4) in->err = errno;
    in->fd = fd;
    return NULL;
}

static int connect_inside(int ns, int type, const char *ip, int port, int *err)
{
    struct inside in = {ns, type, ip, port, -1, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, inside_thread, &in) != 0) return -1;
    pthread_join(t, NULL);
    if (err) *err = in.err;
    return in.fd;
}

static int readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    return poll(&p, 1, ms) == 1;
}

/* A port on 127.0.0.1 in the host netns held bound but not listening, so that nothing
 * else takes it while the test relies on it refusing. */
static int reserve_port(int *port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    corral_sockaddr_from("127.0.0.1", 0, &ss, &len);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0) return -1;
    len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static void test_lands_in_netns(int host)
{
    int ns = corral_ns_new_net();
    CHECK(ns >= 0);
    CHECK(corral_rtnl_lo_default_routes(ns) == 0);
    int port = 0, bound = 0;
    int hold = reserve_port(&port);
    CHECK(hold >= 0 && port > 0);

    int l = corral_listen_in_netns(ns, SOCK_STREAM, "127.0.0.1", port, &bound);
    CHECK(l >= 0 && bound == port);
    CHECK(fcntl(l, F_GETFD) & FD_CLOEXEC);
    CHECK(corral_ns_socket_is(l, ns) == 1);
    CHECK(corral_ns_socket_is(l, host) == 0);

    /* From the host netns the port does not exist… */
    CHECK(corral_tcp_connect("127.0.0.1", port, 1000) == -ECONNREFUSED);
    /* …from inside it accepts, and bytes flow both ways. */
    int err = 0;
    int c = connect_inside(ns, SOCK_STREAM, "127.0.0.1", port, &err);
    CHECK(c >= 0);
    int a = corral_tcp_accept(l, 1000);
    CHECK(a >= 0);
    char buf[8] = {0};
    CHECK(write(c, "in", 2) == 2 && readable(a, 1000) && read(a, buf, sizeof buf) == 2);
    CHECK(memcmp(buf, "in", 2) == 0);
    CHECK(write(a, "out", 3) == 3 && readable(c, 1000) && read(c, buf, sizeof buf) == 3);
    CHECK(memcmp(buf, "out", 3) == 0);
    close(a);
    close(c);
    close(l);

    /* A kernel-chosen port, and a datagram socket, land there too. */
    l = corral_listen_in_netns(ns, SOCK_STREAM, "::", 0, &bound);
    CHECK(l >= 0 && bound > 0 && corral_ns_socket_is(l, ns) == 1);
    close(l);
    int u = corral_listen_in_netns(ns, SOCK_DGRAM, "127.0.0.1", 0, &bound);
    CHECK(u >= 0 && corral_ns_socket_is(u, ns) == 1);
    c = connect_inside(ns, SOCK_DGRAM, "127.0.0.1", bound, &err);
    CHECK(c >= 0 && err == 0);
    CHECK(readable(u, 1000) && recv(u, buf, sizeof buf, 0) == 4);
    close(c);
    close(u);

    close(hold);
    close(ns);
}

static void test_no_netns_binds_nothing(int host)
{
    int port = 0, bound = 0;
    int hold = reserve_port(&port);
    CHECK(hold >= 0);
    close(hold); /* freed for the control below; nothing else here binds ports */
    int mnt = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int file = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    CHECK(mnt >= 0 && file >= 0);

    int before = count_fds();
    CHECK(corral_listen_in_netns(mnt, SOCK_STREAM, "127.0.0.1", port, &bound) == -EINVAL);
    CHECK(corral_listen_in_netns(file, SOCK_STREAM, "127.0.0.1", port, &bound) == -EINVAL);
    CHECK(corral_listen_in_netns(-1, SOCK_STREAM, "127.0.0.1", port, &bound) == -EBADF);
    CHECK(corral_ns_socket(mnt, AF_INET, SOCK_STREAM, 0) == -EINVAL);
    CHECK(count_fds() == before); /* no socket was even created */
    /* Nothing was bound in the host netns either. */
    CHECK(corral_tcp_connect("127.0.0.1", port, 1000) == -ECONNREFUSED);

    /* Bad arguments. */
    CHECK(corral_listen_in_netns(host, SOCK_RAW, "127.0.0.1", 0, &bound) == -EINVAL);
    CHECK(corral_listen_in_netns(host, SOCK_STREAM, "localhost", 0, &bound) == -EINVAL);
    CHECK(corral_listen_in_netns(host, SOCK_STREAM, "127.0.0.1", 70000, &bound) == -EINVAL);

    /* Control: the same call with the host's netns fd binds that port there. */
    int l = corral_listen_in_netns(host, SOCK_STREAM, "127.0.0.1", port, &bound);
    CHECK(l >= 0 && bound == port);
    int c = corral_tcp_connect("127.0.0.1", port, 1000);
    CHECK(c >= 0);
    if (c >= 0) close(c);
    if (l >= 0) close(l);
    close(mnt);
    close(file);
}

/* The redirect end to end: ruleset → one [::] listener → original destination. */
static void test_redirect_original_dst(void)
{
    int ns = corral_ns_new_net();
    CHECK(ns >= 0);
    CHECK(corral_rtnl_lo_default_routes(ns) == 0);
    int port = 0;
    int l = corral_listen_in_netns(ns, SOCK_STREAM, "::", 0, &port);
    CHECK(l >= 0);
    /* Before the ruleset: nothing is translated, so conntrack has no original
     * destination to give (the caller denies). */
    int err = 0;
    int c = connect_inside(ns, SOCK_STREAM, "127.0.0.1", port, &err);
    int a = corral_tcp_accept(l, 1000);
    struct sockaddr_storage od;
    char ip[INET6_ADDRSTRLEN];
    int oport = 0;
    CHECK(c >= 0 && a >= 0);
    CHECK(corral_original_dst(a, &od) == -ENOENT);
    close(a);
    close(c);

    struct corral_nft_plan plan = {.table = NULL,
                                   .dns_port = (uint16_t)port,
                                   .acceptor_port = (uint16_t)port,
                                   .mark = CORRAL_NFT_MARK};
    CHECK(corral_nft_apply(ns, &plan) == 0);

    /* IPv4: measured here, the IPv4 redirect reaches the [::] listener (IPV6_V6ONLY=0)
     * as a v4-mapped connection, and SOL_IP SO_ORIGINAL_DST answers on it. */
    c = connect_inside(ns, SOCK_STREAM, "203.0.113.7", 80, &err);
    CHECK(c >= 0);
    a = corral_tcp_accept(l, 1000);
    CHECK(a >= 0);
    struct sockaddr_storage local;
    socklen_t len = sizeof local;
    CHECK(getsockname(a, (struct sockaddr *)&local, &len) == 0 && local.ss_family == AF_INET6 &&
          IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)&local)->sin6_addr));
    CHECK(corral_original_dst(a, &od) == 0);
    CHECK(corral_sockaddr_text(&od, ip, sizeof ip, &oport) == 0);
    CHECK(od.ss_family == AF_INET && strcmp(ip, "203.0.113.7") == 0 && oport == 80);
    char buf[4] = {0};
    CHECK(write(a, "ok", 2) == 2 && readable(c, 1000) && read(c, buf, sizeof buf) == 2);
    close(a);
    close(c);

    /* IPv6 literal. */
    c = connect_inside(ns, SOCK_STREAM, "2001:db8::7", 443, &err);
    CHECK(c >= 0);
    a = corral_tcp_accept(l, 1000);
    CHECK(a >= 0);
    CHECK(corral_original_dst(a, &od) == 0);
    CHECK(corral_sockaddr_text(&od, ip, sizeof ip, &oport) == 0);
    CHECK(od.ss_family == AF_INET6 && strcmp(ip, "2001:db8::7") == 0 && oport == 443);
    close(a);
    close(c);

    /* Another port on another address: the original destination follows the client. */
    c = connect_inside(ns, SOCK_STREAM, "198.51.100.20", 8443, &err);
    a = corral_tcp_accept(l, 1000);
    CHECK(c >= 0 && a >= 0 && corral_original_dst(a, &od) == 0);
    CHECK(corral_sockaddr_text(&od, ip, sizeof ip, &oport) == 0);
    CHECK(strcmp(ip, "198.51.100.20") == 0 && oport == 8443);
    close(a);
    close(c);

    /* Measured: once the ruleset has conntrack running in the netns, a tenant that dials
     * the acceptor's own port directly is not redirected, and its "original destination"
     * is the acceptor itself, not ENOENT: the decision must refuse loopback. */
    c = connect_inside(ns, SOCK_STREAM, "127.0.0.1", port, &err);
    a = corral_tcp_accept(l, 1000);
    CHECK(c >= 0 && a >= 0 && corral_original_dst(a, &od) == 0);
    CHECK(corral_sockaddr_text(&od, ip, sizeof ip, &oport) == 0);
    CHECK(strcmp(ip, "127.0.0.1") == 0 && oport == port);
    close(a);
    close(c);

    /* A v4-only listener in the same netns takes the IPv4 redirect as plain AF_INET. */
    close(l);
    l = corral_listen_in_netns(ns, SOCK_STREAM, "127.0.0.1", port, NULL);
    CHECK(l >= 0);
    c = connect_inside(ns, SOCK_STREAM, "203.0.113.8", 81, &err);
    a = corral_tcp_accept(l, 1000);
    CHECK(c >= 0 && a >= 0 && corral_original_dst(a, &od) == 0);
    CHECK(corral_sockaddr_text(&od, ip, sizeof ip, &oport) == 0);
    CHECK(od.ss_family == AF_INET && strcmp(ip, "203.0.113.8") == 0 && oport == 81);
    close(a);
    close(c);
    close(l);
    close(ns);
}

int main(void)
{
    int host = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    CHECK(host >= 0);
    int before = count_fds();
    test_lands_in_netns(host);
    test_no_netns_binds_nothing(host);
    test_redirect_original_dst();
    CHECK(count_fds() == before);
    close(host);
    return DONE();
}
