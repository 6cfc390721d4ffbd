/*
 * corral_nft_*: the sandbox ruleset applied in a throwaway netns, read back by the nft CLI
 * (control) and by verify, tampered with behind its back, deleted; a batch with one bad
 * message creates nothing; and end to end, with lo + default routes + ruleset, a connect
 * to 203.0.113.7:80 lands on the in-netns acceptor with SO_ORIGINAL_DST intact, DNS to
 * any address reaches the responder, and other UDP and ICMP are rejected at once.
 *
 * Each netns is anonymous (made by a thread's unshare, held only by an fd): it vanishes
 * with the fd, so nothing is left behind whatever fails. Addresses 203.0.113.0/24,
 * 198.51.100.0/24 and 2001:db8::/32 are documentation ranges that exist here only
 * through the redirect inside the netns, which has no link but lo.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/icmp6.h>
#include <netinet/ip_icmp.h>
#include <linux/netfilter_ipv4.h>

#include "check.h"
#include "ns.h"
#include "nft.h"
#include "rtnl.h"

#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80
#endif

#define DNS_PORT 5353
#define ACCEPTOR_PORT 4000

static int ns_fd; /* for the nft CLI: nsenter --net=/proc/PID/fd/N */

static char *run_capture(int *status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *run_capture(int *status, const char *fmt, ...)
{
    char cmd[1024];
    int n = snprintf(cmd, sizeof cmd, "nsenter --net=/proc/%d/fd/%d ", (int)getpid(), ns_fd);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd + n, sizeof cmd - (size_t)n, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>/dev/null", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 65536, len = 0;
    char *out = calloc(1, cap);
    size_t got;
    while (out && (got = fread(out + len, 1, cap - len - 1, p)) > 0)
        len += got;
    int st = pclose(p);
    if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* Each needle found after the previous one. */
static int in_order(const char *hay, const char *const *needles, size_t n)
{
    const char *at = hay;
    for (size_t i = 0; at && i < n; i++) {
        at = strstr(at, needles[i]);
        if (!at)
            fprintf(stderr, "missing or out of order: %s\n", needles[i]);
        else
            at += strlen(needles[i]);
    }
    return at != NULL;
}

/* The handle of the last rule in `chain` whose line contains `needle`, or -1. */
static long rule_handle(const char *chain, const char *needle)
{
    char *out = run_capture(NULL, "nft -a list chain inet corral %s", chain);
    long handle = -1;
    for (char *line = out ? strtok(out, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        char *h = strstr(line, "# handle ");
        if (h && strstr(line, needle)) handle = strtol(h + 9, NULL, 10);
    }
    free(out);
    return handle;
}

static const struct corral_nft_plan plan = {
    .table = "corral", .dns_port = DNS_PORT, .acceptor_port = ACCEPTOR_PORT, .mark = 42};

static void test_apply_verify_tamper_delete(void)
{
    int st;
    char *out;
    CHECK(corral_nft_verify(ns_fd, &plan) == -ENOENT);
    CHECK(corral_nft_apply(ns_fd, &plan) == 0);
    CHECK(corral_nft_apply(ns_fd, &plan) == -EEXIST);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* The record of refused SYNs starts empty; a NULL buffer is refused, none is read. */
    struct corral_nft_refusal rec[4];
    size_t nrec = 99;
    uint64_t total = 99;
    CHECK(corral_nft_refused(ns_fd, "corral", rec, 4, &nrec, &total) == 0);
    CHECK(nrec == 0 && total == 0);
    CHECK(corral_nft_refused(ns_fd, "corral", NULL, 4, &nrec, &total) == -EINVAL);

    /* verify tells plans apart: same ruleset, other port or mark. */
    struct corral_nft_plan other = plan;
    other.acceptor_port = ACCEPTOR_PORT + 1;
    CHECK(corral_nft_verify(ns_fd, &other) == -EPROTO);
    other = plan;
    other.mark = 43;
    CHECK(corral_nft_verify(ns_fd, &other) == -EPROTO);

    /* The nft CLI reads back both chains and every rule, in order. */
    static const char *const expect[] = {
        "table inet corral {",
        "chain nat_out {",
        "type nat hook output priority -100; policy accept;",
        "meta mark 0x0000002a return",
        "ip daddr 127.0.0.0/8 return",
        "ip6 daddr ::1 return",
        "udp dport 53 redirect to :5353",
        "tcp dport 53 redirect to :5353",
        "meta l4proto tcp redirect to :4000",
        "chain filter_out {",
        "type filter hook output priority filter; policy drop;",
        "ct state established,related meta l4proto != udp accept",
        "oif \"lo\" ct state established,related accept",
        "meta mark 0x0000002a accept",
        "ct status dnat accept",
        "oif \"lo\" ip daddr 127.0.0.0/8 accept",
        "oif \"lo\" ip6 daddr ::1 accept",
        "meta l4proto tcp reject with tcp reset",
        "reject with icmpx admin-prohibited",
    };
    out = run_capture(&st, "nft list table inet corral");
    CHECK(st == 0 && out && in_order(out, expect, sizeof expect / sizeof expect[0]));
    free(out);

    /* One rule added behind verify's back, then removed again. */
    free(run_capture(&st, "nft add rule inet corral filter_out meta l4proto udp accept"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    long h = rule_handle("filter_out", "meta l4proto udp accept");
    CHECK(h > 0);
    free(run_capture(&st, "nft delete rule inet corral filter_out handle %ld", h));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* One of ours deleted, then put back in its place: verify compares content, not
     * handles. */
    h = rule_handle("nat_out", "meta mark");
    CHECK(h > 0);
    free(run_capture(&st, "nft delete rule inet corral nat_out handle %ld", h));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    free(run_capture(&st, "nft insert rule inet corral nat_out meta mark 42 return"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* One rule changed in place (same count): reject code. */
    h = rule_handle("filter_out", "icmpx");
    CHECK(h > 0);
    free(run_capture(&st, "nft replace rule inet corral filter_out handle %ld reject", h));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    free(run_capture(&st,
                     "nft replace rule inet corral filter_out handle %ld reject with icmpx "
                     "admin-prohibited",
                     h));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* Chain policy flipped. */
    free(run_capture(&st, "nft 'chain inet corral filter_out { policy accept; }'"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    free(run_capture(&st, "nft 'chain inet corral filter_out { policy drop; }'"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* An extra chain in the table. */
    free(run_capture(&st, "nft add chain inet corral extra"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    free(run_capture(&st, "nft delete chain inet corral extra"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    /* A dormant table enforces nothing. */
    free(run_capture(&st, "nft add table inet corral '{ flags dormant; }'"));
    CHECK(st == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);

    CHECK(corral_nft_delete(ns_fd, "corral") == 0);
    free(run_capture(&st, "nft list table inet corral"));
    CHECK(st != 0);
    out = run_capture(&st, "nft list ruleset");
    CHECK(st == 0 && out && out[strspn(out, " \n")] == '\0');
    free(out);
    CHECK(corral_nft_verify(ns_fd, &plan) == -ENOENT);
    CHECK(corral_nft_refused(ns_fd, "corral", rec, 4, &nrec, &total) == -ENOENT);
    CHECK(corral_nft_delete(ns_fd, "corral") == -ENOENT);
}

/* With tcp_ports, only those ports are redirected (the rest meets the TCP reset at its
 * SYN); replace swaps the whole table in one transaction, and verify tells the plans
 * apart. The catch-all plan is the control. */
static void test_port_ranges_and_replace(void)
{
    int st;
    struct corral_nft_plan ports = plan;
    ports.tcp_ports[0] = (struct corral_nft_port_range){443, 443};
    ports.tcp_ports[1] = (struct corral_nft_port_range){8000, 8080};
    ports.n_tcp_ports = 2;
    CHECK(corral_nft_apply(ns_fd, &ports) == 0);
    CHECK(corral_nft_verify(ns_fd, &ports) == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    static const char *const expect[] = {"tcp dport 443 redirect to :4000",
                                         "tcp dport 8000-8080 redirect to :4000",
                                         "meta l4proto tcp reject with tcp reset"};
    char *out = run_capture(&st, "nft list table inet corral");
    CHECK(st == 0 && out && in_order(out, expect, 3));
    CHECK(out && !strstr(out, "meta l4proto tcp redirect")); /* no catch-all left */
    free(out);

    /* Replaced in place by the catch-all plan: one transaction, never absent. */
    struct corral_nft_plan back = plan;
    back.replace = true;
    CHECK(corral_nft_apply(ns_fd, &back) == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);
    CHECK(corral_nft_verify(ns_fd, &ports) == -EPROTO);
    CHECK(corral_nft_delete(ns_fd, NULL) == 0);
    CHECK(corral_nft_apply(ns_fd, &back) < 0); /* nothing to replace: refused, nothing made */
    CHECK(corral_nft_verify(ns_fd, &plan) == -ENOENT);

    /* no_tcp: not a single TCP redirect (DNS's own rules stay). */
    struct corral_nft_plan none = plan;
    none.no_tcp = true;
    CHECK(corral_nft_apply(ns_fd, &none) == 0);
    CHECK(corral_nft_verify(ns_fd, &none) == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == -EPROTO);
    out = run_capture(&st, "nft list table inet corral");
    CHECK(st == 0 && out && !strstr(out, "redirect to :4000") && strstr(out, "redirect to :5353"));
    free(out);
    CHECK(corral_nft_delete(ns_fd, NULL) == 0);

    struct corral_nft_plan bad = plan;
    bad.tcp_ports[0] = (struct corral_nft_port_range){90, 80};
    bad.n_tcp_ports = 1;
    CHECK(corral_nft_apply(ns_fd, &bad) == -EINVAL);
}

static void test_bad_batch_creates_nothing(void)
{
    int st;
    struct corral_nft_plan bad = plan;
    bad.test_bad_message = 1;
    CHECK(corral_nft_apply(ns_fd, &bad) == -ENOENT);
    char *out = run_capture(&st, "nft list ruleset");
    CHECK(st == 0 && out && out[strspn(out, " \n")] == '\0');
    free(out);
    CHECK(corral_nft_verify(ns_fd, &plan) == -ENOENT);

    /* Control: the same batch without the bad message creates everything. */
    CHECK(corral_nft_apply(ns_fd, &plan) == 0);
    out = run_capture(&st, "nft list ruleset");
    CHECK(st == 0 && out && strstr(out, "table inet corral") && strstr(out, "chain filter_out"));
    free(out);
    CHECK(corral_nft_delete(ns_fd, "corral") == 0);
}

static void test_bad_plans(void)
{
    struct corral_nft_plan p = plan;
    p.mark = 0;
    CHECK(corral_nft_apply(ns_fd, &p) == -EINVAL);
    p = plan;
    p.dns_port = 0;
    CHECK(corral_nft_apply(ns_fd, &p) == -EINVAL);
    p = plan;
    p.table = "";
    CHECK(corral_nft_apply(ns_fd, &p) == -EINVAL);
    int dir = open("/", O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    CHECK(corral_nft_apply(dir, &plan) == -EINVAL); /* not a netns: setns refuses */
    close(dir);
    /* Default table name. */
    p = plan;
    p.table = NULL;
    CHECK(corral_nft_apply(ns_fd, &p) == 0);
    CHECK(corral_nft_verify(ns_fd, &p) == 0);
    CHECK(corral_nft_delete(ns_fd, NULL) == 0);
}

/* ---- end to end, in a child that has setns()ed into the netns ---- */

struct e2e {
    int line;                  /* first step that failed, 0 if none */
    char orig4[64], orig6[80]; /* SO_ORIGINAL_DST as read on the accepted sockets */
    int data4;                 /* bytes flowed acceptor -> client over the redirect */
    int dns4, dns6;            /* the responder got the query and the client its reply */
    /* [0] IPv4 to 203.0.113.7, [1] IPv6 to 2001:db8::7 */
    int udp_send_errno[2]; /* send() to port 9999 */
    long udp_send_ms[2];   /* how long until send() failed */
    int udp_recv_errno[2]; /* then recv(): an ICMP error sent back, or ETIMEDOUT */
    int echo_lo[2];        /* echo reply from 127.0.0.1 / ::1 (control) */
    int echo_errno[2];     /* sendto() of an echo request */
    long echo_ms[2];       /* how long until sendto() failed */
    int echo_unreach[2];   /* code of a dest-unreachable seen by the raw socket, or -1 */
};

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static int sa(int family, const char *ip, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)ss;
        s->sin_family = AF_INET;
        s->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, ip, &s->sin_addr);
        return sizeof *s;
    }
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
    s->sin6_family = AF_INET6;
    s->sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, ip, &s->sin6_addr);
    return sizeof *s;
}

static int sock_at(int family, int type, const char *ip, int port, int do_connect)
{
    struct sockaddr_storage ss;
    socklen_t len = (socklen_t)sa(family, ip, port, &ss);
    int fd = socket(family, type | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int r = do_connect ? connect(fd, (struct sockaddr *)&ss, len)
                       : bind(fd, (struct sockaddr *)&ss, len);
    if (r < 0 || (!do_connect && type == SOCK_STREAM && listen(fd, 8) < 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int wait_in(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    return poll(&p, 1, ms) == 1;
}

#define STEP(cond)                                                                                 \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (!r->line) r->line = __LINE__;                                                      \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void e2e_tcp(struct e2e *r, int family, const char *dst, int listener)
{
    int c = sock_at(family, SOCK_STREAM, dst, 80, 1);
    STEP(c >= 0);
    STEP(wait_in(listener, 1000));
    int a = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    STEP(a >= 0);
    struct sockaddr_storage od;
    socklen_t len = sizeof od;
    char ip[INET6_ADDRSTRLEN];
    if (family == AF_INET) {
        STEP(getsockopt(a, SOL_IP, SO_ORIGINAL_DST, &od, &len) == 0);
        struct sockaddr_in *s = (struct sockaddr_in *)&od;
        inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
        snprintf(r->orig4, sizeof r->orig4, "%s:%d", ip, ntohs(s->sin_port));
        char buf[8] = {0};
        STEP(write(a, "hi", 2) == 2 && wait_in(c, 1000) && read(c, buf, sizeof buf) == 2);
        r->data4 = strcmp(buf, "hi") == 0;
    } else {
        STEP(getsockopt(a, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &od, &len) == 0);
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&od;
        inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
        snprintf(r->orig6, sizeof r->orig6, "[%s]:%d", ip, ntohs(s->sin6_port));
    }
    close(a);
    close(c);
}

static void e2e_dns(struct e2e *r, int family, const char *dst, int responder, int *ok)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    char buf[16] = {0};
    int c = sock_at(family, SOCK_DGRAM, dst, 53, 1);
    STEP(c >= 0);
    STEP(send(c, "query", 5, 0) == 5);
    STEP(wait_in(responder, 1000));
    STEP(recvfrom(responder, buf, sizeof buf, 0, (struct sockaddr *)&peer, &plen) == 5);
    STEP(sendto(responder, "reply", 5, 0, (struct sockaddr *)&peer, plen) == 5);
    /* The connected client only accepts it if the source was translated back to dst:53. */
    STEP(wait_in(c, 1000) && recv(c, buf, sizeof buf, 0) == 5);
    *ok = memcmp(buf, "reply", 5) == 0;
    close(c);
}

static void e2e_udp_rejected(struct e2e *r, int i, const char *dst)
{
    struct timespec t0;
    char b[4];
    int c = sock_at(i ? AF_INET6 : AF_INET, SOCK_DGRAM, dst, 9999, 1);
    STEP(c >= 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r->udp_send_errno[i] = send(c, "x", 1, 0) < 0 ? errno : 0;
    r->udp_send_ms[i] = ms_since(&t0);
    r->udp_recv_errno[i] = !wait_in(c, 250) ? ETIMEDOUT : recv(c, b, sizeof b, 0) < 0 ? errno : 0;
    close(c);
}

static uint16_t icmp_sum(const void *p, size_t n)
{
    const uint16_t *w = p;
    uint32_t s = 0;
    for (; n > 1; n -= 2)
        s += *w++;
    if (n) s += *(const uint8_t *)w;
    s = (s >> 16) + (s & 0xffff);
    return (uint16_t) ~(s + (s >> 16));
}

/* An echo request on a raw ICMP (i = 0) or ICMPv6 (i = 1, the kernel sums it) socket. */
static int echo(int fd, int i, const char *dst)
{
    struct sockaddr_storage ss;
    socklen_t len = (socklen_t)sa(i ? AF_INET6 : AF_INET, dst, 0, &ss);
    struct icmphdr h = {.type = i ? ICMP6_ECHO_REQUEST : ICMP_ECHO, .code = 0};
    h.un.echo.id = htons((uint16_t)getpid());
    h.un.echo.sequence = htons(1);
    if (!i) h.checksum = icmp_sum(&h, sizeof h);
    return sendto(fd, &h, sizeof h, 0, (struct sockaddr *)&ss, len) < 0 ? errno : 0;
}

/* The code of the next ICMP message of `type` on the raw socket within ms, or -1. An IPv4
 * raw socket sees the IP header, an IPv6 one does not. */
static int icmp_next(int fd, int i, int type, int ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[1500];
    while (ms_since(&t0) < ms && wait_in(fd, ms)) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        size_t hl = !i && n >= (ssize_t)sizeof(struct iphdr) ? (size_t)(buf[0] & 0xf) * 4 : 0;
        if (n < 0 || (size_t)n < hl + 2) continue;
        if ((uint8_t)buf[hl] == type) return (uint8_t)buf[hl + 1];
    }
    return -1;
}

static void e2e_icmp(struct e2e *r, int i, const char *lo, const char *dst)
{
    struct timespec t0;
    int fd =
        socket(i ? AF_INET6 : AF_INET, SOCK_RAW | SOCK_CLOEXEC, i ? IPPROTO_ICMPV6 : IPPROTO_ICMP);
    STEP(fd >= 0);
    STEP(echo(fd, i, lo) == 0);
    r->echo_lo[i] = icmp_next(fd, i, i ? ICMP6_ECHO_REPLY : ICMP_ECHOREPLY, 1000) == 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r->echo_errno[i] = echo(fd, i, dst);
    r->echo_ms[i] = ms_since(&t0);
    r->echo_unreach[i] = icmp_next(fd, i, i ? ICMP6_DST_UNREACH : ICMP_DEST_UNREACH, 250);
    close(fd);
}

static void e2e_child(int netns, struct e2e *r)
{
    STEP(setns(netns, CLONE_NEWNET) == 0);
    int l4 = sock_at(AF_INET, SOCK_STREAM, "127.0.0.1", ACCEPTOR_PORT, 0);
    int l6 = sock_at(AF_INET6, SOCK_STREAM, "::1", ACCEPTOR_PORT, 0);
    int d4 = sock_at(AF_INET, SOCK_DGRAM, "127.0.0.1", DNS_PORT, 0);
    int d6 = sock_at(AF_INET6, SOCK_DGRAM, "::1", DNS_PORT, 0);
    STEP(l4 >= 0 && l6 >= 0 && d4 >= 0 && d6 >= 0);
    e2e_tcp(r, AF_INET, "203.0.113.7", l4);
    e2e_tcp(r, AF_INET6, "2001:db8::7", l6);
    e2e_dns(r, AF_INET, "198.51.100.53", d4, &r->dns4);
    e2e_dns(r, AF_INET6, "2001:db8::53", d6, &r->dns6);
    e2e_udp_rejected(r, 0, "203.0.113.7");
    e2e_udp_rejected(r, 1, "2001:db8::7");
    e2e_icmp(r, 0, "127.0.0.1", "203.0.113.7");
    e2e_icmp(r, 1, "::1", "2001:db8::7");
}

static struct e2e *run_e2e(int netns)
{
    struct e2e *r =
        mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    memset(r, 0, sizeof *r);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        e2e_child(netns, r);
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st)) r->line = -1;
    return r;
}

static void test_end_to_end(void)
{
    CHECK(corral_rtnl_lo_default_routes(ns_fd) == 0);
    CHECK(corral_nft_apply(ns_fd, &plan) == 0);
    CHECK(corral_nft_verify(ns_fd, &plan) == 0);

    struct e2e *r = run_e2e(ns_fd);
    CHECK(r != NULL);
    if (!r) return;
    if (r->line) fprintf(stderr, "end-to-end step failed at line %d\n", r->line);
    CHECK(r->line == 0);
    CHECK(strcmp(r->orig4, "203.0.113.7:80") == 0);
    CHECK(r->data4 == 1);
    CHECK(strcmp(r->orig6, "[2001:db8::7]:80") == 0);
    CHECK(r->dns4 == 1 && r->dns6 == 1);

    /*
     * Everything else fails at once. The send itself fails with EPERM (measured: the same
     * as a bare drop would give a local sender). Over IPv6 the reject also shows: its ICMPv6
     * admin-prohibited comes straight back (EACCES on the UDP socket, type 1 code 1 on the
     * raw one). Over IPv4 it cannot: icmp_send takes the original destination as the
     * source when the route is through lo, and the route lookup refuses 203.0.113.7 as a
     * source, so no ICMP leaves (IcmpOutMsgs stays 0). The echoes to loopback are the
     * control.
     */
    for (int i = 0; i < 2; i++)
        NOTE("ipv%d: udp send %s after %ld ms, then %s; echo send %s after %ld ms, "
             "unreach code %d\n",
             i ? 6 : 4, strerror(r->udp_send_errno[i]), r->udp_send_ms[i],
             strerror(r->udp_recv_errno[i]), strerror(r->echo_errno[i]), r->echo_ms[i],
             r->echo_unreach[i]);
    for (int i = 0; i < 2; i++) {
        CHECK(r->udp_send_errno[i] == EPERM);
        CHECK(r->udp_send_ms[i] < 1000);
        CHECK(r->echo_lo[i] == 1);
        CHECK(r->echo_errno[i] == EPERM);
        CHECK(r->echo_ms[i] < 1000);
    }
    CHECK(r->udp_recv_errno[1] == EACCES);
    CHECK(r->echo_unreach[1] == ICMP6_DST_UNREACH_ADMIN);
    munmap(r, sizeof *r);

    CHECK(corral_nft_delete(ns_fd, "corral") == 0);
}

int main(void)
{
    int fds = count_fds();
    ns_fd = corral_ns_new_net();
    CHECK(ns_fd >= 0);
    if (ns_fd < 0) return DONE();
    test_apply_verify_tamper_delete();
    test_port_ranges_and_replace();
    test_bad_batch_creates_nothing();
    test_bad_plans();
    test_end_to_end();
    close(ns_fd);
    CHECK(count_fds() == fds);
    return DONE();
}
