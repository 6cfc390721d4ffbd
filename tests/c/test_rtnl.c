/*
 * corral_netlink_open_in and corral_rtnl_*: sockets land in the target netns; lo + default
 * routes make any destination routable from inside (and only then); a veth pair between
 * two netns carries traffic once addressed and up, and is gone after delete.
 *
 * Each netns is anonymous (a thread's unshare, held only by an fd), so nothing outlives
 * the test. Addresses are from the documentation ranges 192.0.2.0/24 and 2001:db8::/32
 * and exist only on the veth between the two test namespaces.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <linux/sockios.h>

#include "check.h"
#include "ns.h"
#include "rtnl.h"

static ino_t ino_of(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

static void test_open_in(int ns)
{
    struct mnl_socket *nl = NULL;
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    CHECK(corral_netlink_open_in(ns, NETLINK_ROUTE, &nl) == 0 && nl);
    if (nl) {
        int skns = ioctl(mnl_socket_get_fd(nl), SIOCGSKNS);
        CHECK(skns >= 0);
        CHECK(ino_of(skns) == ino_of(ns));
        CHECK(ino_of(skns) != ino_of(self));
        CHECK(fcntl(mnl_socket_get_fd(nl), F_GETFD) & FD_CLOEXEC);
        close(skns);
        mnl_socket_close(nl);
    }
    /* The calling thread never moved. */
    int now = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    CHECK(ino_of(now) == ino_of(self));
    close(now);

    nl = NULL;
    int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(corral_netlink_open_in(dir, NETLINK_ROUTE, &nl) == -EINVAL && !nl);
    CHECK(corral_netns_open("/") == -EINVAL);
    int again = corral_netns_open("/proc/self/ns/net");
    CHECK(again >= 0 && ino_of(again) == ino_of(self));
    close(again);
    close(dir);
    close(self);
}

/* ---- probes run by a child inside a netns; results through shared memory ---- */

typedef void (*probe_fn)(void *arg, int *out);

static int in_netns(int ns, probe_fn fn, void *arg)
{
    int *out = mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) return -1000;
    *out = -1000;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        if (setns(ns, CLONE_NEWNET) == 0) fn(arg, out);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    int v = *out;
    munmap(out, sizeof *out);
    return v;
}

struct dst {
    int family;
    const char *ip;
    const char *want_src; /* for route probes: the source address the kernel picks */
};

static socklen_t fill(const struct dst *d, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (d->family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)ss;
        s->sin_family = AF_INET;
        s->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, d->ip, &s->sin_addr);
        return sizeof *s;
    }
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
    s->sin6_family = AF_INET6;
    s->sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, d->ip, &s->sin6_addr);
    return sizeof *s;
}

/* A UDP connect() does the route lookup and nothing else: 1 if routed from the expected
 * source, -errno if not routable. */
static void probe_route(void *arg, int *out)
{
    const struct dst *d = arg;
    struct sockaddr_storage ss;
    socklen_t len = fill(d, 9, &ss);
    int fd = socket(d->family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
        *out = -errno;
        return;
    }
    char ip[INET6_ADDRSTRLEN] = "";
    len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    if (d->family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof ip);
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof ip);
    *out = strcmp(ip, d->want_src) == 0;
}

static void test_lo_default_routes(int ns)
{
    struct dst v4 = {AF_INET, "203.0.113.7", "127.0.0.1"}, v6 = {AF_INET6, "2001:db8::7", "::1"};
    CHECK(in_netns(ns, probe_route, &v4) == -ENETUNREACH);
    CHECK(in_netns(ns, probe_route, &v6) == -EADDRNOTAVAIL); /* lo down: not even ::1 */
    CHECK(corral_rtnl_lo_default_routes(ns) == 0);
    CHECK(corral_rtnl_link_index(ns, "lo") == 1);
    CHECK(in_netns(ns, probe_route, &v4) == 1);
    CHECK(in_netns(ns, probe_route, &v6) == 1);
    CHECK(corral_rtnl_lo_default_routes(ns) == -EEXIST);
}

/* Listener in one netns, connect from the other: 1 once the connection is accepted. */
struct across {
    struct dst to;
    int port;
    int *ready; /* shared: listener is up */
};

static void probe_listen(void *arg, int *out)
{
    const struct across *a = arg;
    struct sockaddr_storage ss;
    socklen_t len = fill(&a->to, a->port, &ss);
    int fd = socket(a->to.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 1) < 0) {
        *out = -errno;
        *a->ready = 1;
        return;
    }
    *a->ready = 1;
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    *out = poll(&p, 1, 2000) == 1 && accept4(fd, NULL, NULL, SOCK_CLOEXEC) >= 0;
}

static void probe_connect(void *arg, int *out)
{
    const struct across *a = arg;
    struct sockaddr_storage ss;
    socklen_t len = fill(&a->to, a->port, &ss);
    int fd = socket(a->to.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    *out = connect(fd, (struct sockaddr *)&ss, len) == 0 ? 1 : -errno;
}

/* An ICMP echo and its reply within 300 ms (measured over the veth: well under 1 ms). */
static void probe_ping(void *arg, int *out)
{
    const struct dst *d = arg;
    struct sockaddr_storage ss;
    socklen_t len = fill(d, 0, &ss);
    int fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
    struct icmphdr h = {.type = ICMP_ECHO};
    h.un.echo.id = htons(0xc0);
    uint32_t s = 0;
    for (size_t i = 0; i < sizeof h / 2; i++)
        s += ((uint16_t *)&h)[i];
    s = (s >> 16) + (s & 0xffff);
    h.checksum = (uint16_t) ~(s + (s >> 16));
    if (sendto(fd, &h, sizeof h, 0, (struct sockaddr *)&ss, len) < 0) {
        *out = -errno;
        return;
    }
    char buf[256];
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    *out = 0;
    while (poll(&p, 1, 300) == 1) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        size_t hl = (size_t)(buf[0] & 0xf) * 4;
        if (n >= (ssize_t)(hl + 8) && buf[hl] == ICMP_ECHOREPLY) {
            *out = 1;
            return;
        }
    }
}

