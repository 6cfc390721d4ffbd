/*
 * corral_udprelay_* with the real ruleset (nft.c, udp_port) and mark route
 * (corral_rtnl_mark_local) in a throwaway netns: a tenant socket made in that netns sends
 * to a synthetic address, the relay reports the flow with its original destination, and
 * once allowed relays it to an echo socket on this host's loopback and the echo back from
 * the address the tenant wrote to; a denied flow's datagrams never reach the echo; a port
 * outside udp_ports is refused at send and recorded; flows end idle, cut or at shutdown
 * with their counts; a full table drops and counts; nothing is left open.
 *
 * 198.18.0.0/15 and 64:ff9b:1::/48 (the synthetic ranges) and 203.0.113.0/24 exist here
 * only inside the netns, routed to lo.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "check.h"
#include "nft.h"
#include "ns.h"
#include "rtnl.h"
#include "sock.h"
#include "udprelay.h"
#include "util.h"

#define MARK 42
#define UDP_MARK 43
#define TABLE 43

static int ns_fd;

static struct sockaddr_storage addr_of(const char *ip, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    corral_sockaddr_from(ip, port, &ss, &len);
    return ss;
}

static socklen_t len_of(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

/* A tenant's socket: made inside the netns, connected to ip:port there. */
static int tenant(const char *ip, int port)
{
    struct sockaddr_storage to = addr_of(ip, port);
    int fd = corral_ns_socket(ns_fd, to.ss_family, SOCK_DGRAM, 0);
    if (fd < 0) return fd;
    if (connect(fd, (struct sockaddr *)&to, len_of(&to)) < 0) {
        close(fd);
        return -errno;
    }
    return fd;
}

/* An echo server's socket on this host: ip, a port the kernel chooses. */
static int server(const char *ip, int *port)
{
    struct sockaddr_storage ss = addr_of(ip, 0);
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = len_of(&ss);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -1;
    char text[64];
    corral_sockaddr_text(&ss, text, sizeof text, port);
    return fd;
}

/* Echoes one datagram if one arrives within ms; returns its length or -1. */
static ssize_t echo_one(int fd, int ms, char *buf, size_t cap)
{
    if (corral_poll_fd(fd, POLLIN, ms) <= 0) return -1;
    struct sockaddr_storage from;
    socklen_t len = sizeof from;
    ssize_t n = recvfrom(fd, buf, cap, MSG_DONTWAIT, (struct sockaddr *)&from, &len);
    if (n > 0) sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, len);
    return n;
}

/* Runs the relay for up to ms, until it reports an event; returns how many it copied. */
static int run_for(struct corral_udprelay *r, int ms, struct corral_udprelay_event *ev, size_t max)
{
    for (int waited = 0;; waited += 10) {
        int n = corral_udprelay_run(r, ev, max);
        if (n != 0 || waited >= ms) return n;
        struct pollfd p = {.fd = corral_udprelay_fd(r), .events = POLLIN};
        poll(&p, 1, 10);
    }
}

static int text_is(const struct sockaddr_storage *ss, const char *ip, int port)
{
    char text[64];
    int p = 0;
    return corral_sockaddr_text(ss, text, sizeof text, &p) == 0 && strcmp(text, ip) == 0 &&
           (port < 0 || p == port);
}

static struct corral_nft_plan plan_for(uint16_t relay_port)
{
    struct corral_nft_plan p = {.dns_port = 5353,
                                .acceptor_port = 4000,
                                .mark = MARK,
                                .udp_port = relay_port,
                                .udp_mark = UDP_MARK,
                                .n_udp_ports = 1};
    p.udp_ports[0] = (struct corral_nft_port_range){123, 123};
    return p;
}

