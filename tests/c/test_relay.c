/*
 * The relay loop against real TCP sockets: 16 MiB each way byte-exact (hashed), half-close,
 * reset propagation, idle timeout, connect success / refusal / timeout (the client
 * reset), per-key caps, back-pressure, 1,000 concurrent relayed connections, the loop fd
 * in another poll loop, a mark that cannot be set, and no fd left behind.
 *
 * The whole test runs in a netns of its own (unshare at start; lo up with default
 * routes via lo), so its ports meet nobody else's and 203.0.113.9 is an address whose
 * SYNs go into lo and are dropped (no forwarding): an unanswered connect that never
 * leaves this netns.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/capability.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "check.h"
#include "netpair.h"
#include "ns.h"
#include "listen.h"
#include "relay.h"
#include "rtnl.h"
#include "sock.h"

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- events: everything run returns goes into one log ---- */

#define LOG_MAX 8192
static struct corral_relay_event event_log[LOG_MAX];
static size_t logged;

static int run(struct corral_relay *r, int ms)
{
    struct corral_relay_event ev[64];
    int n = corral_relay_run(r, ms, ev, 64);
    for (int i = 0; i < n && logged < LOG_MAX; i++)
        event_log[logged++] = ev[i];
    return n;
}

static const struct corral_relay_event *find_event(uint64_t id, int kind)
{
    for (size_t i = 0; i < logged; i++)
        if (event_log[i].id == id && event_log[i].kind == kind) return &event_log[i];
    return NULL;
}

/* Runs the loop until the event shows up or ms pass. */
static const struct corral_relay_event *wait_event(struct corral_relay *r, uint64_t id, int kind,
                                                   int ms)
{
    long end = now_ms() + ms;
    const struct corral_relay_event *e;
    while (!(e = find_event(id, kind)) && now_ms() < end)
        run(r, 10);
    return e;
}

/* ---- sockets ---- */

static struct sockaddr_storage lo_addr(int port, socklen_t *len)
{
    struct sockaddr_storage ss;
    corral_sockaddr_from("127.0.0.1", port, &ss, len);
    return ss;
}

/* client c <-> a [relay] b <-> s server */
struct path {
    int c, s;
    uint64_t id;
    int add_err;
};

static struct path relayed(struct corral_relay *r, const struct corral_relay_opts *o)
{
    struct path p = {-1, -1, 0, 0};
    int a = -1, b = -1;
    if (tcp_pair(&p.c, &a) < 0 || tcp_pair(&b, &p.s) < 0) p.add_err = -EIO;
    if (!p.add_err) p.add_err = corral_relay_add_pair(r, a, b, o, &p.id);
    return p;
}

static void close_path(struct path *p)
{
    if (p->c >= 0) close(p->c);
    if (p->s >= 0) close(p->s);
    p->c = p->s = -1;
}

/* Reads from fd while the loop runs, until n bytes, EOF or an error; returns the byte
 * count, or -errno if the read failed before anything came. */
static ssize_t read_relayed(struct corral_relay *r, int fd, char *buf, size_t cap, int eof, int ms)
{
    size_t got = 0;
    long end = now_ms() + ms;
    while (now_ms() < end) {
        run(r, 5);
        struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, 0) != 1) continue;
        ssize_t n = recv(fd, buf + got, cap - got, MSG_DONTWAIT);
        if (n < 0 && errno == EAGAIN) continue;
        if (n < 0) return got ? (ssize_t)got : -errno;
        if (n == 0) return (ssize_t)got;
        got += (size_t)n;
        if (!eof && got == cap) return (ssize_t)got;
    }
    return (ssize_t)got;
}

/* ---- 16 MiB each way ---- */

#define BIG (16u << 20)

struct stream {
    int fd;
    uint64_t seed;
    size_t n;
    uint64_t hash; /* FNV-1a 64 of the bytes written or read */
    size_t done;
    int exact; /* reader: every byte equals the writer's stream */
};

static uint8_t next_byte(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint8_t)(*s >> 24);
}

static void *writer(void *arg)
{
    struct stream *st = arg;
    uint64_t s = st->seed, h = 1469598103934665603ull;
    static __thread uint8_t buf[65536];
    while (st->done < st->n) {
        size_t k = st->n - st->done < sizeof buf ? st->n - st->done : sizeof buf;
        for (size_t i = 0; i < k; i++) {
            buf[i] = next_byte(&s);
            h = (h ^ buf[i]) * 1099511628211ull;
        }
        size_t off = 0;
        while (off < k) {
            ssize_t w = write(st->fd, buf + off, k - off);
            if (w <= 0) return NULL;
            off += (size_t)w;
        }
        st->done += k;
    }
    st->hash = h;
    shutdown(st->fd, SHUT_WR);
    return NULL;
}

static void *reader(void *arg)
{
    struct stream *st = arg;
    uint64_t s = st->seed, h = 1469598103934665603ull;
    static __thread uint8_t buf[65536];
    st->exact = 1;
    for (;;) {
        ssize_t n = read(st->fd, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != next_byte(&s)) st->exact = 0;
            h = (h ^ buf[i]) * 1099511628211ull;
        }
        st->done += (size_t)n;
    }
    st->hash = h;
    return NULL;
}