static int connect_across(int from, int to, const struct dst *d, int port)
{
    int *ready =
        mmap(NULL, sizeof *ready, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct across a = {.to = *d, .port = port, .ready = ready};
    *ready = 0;
    int *accepted =
        mmap(NULL, sizeof *accepted, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *accepted = -1000;
    pid_t l = fork();
    if (l == 0) {
        alarm(5);
        int v = -1000;
        if (setns(to, CLONE_NEWNET) == 0) probe_listen(&a, &v);
        *accepted = v;
        _exit(0);
    }
    for (int i = 0; i < 200 && !*ready; i++)
        usleep(5000);
    int connected = in_netns(from, probe_connect, &a);
    int st;
    waitpid(l, &st, 0);
    int ok = connected == 1 && *accepted == 1 ? 1 : connected < 0 ? connected : 0;
    munmap(ready, sizeof *ready);
    munmap(accepted, sizeof *accepted);
    return ok;
}

static void test_veth(int a, int b)
{
    struct in_addr a4, b4;
    struct in6_addr a6, b6;
    inet_pton(AF_INET, "192.0.2.1", &a4);
    inet_pton(AF_INET, "192.0.2.2", &b4);
    inet_pton(AF_INET6, "2001:db8::1", &a6);
    inet_pton(AF_INET6, "2001:db8::2", &b6);
    struct dst to4 = {AF_INET, "192.0.2.2", NULL}, to6 = {AF_INET6, "2001:db8::2", NULL};

    CHECK(corral_rtnl_veth(a, "corral-t0a", b, "corral-t0b") == 0);
    CHECK(corral_rtnl_veth(a, "corral-t0a", b, "corral-t0c") == -EEXIST);
    CHECK(corral_rtnl_link_index(a, "corral-t0a") > 0);
    CHECK(corral_rtnl_link_index(b, "corral-t0b") > 0);
    CHECK(corral_rtnl_link_index(a, "corral-t0b") == -ENODEV); /* moved into b */
    CHECK(corral_rtnl_addr(a, "corral-t0a", AF_INET, &a4, 24) == 0);
    CHECK(corral_rtnl_addr(b, "corral-t0b", AF_INET, &b4, 24) == 0);
    CHECK(corral_rtnl_addr(a, "corral-t0a", AF_INET6, &a6, 64) == 0);
    CHECK(corral_rtnl_addr(b, "corral-t0b", AF_INET6, &b6, 64) == 0);
    CHECK(corral_rtnl_addr(a, "corral-t0a", AF_INET, &a4, 24) == -EEXIST);

    /* Addressed but down: the echo leaves (a has lo's default route) and no reply comes. */
    CHECK(in_netns(a, probe_ping, &to4) == 0);
    CHECK(corral_rtnl_link_up(a, "corral-t0a") == 0);
    CHECK(corral_rtnl_link_up(b, "corral-t0b") == 0);
    /* Up: an echo and TCP over both families (IPv6 at once: the addresses skip DAD).
     * A veth's carrier comes up asynchronously, so the first echo may be lost (seen once
     * in a full run): up to ten tries, 300 ms each. */
    int pinged = 0;
    for (int i = 0; i < 10 && pinged != 1; i++)
        pinged = in_netns(a, probe_ping, &to4);
    CHECK(pinged == 1);
    CHECK(connect_across(a, b, &to4, 7001) == 1);
    CHECK(connect_across(a, b, &to6, 7002) == 1);

    CHECK(corral_rtnl_link_del(a, "corral-t0a") == 0);
    CHECK(corral_rtnl_link_index(a, "corral-t0a") == -ENODEV);
    CHECK(corral_rtnl_link_index(b, "corral-t0b") == -ENODEV); /* the peer went with it */
    CHECK(corral_rtnl_link_del(a, "corral-t0a") == -ENODEV);
    CHECK(in_netns(a, probe_ping, &to4) == 0);
}

static void test_bad_args(int ns)
{
    struct in_addr x = {0};
    CHECK(corral_rtnl_addr(ns, "lo", AF_UNIX, &x, 8) == -EAFNOSUPPORT);
    CHECK(corral_rtnl_addr(ns, "lo", AF_INET, &x, 33) == -EINVAL);
    CHECK(corral_rtnl_addr(ns, "no-such-link", AF_INET, &x, 8) == -ENODEV);
    CHECK(corral_rtnl_link_up(ns, "") == -EINVAL);
    CHECK(corral_rtnl_link_up(ns, "a-name-longer-than-ifnamsiz") == -EINVAL);
    CHECK(corral_rtnl_link_up(ns, "no-such-link") == -ENODEV);
    CHECK(corral_rtnl_veth(ns, "corral-t1a", -1, "corral-t1b") == -EBADF);
}

int main(void)
{
    int fds = count_fds();
    int a = corral_ns_new_net(), b = corral_ns_new_net();
    CHECK(a >= 0 && b >= 0);
    if (a < 0 || b < 0) return DONE();
    test_open_in(a);
    test_lo_default_routes(a);
    test_veth(a, b);
    test_bad_args(b);
    close(a);
    close(b);
    CHECK(count_fds() == fds);
    return DONE();
}
