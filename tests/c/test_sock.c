/*
 * Mark-checked sockets, corral_reset, the original-destination failure paths, and the
 * plain TCP helpers.
 *
 * The mark: the parent (root, every capability) gets a connected socket whose SO_MARK
 * reads back 42. A forked child that dropped CAP_NET_ADMIN and CAP_NET_RAW (still uid
 * 0) gets -EPERM from the same call, no fd (the fd count is unchanged) and no
 * connection at the listener, while a connect without a mark from that same child
 * succeeds: the refusal is the mark's, not the network's.
 *
 * The test runs in a netns of its own (unshare at start, lo up), so its loopback ports
 * meet nobody else's.
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
#include <sys/capability.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "check.h"
#include "netpair.h"
#include "ns.h"
#include "listen.h"
#include "rtnl.h"
#include "sock.h"

static socklen_t addr_of(const char *ip, int port, struct sockaddr_storage *ss)
{
    socklen_t len = 0;
    corral_sockaddr_from(ip, port, ss, &len);
    return len;
}

static uint32_t mark_of(int fd)
{
    uint32_t m = 0;
    socklen_t len = sizeof m;
    getsockopt(fd, SOL_SOCKET, SO_MARK, &m, &len);
    return m;
}

struct child_report {
    int marked; /* corral_connect_marked(…, 42, …) */
    int what_ok;
    int fds_before, fds_after;
    int have_net_admin;
    int unmarked; /* corral_connect_marked(…, 0, …): the control in the same child */
};

static void drop_net_caps(void)
{
    cap_t caps = cap_get_proc();
    cap_value_t drop[] = {CAP_NET_ADMIN, CAP_NET_RAW};
    cap_set_flag(caps, CAP_EFFECTIVE, 2, drop, CAP_CLEAR);
    cap_set_flag(caps, CAP_PERMITTED, 2, drop, CAP_CLEAR);
    cap_set_flag(caps, CAP_INHERITABLE, 2, drop, CAP_CLEAR);
    cap_set_proc(caps);
    cap_free(caps);
}

static int have_cap(cap_value_t v)
{
    cap_t caps = cap_get_proc();
    cap_flag_value_t on = CAP_CLEAR;
    cap_get_flag(caps, v, CAP_EFFECTIVE, &on);
    cap_free(caps);
    return on == CAP_SET;
}