static void test_bytes_both_ways(struct corral_relay *r)
{
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    struct stream up_w = {p.c, 0x1234567, BIG, 0, 0, 0}, up_r = {p.s, 0x1234567, 0, 0, 0, 0};
    struct stream dn_w = {p.s, 0x7654321, BIG, 0, 0, 0}, dn_r = {p.c, 0x7654321, 0, 0, 0, 0};
    pthread_t t[4];
    pthread_create(&t[0], NULL, writer, &up_w);
    pthread_create(&t[1], NULL, reader, &up_r);
    pthread_create(&t[2], NULL, writer, &dn_w);
    pthread_create(&t[3], NULL, reader, &dn_r);
    const struct corral_relay_event *e = wait_event(r, p.id, CORRAL_RELAY_CLOSED, 20000);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(e && e->err == 0);
    CHECK(e && e->bytes_a_to_b == BIG && e->bytes_b_to_a == BIG);
    CHECK(up_r.done == BIG && up_r.hash == up_w.hash && up_r.exact);
    CHECK(dn_r.done == BIG && dn_r.hash == dn_w.hash && dn_r.exact);
    CHECK(up_w.hash != dn_w.hash);
    close_path(&p);
}

static void test_half_close(struct corral_relay *r)
{
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    char buf[64] = {0};
    /* The client sends its request and shuts down writing… */
    CHECK(write(p.c, "request", 7) == 7);
    CHECK(shutdown(p.c, SHUT_WR) == 0);
    /* …the server reads it to EOF… */
    CHECK(read_relayed(r, p.s, buf, sizeof buf, 1, 2000) == 7 && memcmp(buf, "request", 7) == 0);
    /* …and its reply still reaches the client, followed by the end of stream. */
    CHECK(write(p.s, "reply", 5) == 5);
    CHECK(corral_relay_count(r, NULL) == 1);
    close(p.s);
    p.s = -1;
    memset(buf, 0, sizeof buf);
    CHECK(read_relayed(r, p.c, buf, sizeof buf, 1, 2000) == 5 && memcmp(buf, "reply", 5) == 0);
    const struct corral_relay_event *e = wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->err == 0 && e->bytes_a_to_b == 7 && e->bytes_b_to_a == 5);
    close_path(&p);
}

static void test_reset_propagates(struct corral_relay *r)
{
    char buf[8];
    /* Control: an orderly close on one side is an orderly end on the other. */
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    close(p.s);
    p.s = -1;
    CHECK(read_relayed(r, p.c, buf, sizeof buf, 1, 2000) == 0);
    close_path(&p);
    CHECK(wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000) != NULL);

    /* The server resets: the client sees a reset, not an end of stream. */
    p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    CHECK(write(p.c, "x", 1) == 1 && read_relayed(r, p.s, buf, 1, 0, 2000) == 1);
    corral_reset(p.s);
    p.s = -1;
    CHECK(read_relayed(r, p.c, buf, sizeof buf, 1, 2000) == -ECONNRESET);
    const struct corral_relay_event *e = wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->err == ECONNRESET && e->bytes_a_to_b == 1);
    close_path(&p);

    /* And the other way round. */
    p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    corral_reset(p.c);
    p.c = -1;
    CHECK(read_relayed(r, p.s, buf, sizeof buf, 1, 2000) == -ECONNRESET);
    e = wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->err == ECONNRESET);
    close_path(&p);
}

/* A server that closes its side, then resets, while the client still sends (iperf3's end
 * of a test): the relay's splice into the reset socket fails with EPIPE, and splice, which
 * takes no MSG_NOSIGNAL, raises SIGPIPE, whose default action ended the whole host. The
 * connection must end as any reset does, and the relay carry on (the control). */
static void test_epipe_survived(struct corral_relay *r)
{
    char buf[8];
    int ended = 0;
    for (int round = 0; round < 20; round++) {
        struct path p = relayed(r, NULL);
        CHECK(p.add_err == 0);
        CHECK(shutdown(p.s, SHUT_WR) == 0);
        CHECK(read_relayed(r, p.c, buf, sizeof buf, 1, 2000) == 0); /* the server's end, relayed */
        CHECK(write(p.c, "x", 1) == 1); /* waits, unrelayed, while the server resets */
        corral_reset(p.s);
        p.s = -1;
        ended += wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000) != NULL;
        close_path(&p);
    }
    CHECK(ended == 20);
    struct path ok = relayed(r, NULL);
    CHECK(ok.add_err == 0);
    CHECK(write(ok.c, "y", 1) == 1 && read_relayed(r, ok.s, buf, 1, 0, 2000) == 1 && buf[0] == 'y');
    close_path(&ok);
    CHECK(wait_event(r, ok.id, CORRAL_RELAY_CLOSED, 2000) != NULL);
}