static void test_flows(void)
{
    struct corral_udprelay_opts o = {.netns_fd = ns_fd, .mark = MARK, .upstream_netns_fd = -1};
    struct corral_udprelay *r = NULL;
    uint16_t port = 0;
    struct corral_udprelay_event ev[8];
    char buf[256];
    CHECK(corral_udprelay_new(&o, &r, &port) == 0 && port > 0);
    struct corral_nft_plan plan = plan_for(port);
    CHECK(corral_nft_apply(ns_fd, &plan) == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    int up4_port = 0, up6_port = 0;
    int up4 = server("127.0.0.1", &up4_port), up6 = server("::1", &up6_port);
    CHECK(up4 >= 0 && up6 >= 0);

    /* IPv4: the flow is reported with the destination the tenant wrote to. */
    int c4 = tenant("198.18.1.2", 123);
    CHECK(c4 >= 0 && send(c4, "one", 3, 0) == 3);
    CHECK(run_for(r, 1000, ev, 8) == 1);
    CHECK(ev[0].kind == CORRAL_UDPRELAY_NEW && ev[0].size == 3);
    CHECK(text_is(&ev[0].dst, "198.18.1.2", 123) && text_is(&ev[0].src, "127.0.0.1", -1));
    CHECK(corral_udprelay_count(r) == 0); /* undecided: holds no upstream yet */
    uint64_t id4 = ev[0].id;
    /* Held until decided: nothing reached the echo yet. */
    CHECK(echo_one(up4, 100, buf, sizeof buf) < 0);
    /* A link-local address without its interface cannot be connected to (EINVAL at
     * once): the relay moves on to the next address, and says which one it took. */
    struct sockaddr_storage ups[2] = {addr_of("fe80::1", up4_port), addr_of("127.0.0.1", up4_port)};
    size_t used = 9;
    CHECK(corral_udprelay_allow(r, id4, ups, 1, 5000, &used) < 0); /* the first alone fails */
    CHECK(corral_udprelay_allow(r, id4, ups, 2, 5000, &used) == 0 && used == 1);
    CHECK(echo_one(up4, 1000, buf, sizeof buf) == 3);
    CHECK(run_for(r, 1000, ev, 8) == 0);
    CHECK(corral_poll_fd(c4, POLLIN, 1000) > 0 && recv(c4, buf, sizeof buf, MSG_DONTWAIT) == 3 &&
          memcmp(buf, "one", 3) == 0);
    /* A second datagram of the flow goes straight through: no new event. */
    CHECK(send(c4, "two!", 4, 0) == 4);
    run_for(r, 200, ev, 8);
    CHECK(echo_one(up4, 1000, buf, sizeof buf) == 4);
    CHECK(run_for(r, 300, ev, 8) == 0);
    CHECK(corral_poll_fd(c4, POLLIN, 1000) > 0 && recv(c4, buf, sizeof buf, MSG_DONTWAIT) == 4);
    CHECK(corral_udprelay_allow(r, id4, ups, 1, 5000, NULL) == -ENOENT); /* decided already */

    /* IPv6, to the synthetic IPv6 form of the same slot. */
    int c6 = tenant("64:ff9b:1::c612:102", 123);
    CHECK(c6 >= 0 && send(c6, "six", 3, 0) == 3);
    CHECK(run_for(r, 1000, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_NEW);
    CHECK(text_is(&ev[0].dst, "64:ff9b:1::c612:102", 123) && text_is(&ev[0].src, "::1", -1));
    uint64_t id6 = ev[0].id;
    struct sockaddr_storage up6a = addr_of("::1", up6_port);
    CHECK(corral_udprelay_allow(r, id6, &up6a, 1, 5000, NULL) == 0);
    CHECK(echo_one(up6, 1000, buf, sizeof buf) == 3);
    run_for(r, 300, ev, 8);
    CHECK(corral_poll_fd(c6, POLLIN, 1000) > 0 && recv(c6, buf, sizeof buf, MSG_DONTWAIT) == 3);

    /* Denied: neither the first datagram nor a later one reaches the echo, and the later
     * ones wake no one. */
    int cd = tenant("203.0.113.7", 123);
    CHECK(cd >= 0 && send(cd, "deny", 4, 0) == 4);
    CHECK(run_for(r, 1000, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_NEW);
    uint64_t denied = ev[0].id;
    CHECK(corral_udprelay_deny(r, denied, 400) == 0);
    CHECK(corral_udprelay_count(r) == 2);
    CHECK(send(cd, "deny2", 5, 0) == 5);
    CHECK(run_for(r, 200, ev, 8) == 0);
    CHECK(echo_one(up4, 200, buf, sizeof buf) < 0 && echo_one(up6, 10, buf, sizeof buf) < 0);
    /* ... and ends quietly after its hold, its drops counted. */
    CHECK(run_for(r, 1500, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_END && ev[0].id == denied);
    CHECK(!ev[0].allowed && ev[0].why == CORRAL_UDPRELAY_IDLE && ev[0].dropped == 2 &&
          ev[0].sent == 0);

    /* A port outside udp_ports never reaches the relay: the ruleset refuses it, counted. */
    int cp = tenant("198.18.1.2", 124);
    CHECK(cp >= 0 && send(cp, "port", 4, 0) < 0 && errno == EPERM);
    CHECK(run_for(r, 200, ev, 8) == 0);
    struct corral_nft_refusal rec[8];
    size_t nrec = 0;
    uint64_t total = 0;
    CHECK(corral_nft_refused(ns_fd, NULL, rec, 8, &nrec, &total) == 0);
    CHECK(nrec == 1 && total == 1 && rec[0].proto == IPPROTO_UDP && rec[0].port == 124);

    /* Cut: the IPv6 flow ends now, with what it moved. */
    CHECK(corral_udprelay_cut(r, 12345) == -ENOENT);
    CHECK(corral_udprelay_cut(r, id6) == 0);
    CHECK(run_for(r, 100, ev, 8) == 1 && ev[0].why == CORRAL_UDPRELAY_CUT && ev[0].allowed);
    CHECK(ev[0].bytes_up == 3 && ev[0].bytes_down == 3 && ev[0].sent == 1 && ev[0].received == 1);
    CHECK(corral_udprelay_count(r) == 1);

    /* Shutdown ends the rest, each with its counts. */
    corral_udprelay_shutdown(r);
    CHECK(run_for(r, 100, ev, 8) == 1 && ev[0].id == id4 && ev[0].why == CORRAL_UDPRELAY_CLOSED);
    CHECK(ev[0].bytes_up == 7 && ev[0].bytes_down == 7 && ev[0].sent == 2 && ev[0].received == 2);
    CHECK(corral_udprelay_count(r) == 0);
    corral_udprelay_free(r);
    CHECK(corral_nft_delete(ns_fd, NULL) == 0);
    close(c4);
    close(c6);
    close(cd);
    close(cp);
    close(up4);
    close(up6);
}

/* Idle: an allowed flow silent both ways past its limit ends, reported as idle. A table of
 * one: a second flow is dropped and counted, the first still relayed. */
static void test_idle_and_full_table(void)
{
    struct corral_udprelay_opts o = {
        .netns_fd = ns_fd, .mark = MARK, .upstream_netns_fd = -1, .max_entries = 1};
    struct corral_udprelay *r = NULL;
    uint16_t port = 0;
    struct corral_udprelay_event ev[8];
    char buf[64];
    CHECK(corral_udprelay_new(&o, &r, &port) == 0);
    struct corral_nft_plan plan = plan_for(port);
    CHECK(corral_nft_apply(ns_fd, &plan) == 0);
    int up_port = 0, up = server("127.0.0.1", &up_port);
    int a = tenant("198.18.1.3", 123), b = tenant("198.18.1.4", 123);
    CHECK(a >= 0 && b >= 0 && send(a, "a", 1, 0) == 1);
    CHECK(run_for(r, 1000, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_NEW);
    struct sockaddr_storage ss = addr_of("127.0.0.1", up_port);
    CHECK(corral_udprelay_allow(r, ev[0].id, &ss, 1, 300, NULL) == 0);
    CHECK(echo_one(up, 1000, buf, sizeof buf) == 1);
    CHECK(send(b, "b", 1, 0) == 1);
    CHECK(run_for(r, 1000, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_OVERFLOW &&
          ev[0].dropped == 1);
    CHECK(echo_one(up, 100, buf, sizeof buf) < 0);
    CHECK(corral_poll_fd(a, POLLIN, 1000) > 0 &&
          recv(a, buf, sizeof buf, MSG_DONTWAIT) == 1); /* control */
    CHECK(run_for(r, 1500, ev, 8) == 1 && ev[0].kind == CORRAL_UDPRELAY_END);
    CHECK(ev[0].why == CORRAL_UDPRELAY_IDLE && ev[0].allowed && ev[0].bytes_up == 1 &&
          ev[0].bytes_down == 1);
    corral_udprelay_free(r);
    CHECK(corral_nft_delete(ns_fd, NULL) == 0);
    close(a);
    close(b);
    close(up);
}

static void test_bad_arguments(void)
{
    struct corral_udprelay *r = NULL;
    uint16_t port;
    struct corral_udprelay_opts o = {.netns_fd = ns_fd, .mark = 0, .upstream_netns_fd = -1};
    CHECK(corral_udprelay_new(&o, &r, &port) == -EINVAL && r == NULL);
    o.mark = MARK;
    o.netns_fd = -1;
    CHECK(corral_udprelay_new(&o, &r, &port) == -EINVAL && r == NULL);
    CHECK(corral_rtnl_mark_local(ns_fd, 0, TABLE) == -EINVAL);
    CHECK(corral_rtnl_mark_local(ns_fd, UDP_MARK, 254) == -EINVAL);   /* main */
    CHECK(corral_rtnl_mark_local(ns_fd, UDP_MARK, TABLE) == -EEXIST); /* made once */
    struct corral_nft_plan p = plan_for(1000);
    p.udp_mark = MARK; /* the host's own mark would exempt and route at once */
    CHECK(corral_nft_apply(ns_fd, &p) == -EINVAL);
    p = plan_for(0);
    CHECK(corral_nft_apply(ns_fd, &p) == -EINVAL); /* ports without a relay */
    corral_udprelay_free(NULL);
}

int main(void)
{
    if (geteuid() != 0) {
        printf("%s: skipped (needs root)\n", __FILE__);
        return 0;
    }
    ns_fd = corral_ns_new_net();
    CHECK(ns_fd >= 0);
    CHECK(corral_rtnl_lo_default_routes(ns_fd) == 0);
    CHECK(corral_rtnl_mark_local(ns_fd, UDP_MARK, TABLE) == 0);
    int before = count_fds();
    test_flows();
    test_idle_and_full_table();
    CHECK(count_fds() == before);
    test_bad_arguments();
    close(ns_fd);
    return DONE();
}