static void test_mark_checked(void)
{
    int port = 0;
    int l = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(l >= 0);
    struct sockaddr_storage ss;
    socklen_t len = addr_of("127.0.0.1", port, &ss);

    /* Control: with CAP_NET_ADMIN the mark is set, read back, and the fd connected. */
    int fd = corral_connect_marked((struct sockaddr *)&ss, len, 42, 1000, -1);
    CHECK(fd >= 0);
    CHECK(mark_of(fd) == 42);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    CHECK(!(fcntl(fd, F_GETFL) & O_NONBLOCK));
    int a = corral_tcp_accept(l, 1000);
    CHECK(a >= 0);
    CHECK(write(fd, "m", 1) == 1);
    char b;
    CHECK(read(a, &b, 1) == 1 && b == 'm');
    close(a);
    close(fd);

    int rep[2];
    CHECK(pipe2(rep, O_CLOEXEC) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct child_report r = {0};
        drop_net_caps();
        r.have_net_admin = have_cap(CAP_NET_ADMIN);
        r.fds_before = count_fds();
        r.marked = corral_connect_marked((struct sockaddr *)&ss, len, 42, 1000, -1);
        r.fds_after = count_fds();
        const char *what = NULL;
        int again = corral_connect_marked_ex((struct sockaddr *)&ss, len, 42, 1000, -1, &what);
        r.what_ok = again == -EPERM && what && strcmp(what, "setsockopt_mark") == 0;
        r.unmarked = corral_connect_marked((struct sockaddr *)&ss, len, 0, 1000, -1);
        if (write(rep[1], &r, sizeof r) != sizeof r) _exit(2);
        _exit(0);
    }
    close(rep[1]);
    struct child_report r;
    memset(&r, 0, sizeof r);
    CHECK(read(rep[0], &r, sizeof r) == sizeof r);
    close(rep[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(r.have_net_admin == 0);
    CHECK(r.marked == -EPERM);
    CHECK(r.fds_before == r.fds_after);
    CHECK(r.what_ok);
    CHECK(r.unmarked >= 0); /* same child, no mark: connects */
    /* Exactly one connection reached the listener: the unmarked control's. */
    a = corral_tcp_accept(l, 1000);
    CHECK(a >= 0);
    if (a >= 0) close(a);
    CHECK(corral_tcp_accept(l, 100) == -ETIMEDOUT);
    close(l);
}

static void test_connect_in_netns(void)
{
    int ns = corral_ns_new_net();
    CHECK(ns >= 0 && corral_rtnl_lo_default_routes(ns) == 0);
    int port = 0;
    int l = corral_listen_in_netns(ns, SOCK_STREAM, "127.0.0.1", 0, &port);
    CHECK(l >= 0);
    struct sockaddr_storage ss;
    socklen_t len = addr_of("127.0.0.1", port, &ss);
    /* The port exists only in ns: from here it refuses, made in ns it connects. */
    CHECK(corral_connect_marked((struct sockaddr *)&ss, len, 0, 1000, -1) == -ECONNREFUSED);
    int fd = corral_connect_marked((struct sockaddr *)&ss, len, 42, 1000, ns);
    CHECK(fd >= 0 && corral_ns_socket_is(fd, ns) == 1 && mark_of(fd) == 42);
    if (fd >= 0) close(fd);

    /* An address routed into lo that nobody answers: the SYN is dropped, the deadline
     * is what ends the wait. */
    len = addr_of("203.0.113.9", 80, &ss);
    const char *what = NULL;
    CHECK(corral_connect_marked_ex((struct sockaddr *)&ss, len, 0, 100, ns, &what) == -ETIMEDOUT);
    CHECK(what && strcmp(what, "timeout") == 0);
    int mnt = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    CHECK(corral_connect_marked_ex((struct sockaddr *)&ss, len, 0, 100, mnt, &what) == -EINVAL);
    CHECK(what && strcmp(what, "setns") == 0);
    close(mnt);
    close(l);
    close(ns);
}

static void test_reset(void)
{
    int x, y;
    char b[4];
    /* Control: a plain close is an orderly end of stream. */
    CHECK(tcp_pair(&x, &y) == 0);
    close(x);
    CHECK(read(y, b, sizeof b) == 0);
    close(y);
    /* corral_reset: the peer sees a reset at once. */
    CHECK(tcp_pair(&x, &y) == 0);
    CHECK(corral_reset(x) == 0);
    errno = 0;
    CHECK(read(y, b, sizeof b) < 0 && errno == ECONNRESET);
    close(y);
    /* Not a socket: still closed, the error reported. */
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    CHECK(corral_reset(p[0]) == -ENOTSOCK);
    CHECK(fcntl(p[0], F_GETFD) < 0 && errno == EBADF);
    close(p[1]);
}

static void test_original_dst_failures(void)
{
    struct sockaddr_storage od;
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    CHECK(corral_original_dst(p[0], &od) == -ENOTSOCK);
    close(p[0]);
    close(p[1]);
    int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(corral_original_dst(u, &od) == -EAFNOSUPPORT);
    close(u);
}

static void test_sockaddr_text(void)
{
    struct sockaddr_storage ss;
    char buf[INET6_ADDRSTRLEN];
    int port = 0;
    CHECK(corral_sockaddr_from("2001:db8::1", 443, &ss, &(socklen_t){0}) == AF_INET6);
    CHECK(corral_sockaddr_text(&ss, buf, sizeof buf, &port) == 0);
    CHECK(strcmp(buf, "2001:db8::1") == 0 && port == 443);
    CHECK(corral_sockaddr_from("[2001:db8::1]", 443, &ss, &(socklen_t){0}) == -EINVAL);
    CHECK(corral_sockaddr_from("10.0.0.1", -1, &ss, &(socklen_t){0}) == -EINVAL);
}

int main(void)
{
    /* A netns of our own for every loopback port below. */
    CHECK(unshare(CLONE_NEWNET) == 0);
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    CHECK(self >= 0 && corral_rtnl_lo_default_routes(self) == 0);
    close(self);
    int before = count_fds();
    test_mark_checked();
    test_connect_in_netns();
    test_reset();
    test_original_dst_failures();
    test_sockaddr_text();
    CHECK(count_fds() == before);
    return DONE();
}