static void test_idle_timeout(struct corral_relay *r)
{
    struct corral_relay_opts o = {.idle_ms = 250, .key = NULL, .max_per_key = 0};
    long t0 = now_ms();
    struct path quiet = relayed(r, &o);
    struct path busy = relayed(r, &o);
    CHECK(quiet.add_err == 0 && busy.add_err == 0);
    char buf[4];
    /* busy moves a byte every 50 ms for 450 ms: almost two idle periods. */
    for (int i = 0; i < 9; i++) {
        long next = now_ms() + 50;
        CHECK(write(busy.c, "b", 1) == 1);
        CHECK(read_relayed(r, busy.s, buf, 1, 0, 1000) == 1);
        while (now_ms() < next)
            run(r, 5);
    }
    const struct corral_relay_event *e = find_event(quiet.id, CORRAL_RELAY_CLOSED);
    CHECK(e && e->err == ETIMEDOUT);
    CHECK(find_event(busy.id, CORRAL_RELAY_CLOSED) == NULL); /* control: still relaying */
    CHECK(write(busy.c, "c", 1) == 1 && read_relayed(r, busy.s, buf, 1, 0, 1000) == 1);
    /* The quiet client was reset: an idle cut never looks like a complete stream. */
    CHECK(recv(quiet.c, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno == ECONNRESET);
    /* Now busy goes quiet too, and goes the same way, about 250 ms later. */
    long t1 = now_ms();
    e = wait_event(r, busy.id, CORRAL_RELAY_CLOSED, 2000);
    long waited = now_ms() - t1;
    CHECK(e && e->err == ETIMEDOUT && e->bytes_a_to_b == 10);
    CHECK(waited >= 200 && waited < 1500);
    CHECK(now_ms() - t0 >= 450);
    close_path(&quiet);
    close_path(&busy);
}

static void test_connect(struct corral_relay *r)
{
    char buf[16] = {0};
    int port = 0;
    int up = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(up >= 0);
    socklen_t len;
    struct sockaddr_storage ss = lo_addr(port, &len);

    /* Connected, with a mark; the client's first bytes wait in the pipe meanwhile. */
    int c, a;
    uint64_t id = 0;
    CHECK(tcp_pair(&c, &a) == 0);
    CHECK(write(c, "early", 5) == 5);
    CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 42, 1000, NULL, &id) == 0);
    CHECK(wait_event(r, id, CORRAL_RELAY_CONNECTED, 2000) != NULL);
    int s = corral_tcp_accept(up, 1000);
    CHECK(s >= 0);
    CHECK(read_relayed(r, s, buf, 5, 0, 2000) == 5 && memcmp(buf, "early", 5) == 0);
    CHECK(write(s, "late", 4) == 4);
    CHECK(read_relayed(r, c, buf, 4, 0, 2000) == 4 && memcmp(buf, "late", 4) == 0);
    close(c);
    close(s);
    const struct corral_relay_event *e = wait_event(r, id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->err == 0 && e->bytes_a_to_b == 5 && e->bytes_b_to_a == 4);

    /* Refused: FAILED, and the client is reset. */
    int hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage dead = lo_addr(0, &len);
    CHECK(bind(hold, (struct sockaddr *)&dead, len) == 0);
    len = sizeof dead;
    getsockname(hold, (struct sockaddr *)&dead, &len);
    CHECK(tcp_pair(&c, &a) == 0);
    CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&dead, len, 0, 1000, NULL, &id) == 0);
    e = wait_event(r, id, CORRAL_RELAY_FAILED, 2000);
    CHECK(e && e->err == ECONNREFUSED);
    CHECK(read_relayed(r, c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    close(c);
    close(hold);

    /* Unanswered: the connect timeout ends it, FAILED with ETIMEDOUT, client reset. */
    struct sockaddr_storage void_ss;
    corral_sockaddr_from("203.0.113.9", 80, &void_ss, &len);
    CHECK(tcp_pair(&c, &a) == 0);
    long t0 = now_ms();
    CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&void_ss, len, 0, 200, NULL, &id) == 0);
    e = wait_event(r, id, CORRAL_RELAY_FAILED, 3000);
    long took = now_ms() - t0;
    CHECK(e && e->err == ETIMEDOUT);
    CHECK(took >= 190 && took < 1500);
    CHECK(find_event(id, CORRAL_RELAY_CONNECTED) == NULL);
    CHECK(read_relayed(r, c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    close(c);

    /* An upstream started in another netns (the sandbox's own link case). */
    int ns = corral_ns_new_net();
    CHECK(ns >= 0 && corral_rtnl_lo_default_routes(ns) == 0);
    int nport = 0;
    int nl = corral_listen_in_netns(ns, SOCK_STREAM, "127.0.0.1", 0, &nport);
    CHECK(nl >= 0);
    ss = lo_addr(nport, &len);
    int inprog = 0;
    int upfd =
        corral_connect_marked_start((struct sockaddr *)&ss, len, 42, ns, NULL, &inprog, NULL);
    CHECK(upfd >= 0);
    CHECK(tcp_pair(&c, &a) == 0);
    CHECK(corral_relay_add_connecting(r, a, upfd, 1000, NULL, &id) == 0);
    CHECK(wait_event(r, id, CORRAL_RELAY_CONNECTED, 2000) != NULL);
    s = corral_tcp_accept(nl, 1000);
    CHECK(s >= 0 && write(c, "ns", 2) == 2);
    CHECK(read_relayed(r, s, buf, 2, 0, 2000) == 2 && memcmp(buf, "ns", 2) == 0);
    close(c);
    close(s);
    CHECK(wait_event(r, id, CORRAL_RELAY_CLOSED, 2000) != NULL);
    close(nl);
    close(ns);
    close(up);
}

/* A proxy preface (--upstream-proxy): the CONNECT request goes first, the client's bytes
 * wait until the proxy's 2xx; a 407 fails the connect (EACCES) and resets the client.
 * The refusal first, then the control, whose tunnel's first bytes arrive in the same
 * segment as the answer's head. */
static void test_proxy_preface(struct corral_relay *r)
{
    static const char PREFACE[] = "CONNECT 192.0.2.1:443 HTTP/1.1\r\nHost: 192.0.2.1:443\r\n\r\n";
    char buf[128] = {0};
    int port = 0;
    int up = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(up >= 0);
    socklen_t len;
    struct sockaddr_storage ss = lo_addr(port, &len);
    struct corral_relay_opts o = {.preface = PREFACE};
    size_t n = strlen(PREFACE);
    for (int attempt = 0; attempt < 2; attempt++) {
        int c = -1, a = -1;
        uint64_t id = 0;
        CHECK(tcp_pair(&c, &a) == 0);
        CHECK(write(c, "early", 5) == 5);
        CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 0, 2000, &o, &id) == 0);
        int s = corral_tcp_accept(up, 1000);
        CHECK(s >= 0);
        CHECK(read_relayed(r, s, buf, n, 0, 2000) == (ssize_t)n && memcmp(buf, PREFACE, n) == 0);
        CHECK(find_event(id, CORRAL_RELAY_CONNECTED) == NULL);
        if (attempt == 0) {
            const char *no = "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n";
            CHECK(write(s, no, strlen(no)) == (ssize_t)strlen(no));
            const struct corral_relay_event *e = wait_event(r, id, CORRAL_RELAY_FAILED, 2000);
            CHECK(e && e->err == EACCES);
            CHECK(read_relayed(r, c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
        } else {
            const char *yes = "HTTP/1.1 200 Connection established\r\n\r\nbanner";
            CHECK(write(s, yes, strlen(yes)) == (ssize_t)strlen(yes));
            CHECK(wait_event(r, id, CORRAL_RELAY_CONNECTED, 2000) != NULL);
            CHECK(read_relayed(r, c, buf, 6, 0, 2000) == 6 && memcmp(buf, "banner", 6) == 0);
            CHECK(read_relayed(r, s, buf, 5, 0, 2000) == 5 && memcmp(buf, "early", 5) == 0);
            close(c);
            close(s);
            const struct corral_relay_event *e = wait_event(r, id, CORRAL_RELAY_CLOSED, 2000);
            CHECK(e && e->bytes_a_to_b == 5 && e->bytes_b_to_a == 6);
            break;
        }
        close(c);
        close(s);
    }
    close(up);
}

/* Racing addresses (RFC 8305): each failure of the attempt in flight starts the next at
 * once, an unanswered one gives the next its turn after the delay, the first to connect
 * wins. Every attempt comes first, its control (the same race reaching a listener) after. */
static void test_race(struct corral_relay *r)
{
    char buf[8] = {0};
    int port = 0;
    int up = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(up >= 0);
    socklen_t len;
    int hold[2];
    struct sockaddr_storage addrs[3];
    for (int i = 0; i < 2; i++) { /* bound, never listening: refused */
        hold[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        addrs[i] = lo_addr(0, &len);
        CHECK(bind(hold[i], (struct sockaddr *)&addrs[i], len) == 0);
        len = sizeof addrs[i];
        getsockname(hold[i], (struct sockaddr *)&addrs[i], &len);
    }
    struct corral_relay_race how = {.addrs = addrs,
                                    .n = 2,
                                    .netns_fd = -1,
                                    .connect_timeout_ms = 2000,
                                    .attempt_delay_ms = 1000};
    int c, a;
    uint64_t id = 0;

    /* Every address refuses: FAILED with the last error, at once, the client reset. */
    CHECK(tcp_pair(&c, &a) == 0);
    long t0 = now_ms();
    CHECK(corral_relay_add_race(r, a, &how, NULL, &id) == 0);
    const struct corral_relay_event *e = wait_event(r, id, CORRAL_RELAY_FAILED, 3000);
    CHECK(e && e->err == ECONNREFUSED && now_ms() - t0 < 900);
    CHECK(read_relayed(r, c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    close(c);

    /* Only unanswered addresses: the race's connect timeout ends it. */
    corral_sockaddr_from("203.0.113.9", 80, &addrs[0], &len);
    corral_sockaddr_from("203.0.113.9", 81, &addrs[1], &len);
    how.connect_timeout_ms = 300;
    how.attempt_delay_ms = 100;
    CHECK(tcp_pair(&c, &a) == 0);
    t0 = now_ms();
    CHECK(corral_relay_add_race(r, a, &how, NULL, &id) == 0);
    e = wait_event(r, id, CORRAL_RELAY_FAILED, 3000);
    CHECK(e && e->err == ETIMEDOUT && now_ms() - t0 >= 290 && now_ms() - t0 < 1500);
    close(c);

    /* Controls: a refused first address hands over at once, an unanswered one after its
     * head start; the listener behind it is relayed, and named by addr_index. */
    struct sockaddr_storage hold0 = addrs[0];
    len = sizeof hold0;
    getsockname(hold[0], (struct sockaddr *)&hold0, &len);
    struct sockaddr_storage open_ss = lo_addr(port, &len);
    const struct sockaddr_storage firsts[2] = {hold0, addrs[0]}; /* refused, unanswered */
    const long least[2] = {0, 90}, most[2] = {500, 900};
    for (int k = 0; k < 2; k++) {
        addrs[0] = firsts[k];
        addrs[1] = open_ss;
        how.connect_timeout_ms = 2000;
        how.attempt_delay_ms = k ? 100 : 1000;
        CHECK(tcp_pair(&c, &a) == 0);
        t0 = now_ms();
        CHECK(corral_relay_add_race(r, a, &how, NULL, &id) == 0);
        e = wait_event(r, id, CORRAL_RELAY_CONNECTED, 3000);
        long took = now_ms() - t0;
        CHECK(e && e->addr_index == 1 && took >= least[k] && took < most[k]);
        int s = corral_tcp_accept(up, 1000);
        CHECK(s >= 0 && write(c, "he", 2) == 2);
        CHECK(read_relayed(r, s, buf, 2, 0, 2000) == 2 && memcmp(buf, "he", 2) == 0);
        close(c);
        close(s);
        CHECK(wait_event(r, id, CORRAL_RELAY_CLOSED, 2000) != NULL);
    }
    how.n = 0; /* and a race of nothing is an argument error, the client reset */
    CHECK(tcp_pair(&c, &a) == 0);
    CHECK(corral_relay_add_race(r, a, &how, NULL, &id) == -EINVAL);
    CHECK(read_relayed(r, c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    close(c);
    close(hold[0]);
    close(hold[1]);
    close(up);
}

/* Out of fds while racing: the address that could not be tried for want of an fd makes
 * the failure EMFILE, not the timeout (or refusal) of the address that was tried. The
 * control, with room for both: the same race ends on the connect timeout. */
static void test_race_out_of_fds(struct corral_relay *r)
{
    socklen_t len;
    struct sockaddr_storage addrs[2];
    corral_sockaddr_from("203.0.113.9", 80, &addrs[0], &len); /* unanswered */
    corral_sockaddr_from("203.0.113.9", 81, &addrs[1], &len);
    struct corral_relay_race how = {
        .addrs = addrs, .n = 2, .netns_fd = -1, .connect_timeout_ms = 300, .attempt_delay_ms = 50};
    struct rlimit saved;
    CHECK(getrlimit(RLIMIT_NOFILE, &saved) == 0);
    for (int room = 0; room < 2; room++) {
        int c = -1, a = -1;
        uint64_t id = 0;
        CHECK(tcp_pair(&c, &a) == 0);
        /* every fd number below the limit taken, but one (two for the control) */
        struct rlimit low = {(rlim_t)count_fds() + 8, saved.rlim_max};
        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        int fill[64], n = 0;
        while (n < 64 && (fill[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
            n++;
        CHECK(n < 64 && errno == EMFILE && n >= 2);
        close(fill[--n]);
        if (room) close(fill[--n]);
        CHECK(corral_relay_add_race(r, a, &how, NULL, &id) == 0);
        const struct corral_relay_event *e = wait_event(r, id, CORRAL_RELAY_FAILED, 3000);
        CHECK(e && e->err == (room ? ETIMEDOUT : EMFILE));
        while (n > 0)
            close(fill[--n]);
        CHECK(setrlimit(RLIMIT_NOFILE, &saved) == 0);
        close(c);
    }
}

/* Source port of the relay's upstream end for one add_connect under opts. */
static int upstream_port(struct corral_relay *r, int up, const struct sockaddr_storage *ss,
                         socklen_t len, const struct corral_relay_opts *o)
{
    int c, a, port = -1;
    uint64_t id = 0;
    if (tcp_pair(&c, &a) < 0) return -1;
    if (corral_relay_add_connect(r, a, (const struct sockaddr *)ss, len, 0, 1000, o, &id) == 0 &&
        wait_event(r, id, CORRAL_RELAY_CONNECTED, 2000)) {
        int s = corral_tcp_accept(up, 1000);
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        if (s >= 0 && getpeername(s, (struct sockaddr *)&peer, &pl) == 0)
            port = ntohs(peer.sin_port);
        if (s >= 0) close(s);
    }
    close(c);
    wait_event(r, id, CORRAL_RELAY_CLOSED, 2000);
    return port;
}

/* A keyed connection's source port stays in the key's slice of the local port range.
 * The control is a second key whose slice does not overlap: its connections land in
 * their own slice, so the first's result is the option at work, not where the kernel
 * happened to start (consecutive connects take neighbouring ports: an unkeyed control
 * once stayed inside the slice by itself). */
static void test_port_slice(struct corral_relay *r)
{
    int port = 0;
    int up = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(up >= 0);
    socklen_t len;
    struct sockaddr_storage ss = lo_addr(port, &len);
    unsigned lo, hi, olo = 0, ohi = 0;
    corral_port_slice("slice-test", &lo, &hi);
    CHECK(hi > lo && hi - lo + 1 <= 4096);
    char other[32] = "";
    for (int i = 0; i < 100; i++) {
        snprintf(other, sizeof other, "slice-other-%d", i);
        corral_port_slice(other, &olo, &ohi);
        if (ohi < lo || olo > hi) break; /* disjoint */
    }
    CHECK(ohi < lo || olo > hi);
    struct corral_relay_opts keyed = {.key = "slice-test"}, keyed_other = {.key = other};
    int inside = 0, inside_other = 0;
    for (int i = 0; i < 10; i++) {
        int p = upstream_port(r, up, &ss, len, &keyed);
        if (p >= (int)lo && p <= (int)hi) inside++;
        int q = upstream_port(r, up, &ss, len, &keyed_other);
        if (q >= (int)olo && q <= (int)ohi) inside_other++;
    }
    CHECK(inside == 10);
    CHECK(inside_other == 10);
    close(up);
}

/* An operator's cut: one connection reset on both sides, its event says so with its
 * bytes; another connection on the same relay keeps relaying (the control). */
static void test_reset_one(struct corral_relay *r)
{
    struct path p1 = relayed(r, NULL), p2 = relayed(r, NULL);
    CHECK(p1.add_err == 0 && p2.add_err == 0);
    char buf[16] = {0};
    CHECK(write(p1.c, "abc", 3) == 3);
    CHECK(read_relayed(r, p1.s, buf, 3, 0, 2000) == 3);
    CHECK(corral_relay_reset(r, p1.id) == 0);
    const struct corral_relay_event *e = wait_event(r, p1.id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->err == ECONNABORTED && e->bytes_a_to_b == 3);
    CHECK(read_relayed(r, p1.c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    CHECK(read_relayed(r, p1.s, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    CHECK(corral_relay_reset(r, p1.id) == -ENOENT);
    CHECK(write(p2.c, "xyz", 3) == 3);
    CHECK(read_relayed(r, p2.s, buf, 3, 0, 2000) == 3 && memcmp(buf, "xyz", 3) == 0);
    close_path(&p1);
    close_path(&p2);
    CHECK(wait_event(r, p2.id, CORRAL_RELAY_CLOSED, 2000) != NULL);
}

/* Nothing arrives on fd within ms while the loop runs (the loop's own turns included). */
static int silent(struct corral_relay *r, int fd, int ms)
{
    char b[64];
    return read_relayed(r, fd, b, sizeof b, 0, ms) == 0;
}

/* hold_a: the server's bytes reach the client, the client's wait unread until released;
 * HELD is reported for each arrival after a peek; a held connection cut moves nothing. */
static void test_hold(struct corral_relay *r)
{
    struct corral_relay_opts held = {.hold_a = 1};
    struct path p = relayed(r, &held), cut = relayed(r, &held);
    CHECK(p.add_err == 0 && cut.add_err == 0);
    char buf[64] = {0};
    int ended = -1;
    CHECK(corral_relay_peek(r, p.id, buf, sizeof buf, &ended) == -EAGAIN && ended == 0);
    CHECK(write(p.s, "banner\n", 7) == 7); /* upstream to client flows while held */
    CHECK(read_relayed(r, p.c, buf, 7, 0, 2000) == 7 && memcmp(buf, "banner\n", 7) == 0);
    CHECK(write(p.c, "abc", 3) == 3);
    CHECK(wait_event(r, p.id, CORRAL_RELAY_HELD, 2000) != NULL);
    CHECK(silent(r, p.s, 200)); /* the attempt: held bytes never reach the server */
    CHECK(corral_relay_peek(r, p.id, buf, sizeof buf, &ended) == 3 && memcmp(buf, "abc", 3) == 0);
    CHECK(ended == 0);
    logged = 0; /* a second arrival after the peek is reported again */
    CHECK(write(p.c, "de", 2) == 2);
    CHECK(wait_event(r, p.id, CORRAL_RELAY_HELD, 2000) != NULL);
    CHECK(corral_relay_peek(r, p.id, buf, sizeof buf, NULL) == 5 && memcmp(buf, "abcde", 5) == 0);
    CHECK(corral_relay_release(r, p.id) == 0);
    CHECK(read_relayed(r, p.s, buf, 5, 0, 2000) == 5 && memcmp(buf, "abcde", 5) == 0); /* control */
    CHECK(corral_relay_peek(r, p.id, buf, sizeof buf, NULL) == -EINVAL); /* no longer held */
    CHECK(write(p.c, "f", 1) == 1 && read_relayed(r, p.s, buf, 1, 0, 2000) == 1);

    CHECK(write(cut.c, "evil", 4) == 4);
    CHECK(wait_event(r, cut.id, CORRAL_RELAY_HELD, 2000) != NULL);
    shutdown(cut.c, SHUT_WR);
    run(r, 50);
    CHECK(corral_relay_peek(r, cut.id, buf, sizeof buf, &ended) == 4 && ended == 1);
    CHECK(corral_relay_reset(r, cut.id) == 0);
    const struct corral_relay_event *e = wait_event(r, cut.id, CORRAL_RELAY_CLOSED, 2000);
    CHECK(e && e->bytes_a_to_b == 0);
    CHECK(read_relayed(r, cut.s, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    CHECK(corral_relay_peek(r, cut.id, buf, sizeof buf, NULL) == -ENOENT);
    CHECK(corral_relay_release(r, cut.id) == -ENOENT);
    close_path(&p);
    close_path(&cut);
    CHECK(wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000) != NULL);
}

/* No idle limit (idle_ms 0, the default) arms no timer at all, however long the
 * connection lives; a limit arms it for that long (the control). */
static void test_no_idle_no_timer(void)
{
    struct corral_relay *r = NULL;
    CHECK(corral_relay_new(&r) == 0);
    int64_t ms = -1;
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    char buf[4];
    CHECK(write(p.c, "x", 1) == 1 && read_relayed(r, p.s, buf, 1, 0, 2000) == 1);
    CHECK(write(p.s, "y", 1) == 1 && read_relayed(r, p.c, buf, 1, 0, 2000) == 1);
    CHECK(corral_relay_timer_ms(r, &ms) == 0 && ms == 0);
    struct corral_relay_opts hour = {.idle_ms = 3600 * 1000};
    struct path q = relayed(r, &hour);
    CHECK(q.add_err == 0);
    CHECK(corral_relay_timer_ms(r, &ms) == 0 && ms > 3590 * 1000 && ms <= 3600 * 1000);
    close_path(&p);
    close_path(&q);
    corral_relay_free(r);
}

static void test_key_cap(struct corral_relay *r)
{
    struct corral_relay_opts sb1 = {.idle_ms = 0, .key = "sb1", .max_per_key = 2};
    struct corral_relay_opts sb2 = {.idle_ms = 0, .key = "sb2", .max_per_key = 2};
    struct path p1 = relayed(r, &sb1), p2 = relayed(r, &sb1);
    CHECK(p1.add_err == 0 && p2.add_err == 0);
    struct path p3 = relayed(r, &sb1);
    CHECK(p3.add_err == -EUSERS);
    char buf[4];
    /* The refused client is reset, as a deny is. */
    CHECK(read_relayed(r, p3.c, buf, sizeof buf, 1, 1000) == -ECONNRESET);
    /* Control: another key is not affected. */
    struct path q = relayed(r, &sb2);
    CHECK(q.add_err == 0);
    CHECK(corral_relay_count(r, "sb1") == 2 && corral_relay_count(r, "sb2") == 1);
    CHECK(corral_relay_count(r, "none") == 0 && corral_relay_count(r, NULL) == 3);
    /* A slot freed is a slot again. */
    close_path(&p1);
    CHECK(wait_event(r, p1.id, CORRAL_RELAY_CLOSED, 2000) != NULL);
    CHECK(corral_relay_count(r, "sb1") == 1);
    struct path p4 = relayed(r, &sb1);
    CHECK(p4.add_err == 0);
    /* add_connect checks the cap before it dials. */
    int c, a;
    CHECK(tcp_pair(&c, &a) == 0);
    socklen_t len;
    struct sockaddr_storage ss = lo_addr(9, &len);
    CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 0, 100, &sb1, NULL) ==
          -EUSERS);
    /* A cap without a key is a caller's mistake, not "no cap". */
    struct corral_relay_opts nokey = {.idle_ms = 0, .key = NULL, .max_per_key = 1};
    struct path bad = relayed(r, &nokey);
    CHECK(bad.add_err == -EINVAL);
    close_path(&bad);
    close(c);
    struct path *all[] = {&p2, &p3, &q, &p4};
    for (size_t i = 0; i < 4; i++)
        close_path(all[i]);
    long end = now_ms() + 2000;
    while (corral_relay_count(r, NULL) && now_ms() < end)
        run(r, 10);
    CHECK(corral_relay_count(r, NULL) == 0 && corral_relay_count(r, "sb1") == 0);
}

static void test_backpressure(struct corral_relay *r)
{
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    fcntl(p.c, F_SETFL, O_NONBLOCK);
    static char chunk[65536];
    memset(chunk, 'z', sizeof chunk);
    /* The server reads nothing: the client must come to a stop, held back by socket
     * buffers and one pipe, not by memory the relay keeps growing. */
    size_t sent = 0;
    long last = now_ms();
    while (now_ms() - last < 300 && sent < (256u << 20)) {
        ssize_t n = write(p.c, chunk, sizeof chunk);
        if (n > 0) {
            sent += (size_t)n;
            last = now_ms();
        }
        run(r, n > 0 ? 0 : 10);
    }
    CHECK(sent > 0 && sent < (64u << 20));
    /* Control: once the server reads, every byte arrives. */
    shutdown(p.c, SHUT_WR);
    size_t got = 0;
    long end = now_ms() + 5000;
    static char sink[65536];
    fcntl(p.s, F_SETFL, O_NONBLOCK);
    while (now_ms() < end) {
        run(r, 0);
        ssize_t n = read(p.s, sink, sizeof sink);
        if (n == 0) break;
        if (n > 0) got += (size_t)n;
        if (n < 0) run(r, 5);
    }
    CHECK(got == sent);
    close_path(&p);
    CHECK(wait_event(r, p.id, CORRAL_RELAY_CLOSED, 2000) != NULL);
}

static void test_loop_fd(struct corral_relay *r)
{
    int rfd = corral_relay_fd(r);
    struct pollfd pf = {.fd = rfd, .events = POLLIN, .revents = 0};
    while (run(r, 0) > 0) {
    }
    CHECK(poll(&pf, 1, 0) == 0); /* nothing to do */
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    while (run(r, 0) > 0) {
    }
    CHECK(poll(&pf, 1, 0) == 0);
    CHECK(write(p.c, "wake", 4) == 4);
    CHECK(poll(&pf, 1, 1000) == 1); /* data to move: readable */
    /* An event that does not fit stays queued and keeps the fd readable. */
    close_path(&p);
    struct corral_relay_event ev;
    long end = now_ms() + 2000;
    while (now_ms() < end) {
        CHECK(corral_relay_run(r, 10, &ev, 0) == 0);
        if (corral_relay_count(r, NULL) == 0) break;
    }
    CHECK(poll(&pf, 1, 0) == 1);
    CHECK(corral_relay_run(r, 1000, &ev, 1) == 1 && ev.id == p.id &&
          ev.kind == CORRAL_RELAY_CLOSED && ev.bytes_a_to_b == 4);
    CHECK(corral_relay_run(r, 0, &ev, 1) == 0);
    CHECK(poll(&pf, 1, 0) == 0);
}

static void test_thousand(void)
{
    enum { N = 1000 };
    struct corral_relay *r = NULL;
    CHECK(corral_relay_new(&r) == 0);
    int acc_port = 0, up_port = 0;
    int acc = corral_tcp_listen("127.0.0.1", 0, &acc_port);
    int up = corral_tcp_listen("127.0.0.1", 0, &up_port);
    CHECK(acc >= 0 && up >= 0);
    fcntl(up, F_SETFL, O_NONBLOCK);
    socklen_t len;
    struct sockaddr_storage ss = lo_addr(up_port, &len);
    static int cl[N], sv[N];
    static uint64_t ids[N];
    int added = 0, accepted = 0;
    size_t first = logged;
    long t0 = now_ms();
    for (int i = 0; i < N; i++) {
        cl[i] = corral_tcp_connect("127.0.0.1", acc_port, 1000);
        int a = corral_tcp_accept(acc, 1000);
        if (cl[i] >= 0 && a >= 0 &&
            corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 0, 5000, NULL, &ids[i]) ==
                0)
            added++;
        run(r, 0);
        int s;
        while (accepted < N && (s = accept4(up, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0)
            sv[accepted++] = s;
    }
    CHECK(added == N);
    long end = now_ms() + 10000;
    while (accepted < N && now_ms() < end) {
        run(r, 1);
        int s;
        while (accepted < N && (s = accept4(up, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0)
            sv[accepted++] = s;
    }
    CHECK(accepted == N);
    CHECK(corral_relay_count(r, NULL) == N);
    /* Each client says its number; each server echoes what it hears; each client must
     * get its own number back through its own relayed connection. */
    for (int i = 0; i < N; i++)
        CHECK(write(cl[i], &i, sizeof i) == sizeof i);
    int echoed = 0;
    static int done[N];
    end = now_ms() + 10000;
    while (echoed < N && now_ms() < end) {
        run(r, 1);
        for (int j = 0; j < N; j++) {
            int v;
            if (!done[j] && recv(sv[j], &v, sizeof v, MSG_DONTWAIT) == sizeof v) {
                done[j] = 1;
                echoed += write(sv[j], &v, sizeof v) == sizeof v;
            }
        }
    }
    CHECK(echoed == N);
    int back = 0;
    end = now_ms() + 10000;
    memset(done, 0, sizeof done);
    while (back < N && now_ms() < end) {
        run(r, 1);
        for (int i = 0; i < N; i++) {
            int v = -1;
            if (!done[i] && recv(cl[i], &v, sizeof v, MSG_DONTWAIT) == sizeof v) {
                done[i] = 1;
                back += v == i;
            }
        }
    }
    CHECK(back == N);
    NOTE("1000 relayed connections: established and echoed in %ld ms, %zu held\n", now_ms() - t0,
         corral_relay_count(r, NULL));
    int connected = 0;
    for (size_t k = first; k < logged; k++)
        connected += event_log[k].kind == CORRAL_RELAY_CONNECTED;
    CHECK(connected == N);
    for (int i = 0; i < N; i++) {
        close(cl[i]);
        close(sv[i]);
    }
    int closed = 0;
    end = now_ms() + 10000;
    while (corral_relay_count(r, NULL) && now_ms() < end)
        run(r, 10);
    while (run(r, 0) > 0) { /* the events still queued */
    }
    for (size_t k = first; k < logged; k++)
        closed += event_log[k].kind == CORRAL_RELAY_CLOSED && event_log[k].err == 0 &&
                  event_log[k].bytes_a_to_b == 4 && event_log[k].bytes_b_to_a == 4;
    CHECK(closed == N);
    corral_relay_free(r);
    close(acc);
    close(up);
}

static void test_free_resets_everything(void)
{
    struct corral_relay *r = NULL;
    CHECK(corral_relay_new(&r) == 0);
    struct path p = relayed(r, NULL);
    CHECK(p.add_err == 0);
    int c, a;
    CHECK(tcp_pair(&c, &a) == 0);
    socklen_t len;
    struct sockaddr_storage void_ss;
    corral_sockaddr_from("203.0.113.9", 80, &void_ss, &len);
    CHECK(corral_relay_add_connect(r, a, (struct sockaddr *)&void_ss, len, 0, 0, NULL, NULL) == 0);
    CHECK(write(p.c, "x", 1) == 1);
    run(r, 10);
    corral_relay_free(r);
    char b[4];
    struct pollfd pf[3] = {{p.c, POLLIN, 0}, {p.s, POLLIN, 0}, {c, POLLIN, 0}};
    CHECK(poll(pf, 3, 1000) >= 1);
    usleep(20000);
    errno = 0;
    CHECK(recv(p.c, b, sizeof b, MSG_DONTWAIT) < 0 && errno == ECONNRESET);
    CHECK(recv(c, b, sizeof b, MSG_DONTWAIT) < 0 && errno == ECONNRESET);
    close_path(&p);
    close(c);
}

/* A child without CAP_NET_ADMIN: the mark cannot be set, so no upstream is made and the
 * client is reset; the unmarked control in the same child connects. */
static void test_mark_refused(void)
{
    int port = 0;
    int up = corral_tcp_listen("127.0.0.1", 0, &port);
    CHECK(up >= 0);
    int rep[2];
    CHECK(pipe2(rep, O_CLOEXEC) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        int res[4] = {0, 0, 0, 0};
        cap_t caps = cap_get_proc();
        cap_value_t drop[] = {CAP_NET_ADMIN, CAP_NET_RAW};
        cap_set_flag(caps, CAP_EFFECTIVE, 2, drop, CAP_CLEAR);
        cap_set_flag(caps, CAP_PERMITTED, 2, drop, CAP_CLEAR);
        cap_set_proc(caps);
        cap_free(caps);
        struct corral_relay *r = NULL;
        corral_relay_new(&r);
        socklen_t len;
        struct sockaddr_storage ss = lo_addr(port, &len);
        int c, a;
        uint64_t id = 0;
        tcp_pair(&c, &a);
        int before = count_fds();
        res[0] = corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 42, 1000, NULL, &id);
        res[1] = count_fds() - before; /* a was reset and closed: one fewer */
        char b;
        res[2] = recv(c, &b, 1, 0) < 0 ? errno : 0;
        close(c);
        tcp_pair(&c, &a);
        corral_relay_add_connect(r, a, (struct sockaddr *)&ss, len, 0, 1000, NULL, &id);
        res[3] = wait_event(r, id, CORRAL_RELAY_CONNECTED, 2000) != NULL;
        if (write(rep[1], res, sizeof res) != sizeof res) _exit(2);
        _exit(0);
    }
    close(rep[1]);
    int res[4] = {0, 0, 0, 0};
    CHECK(read(rep[0], res, sizeof res) == sizeof res);
    close(rep[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(res[0] == -EPERM);
    CHECK(res[1] == -1);
    CHECK(res[2] == ECONNRESET);
    CHECK(res[3] == 1);
    int s = corral_tcp_accept(up, 1000); /* the control's connection… */
    CHECK(s >= 0);
    if (s >= 0) close(s);
    CHECK(corral_tcp_accept(up, 100) == -ETIMEDOUT); /* …and no other */
    close(up);
}

int main(void)
{
    CHECK(unshare(CLONE_NEWNET) == 0);
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    CHECK(self >= 0 && corral_rtnl_lo_default_routes(self) == 0);
    close(self);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < 16384) {
        rl.rlim_cur = rl.rlim_max < 16384 ? rl.rlim_max : 16384;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    int before = count_fds();
    struct corral_relay *r = NULL;
    CHECK(corral_relay_new(&r) == 0);
    int rfd = corral_relay_fd(r);
    CHECK(rfd >= 0 && (fcntl(rfd, F_GETFD) & FD_CLOEXEC));
    test_bytes_both_ways(r);
    test_half_close(r);
    test_reset_propagates(r);
    test_epipe_survived(r);
    test_idle_timeout(r);
    test_connect(r);
    test_proxy_preface(r);
    test_race(r);
    test_race_out_of_fds(r);
    test_key_cap(r);
    test_reset_one(r);
    test_hold(r);
    test_port_slice(r);
    test_backpressure(r);
    test_loop_fd(r);
    CHECK(corral_relay_count(r, NULL) == 0);
    corral_relay_free(r);
    CHECK(count_fds() == before);

    test_thousand();
    test_no_idle_no_timer();
    test_free_resets_everything();
    test_mark_refused();
    CHECK(count_fds() == before);
    return DONE();
}
