/*
 * The UDP relay of one sandbox (see udprelay.h).
 *
 * Datagrams are copied through one 64 KiB buffer: UDP has no splice path, and a flow's
 * datagrams are small and each moved once. Every socket is level-triggered and each is
 * read at most TURN_BUDGET datagrams per run, so one busy flow cannot starve the rest.
 * A flow is found by its addresses in a hash table; the few calls that name a flow by
 * its id (allow, deny, cut: once or twice in its life) walk the list of flows.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "ns.h"
#include "sock.h"
#include "udprelay.h"
#include "util.h"

#ifndef IP_TRANSPARENT
#define IP_TRANSPARENT 19
#endif
#ifndef IP_RECVORIGDSTADDR
#define IP_RECVORIGDSTADDR 20
#define IP_ORIGDSTADDR IP_RECVORIGDSTADDR
#endif
#ifndef IPV6_TRANSPARENT
#define IPV6_TRANSPARENT 75
#endif
#ifndef IPV6_RECVORIGDSTADDR
#define IPV6_RECVORIGDSTADDR 74
#define IPV6_ORIGDSTADDR IPV6_RECVORIGDSTADDR
#endif

#define DEFAULT_MAX_ENTRIES 4096
#define BUCKETS 1024 /* a power of two */
#define DGRAM_MAX 65536
#define TURN_BUDGET 64 /* datagrams read from one socket per run */
#define HOLD_MAX 8     /* datagrams a new flow holds until it is decided */
#define HOLD_BYTES (64 * 1024)
#define SWEEP_MS 100 /* how often run looks for idle flows */
/* The listener's receive buffer: every tenant datagram of the sandbox passes through it.
 * The kernel caps it at net.core.rmem_max (212992 by default) for a process without
 * CAP_NET_ADMIN over the socket's netns; the relay holds that, so SO_RCVBUFFORCE. */
#define LISTENER_RCVBUF (4 * 1024 * 1024)

enum state { NEW, ALLOWED, DENIED, ENDED };

struct held {
    struct held *next;
    size_t len;
    unsigned char data[];
};

/* The socket replies leave from: bound to one original destination inside the netns. */
struct reply {
    struct reply *next;
    struct sockaddr_storage addr;
    int fd;
    size_t refs;
};

struct flow {
    uint64_t id;
    struct sockaddr_storage src, dst;
    uint32_t hash;
    struct flow *hnext;       /* hash chain */
    struct flow *prev, *next; /* every flow, oldest first */
    enum state state;
    int upstream;
    struct reply *reply;
    int64_t last_ms;
    int idle_ms;
    uint64_t bytes_up, bytes_down, sent, received, dropped;
    int err;
    struct held *held, **held_tail;
    size_t nheld, held_bytes;
};

struct corral_udprelay {
    int ep, listener, netns, upstream_netns;
    uint32_t mark, upstream_mark;
    size_t max_entries, entries, allowed;
    struct flow *buckets[BUCKETS];
    struct flow *first, *last; /* every flow */
    struct flow *dead;         /* ended, freed at the next run (an epoll batch may name them) */
    struct reply *replies;
    uint64_t next_id, overflow;
    int64_t last_sweep;
    struct corral_udprelay_event *queue;
    size_t nqueue, capqueue;
    unsigned char *buf;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* An IPv4-mapped IPv6 address (how the dual-stack listener sees an IPv4 sender) as the
 * IPv4 address it maps, so that one flow has one key and replies go out as IPv4. */
static void unmap(struct sockaddr_storage *ss)
{
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (ss->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) return;
    struct sockaddr_in s4 = {.sin_family = AF_INET, .sin_port = s6->sin6_port};
    memcpy(&s4.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
    memset(ss, 0, sizeof *ss);
    memcpy(ss, &s4, sizeof s4);
}

static socklen_t addr_len(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

/* The bytes that identify an endpoint: address and port (family by length). */
static size_t endpoint(const struct sockaddr_storage *ss, unsigned char out[18])
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        memcpy(out, &s4->sin_addr, 4);
        memcpy(out + 4, &s4->sin_port, 2);
        return 6;
    }
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    memcpy(out, &s6->sin6_addr, 16);
    memcpy(out + 16, &s6->sin6_port, 2);
    return 18;
}

static bool same_endpoint(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    unsigned char x[18], y[18];
    size_t n = endpoint(a, x);
    return a->ss_family == b->ss_family && n == endpoint(b, y) && memcmp(x, y, n) == 0;
}

static uint32_t fnv(uint32_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static uint32_t flow_hash(const struct sockaddr_storage *src, const struct sockaddr_storage *dst)
{
    unsigned char b[18];
    uint32_t h = fnv(2166136261u, b, endpoint(src, b));
    return fnv(h, b, endpoint(dst, b));
}

static struct flow *lookup(struct corral_udprelay *r, const struct sockaddr_storage *src,
                           const struct sockaddr_storage *dst, uint32_t hash)
{
    for (struct flow *f = r->buckets[hash & (BUCKETS - 1)]; f; f = f->hnext)
        if (f->hash == hash && same_endpoint(&f->src, src) && same_endpoint(&f->dst, dst)) return f;
    return NULL;
}

static struct flow *by_id(struct corral_udprelay *r, uint64_t id)
{
    for (struct flow *f = r->first; f; f = f->next)
        if (f->id == id) return f;
    return NULL;
}

static int push_event(struct corral_udprelay *r, const struct corral_udprelay_event *ev)
{
    if (r->nqueue == r->capqueue) {
        size_t cap = r->capqueue ? r->capqueue * 2 : 64;
        struct corral_udprelay_event *q = realloc(r->queue, cap * sizeof *q);
        if (!q) return -ENOMEM;
        r->queue = q;
        r->capqueue = cap;
    }
    r->queue[r->nqueue++] = *ev;
    return 0;
}

static void drop_held(struct flow *f)
{
    while (f->held) {
        struct held *h = f->held;
        f->held = h->next;
        free(h);
    }
    f->held_tail = &f->held;
    f->nheld = f->held_bytes = 0;
}

static void release_reply(struct corral_udprelay *r, struct reply *rep)
{
    if (!rep || --rep->refs > 0) return;
    for (struct reply **p = &r->replies; *p; p = &(*p)->next) {
        if (*p == rep) {
            *p = rep->next;
            break;
        }
    }
    close(rep->fd);
    free(rep);
}

/* Takes the flow out of the table and every index, closes what it holds and reports its
 * end; the memory waits for the next run (see struct corral_udprelay). */
static void end_flow(struct corral_udprelay *r, struct flow *f, int why)
{
    if (f->state == ENDED) return;
    struct corral_udprelay_event ev = {.kind = CORRAL_UDPRELAY_END,
                                       .id = f->id,
                                       .src = f->src,
                                       .dst = f->dst,
                                       .why = why,
                                       .allowed = f->state == ALLOWED,
                                       .bytes_up = f->bytes_up,
                                       .bytes_down = f->bytes_down,
                                       .sent = f->sent,
                                       .received = f->received,
                                       .dropped = f->dropped + f->nheld,
                                       .err = f->err};
    /* An event that cannot be queued (no memory) is lost; the flow still ends. */
    (void)push_event(r, &ev);
    if (f->state == ALLOWED) r->allowed--;
    r->entries--;
    for (struct flow **p = &r->buckets[f->hash & (BUCKETS - 1)]; *p; p = &(*p)->hnext) {
        if (*p == f) {
            *p = f->hnext;
            break;
        }
    }
    if (f->prev)
        f->prev->next = f->next;
    else
        r->first = f->next;
    if (f->next)
        f->next->prev = f->prev;
    else
        r->last = f->prev;
    if (f->upstream >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, f->upstream, NULL);
        close(f->upstream);
        f->upstream = -1;
    }
    release_reply(r, f->reply);
    f->reply = NULL;
    drop_held(f);
    f->state = ENDED;
    f->next = r->dead;
    r->dead = f;
}

static void free_dead(struct corral_udprelay *r)
{
    while (r->dead) {
        struct flow *f = r->dead;
        r->dead = f->next;
        free(f);
    }
}

static int set_int(int fd, int level, int name, int value)
{
    return setsockopt(fd, level, name, &value, sizeof value) < 0 ? -errno : 0;
}

static int make_listener(int netns_fd, uint16_t *port)
{
    _cleanup_close_ int fd = corral_ns_socket(netns_fd, AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return fd;
    int err = set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 0);
    if (!err) err = set_int(fd, IPPROTO_IPV6, IPV6_TRANSPARENT, 1);
    if (!err) err = set_int(fd, IPPROTO_IP, IP_RECVORIGDSTADDR, 1);
    if (!err) err = set_int(fd, IPPROTO_IPV6, IPV6_RECVORIGDSTADDR, 1);
    if (err) return err;
    if (set_int(fd, SOL_SOCKET, SO_RCVBUFFORCE, LISTENER_RCVBUF) < 0)
        (void)set_int(fd, SOL_SOCKET, SO_RCVBUF, LISTENER_RCVBUF);
    struct sockaddr_in6 any = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};
    if (bind(fd, (struct sockaddr *)&any, sizeof any) < 0) return -errno;
    socklen_t len = sizeof any;
    if (getsockname(fd, (struct sockaddr *)&any, &len) < 0) return -errno;
    *port = ntohs(any.sin6_port);
    return corral_take_fd(&fd);
}

int corral_udprelay_new(const struct corral_udprelay_opts *opts, struct corral_udprelay **out,
                        uint16_t *port)
{
    if (!opts || opts->netns_fd < 0 || !opts->mark || !out || !port) return -EINVAL;
    struct corral_udprelay *r = calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    r->ep = r->listener = r->netns = r->upstream_netns = -1;
    r->mark = opts->mark;
    r->upstream_mark = opts->upstream_mark;
    r->max_entries = opts->max_entries ? opts->max_entries : DEFAULT_MAX_ENTRIES;
    r->next_id = 1;
    int err = 0;
    r->buf = malloc(DGRAM_MAX);
    if (!r->buf) err = -ENOMEM;
    if (!err && (r->ep = epoll_create1(EPOLL_CLOEXEC)) < 0) err = -errno;
    if (!err && (r->netns = fcntl(opts->netns_fd, F_DUPFD_CLOEXEC, 0)) < 0) err = -errno;
    if (!err && opts->upstream_netns_fd >= 0 &&
        (r->upstream_netns = fcntl(opts->upstream_netns_fd, F_DUPFD_CLOEXEC, 0)) < 0)
        err = -errno;
    if (!err) {
        r->listener = make_listener(r->netns, port);
        if (r->listener < 0) err = r->listener;
    }
    if (!err) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = r};
        if (epoll_ctl(r->ep, EPOLL_CTL_ADD, r->listener, &ev) < 0) err = -errno;
    }
    if (err) {
        corral_udprelay_free(r);
        return err;
    }
    *out = r;
    return 0;
}

void corral_udprelay_free(struct corral_udprelay *r)
{
    if (!r) return;
    while (r->first)
        end_flow(r, r->first, CORRAL_UDPRELAY_CLOSED);
    free_dead(r);
    int *fds[] = {&r->ep, &r->listener, &r->netns, &r->upstream_netns};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (*fds[i] >= 0) close(*fds[i]);
    free(r->queue);
    free(r->buf);
    free(r);
}

int corral_udprelay_fd(const struct corral_udprelay *r)
{
    return r->ep;
}

size_t corral_udprelay_count(const struct corral_udprelay *r)
{
    return r->allowed;
}

/* The shared socket that answers as dst: IP_TRANSPARENT lets it bind an address that is
 * not the netns's own (the synthetic or upstream address the tenant wrote to), and its
 * mark exempts what it sends from the ruleset, whose route_out would otherwise send a
 * reply to a port some entry names back to the relay. */
static int reply_for(struct corral_udprelay *r, const struct sockaddr_storage *dst,
                     struct reply **out)
{
    for (struct reply *rep = r->replies; rep; rep = rep->next) {
        if (same_endpoint(&rep->addr, dst)) {
            rep->refs++;
            *out = rep;
            return 0;
        }
    }
    int family = dst->ss_family;
    _cleanup_close_ int fd = corral_ns_socket(r->netns, family, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return fd;
    int err = family == AF_INET ? set_int(fd, IPPROTO_IP, IP_TRANSPARENT, 1)
                                : set_int(fd, IPPROTO_IPV6, IPV6_TRANSPARENT, 1);
    if (!err && family == AF_INET6) err = set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
    if (!err) err = set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    if (!err) err = corral_set_mark_checked(fd, r->mark);
    if (err) return err;
    if (bind(fd, (const struct sockaddr *)dst, addr_len(dst)) < 0) return -errno;
    struct reply *rep = calloc(1, sizeof *rep);
    if (!rep) return -ENOMEM;
    rep->addr = *dst;
    rep->fd = corral_take_fd(&fd);
    rep->refs = 1;
    rep->next = r->replies;
    r->replies = rep;
    *out = rep;
    return 0;
}

/* A connected, non-blocking upstream socket to addr, in the upstream netns with its mark
 * when the relay has one. UDP's connect sends nothing: it fails at once only for a
 * destination the host cannot route to. */
static int connect_upstream(struct corral_udprelay *r, const struct sockaddr_storage *addr)
{
    int family = addr->ss_family;
    _cleanup_close_ int fd = -1;
    if (r->upstream_netns >= 0) {
        fd = corral_ns_socket(r->upstream_netns, family, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0) return fd;
    } else {
        fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return -errno;
    }
    if (r->upstream_mark) {
        int err = corral_set_mark_checked(fd, r->upstream_mark);
        if (err) return err;
    }
    if (connect(fd, (const struct sockaddr *)addr, addr_len(addr)) < 0) return -errno;
    return corral_take_fd(&fd);
}

static void send_up(struct flow *f, const unsigned char *data, size_t len)
{
    ssize_t n = send(f->upstream, data, len, MSG_DONTWAIT);
    /* A connected UDP socket reports an earlier ICMP error (port unreachable) on the next
     * send: it is remembered and the datagram sent once more. */
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        f->err = errno;
        n = send(f->upstream, data, len, MSG_DONTWAIT);
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) f->err = errno;
        f->dropped++;
        return;
    }
    f->bytes_up += (uint64_t)n;
    f->sent++;
}

int corral_udprelay_allow(struct corral_udprelay *r, uint64_t id,
                          const struct sockaddr_storage *addrs, size_t n, int idle_ms, size_t *used)
{
    struct flow *f = by_id(r, id);
    if (!f || f->state != NEW) return -ENOENT;
    if (n == 0 || idle_ms <= 0) return -EINVAL;
    int fd = -EDESTADDRREQ;
    size_t i;
    for (i = 0; i < n; i++) {
        fd = connect_upstream(r, &addrs[i]);
        if (fd >= 0) break;
    }
    if (fd < 0) return fd;
    struct reply *rep = NULL;
    int err = reply_for(r, &f->dst, &rep);
    if (!err) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = f};
        if (epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev) < 0) err = -errno;
    }
    if (err) {
        release_reply(r, rep);
        close(fd);
        return err;
    }
    f->upstream = fd;
    f->reply = rep;
    f->state = ALLOWED;
    r->allowed++;
    f->idle_ms = idle_ms;
    f->last_ms = now_ms();
    for (struct held *h = f->held; h; h = h->next)
        send_up(f, h->data, h->len);
    drop_held(f);
    if (used) *used = i;
    return 0;
}

int corral_udprelay_deny(struct corral_udprelay *r, uint64_t id, int idle_ms)
{
    struct flow *f = by_id(r, id);
    if (!f || f->state != NEW) return -ENOENT;
    if (idle_ms <= 0) return -EINVAL;
    f->dropped += f->nheld;
    drop_held(f);
    f->state = DENIED;
    f->idle_ms = idle_ms;
    f->last_ms = now_ms();
    return 0;
}

int corral_udprelay_cut(struct corral_udprelay *r, uint64_t id)
{
    struct flow *f = by_id(r, id);
    if (!f) return -ENOENT;
    end_flow(r, f, CORRAL_UDPRELAY_CUT);
    return 0;
}

void corral_udprelay_shutdown(struct corral_udprelay *r)
{
    while (r->first)
        end_flow(r, r->first, CORRAL_UDPRELAY_CLOSED);
    if (r->listener >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, r->listener, NULL);
        close(r->listener);
        r->listener = -1;
    }
}

/* A datagram of a flow not seen before: held, and reported for a decision. */
static void new_flow(struct corral_udprelay *r, const struct sockaddr_storage *src,
                     const struct sockaddr_storage *dst, uint32_t hash, size_t len, int64_t now)
{
    if (r->entries >= r->max_entries) {
        r->overflow++;
        return;
    }
    struct flow *f = calloc(1, sizeof *f);
    struct held *h = malloc(sizeof *h + len);
    struct corral_udprelay_event ev = {
        .kind = CORRAL_UDPRELAY_NEW, .src = *src, .dst = *dst, .size = len};
    ev.id = r->next_id;
    if (!f || !h || push_event(r, &ev) < 0) {
        free(f);
        free(h);
        r->overflow++;
        return;
    }
    f->id = r->next_id++;
    f->src = *src;
    f->dst = *dst;
    f->hash = hash;
    f->upstream = -1;
    f->state = NEW;
    f->last_ms = now;
    h->next = NULL;
    h->len = len;
    memcpy(h->data, r->buf, len);
    f->held = h;
    f->held_tail = &h->next;
    f->nheld = 1;
    f->held_bytes = len;
    f->hnext = r->buckets[hash & (BUCKETS - 1)];
    r->buckets[hash & (BUCKETS - 1)] = f;
    f->prev = r->last;
    if (r->last)
        r->last->next = f;
    else
        r->first = f;
    r->last = f;
    r->entries++;
}

static void hold(struct flow *f, const unsigned char *data, size_t len)
{
    struct held *h =
        f->nheld < HOLD_MAX && f->held_bytes + len <= HOLD_BYTES ? malloc(sizeof *h + len) : NULL;
    if (!h) {
        f->dropped++;
        return;
    }
    h->next = NULL;
    h->len = len;
    memcpy(h->data, data, len);
    *f->held_tail = h;
    f->held_tail = &h->next;
    f->nheld++;
    f->held_bytes += len;
}

/* The original destination TPROXY left in the datagram, from its control message. */
static bool original_dst(struct msghdr *msg, struct sockaddr_storage *dst)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_ORIGDSTADDR &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct sockaddr_in))) {
            memset(dst, 0, sizeof *dst);
            memcpy(dst, CMSG_DATA(c), sizeof(struct sockaddr_in));
            return dst->ss_family == AF_INET;
        }
        if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_ORIGDSTADDR &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct sockaddr_in6))) {
            memset(dst, 0, sizeof *dst);
            memcpy(dst, CMSG_DATA(c), sizeof(struct sockaddr_in6));
            unmap(dst);
            return dst->ss_family == AF_INET6 || dst->ss_family == AF_INET;
        }
    }
    return false;
}

static void from_tenant(struct corral_udprelay *r, int64_t now)
{
    for (int i = 0; i < TURN_BUDGET && r->listener >= 0; i++) {
        struct sockaddr_storage src, dst;
        char control[256];
        struct iovec iov = {.iov_base = r->buf, .iov_len = DGRAM_MAX};
        struct msghdr msg = {.msg_name = &src,
                             .msg_namelen = sizeof src,
                             .msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control,
                             .msg_controllen = sizeof control};
        memset(&src, 0, sizeof src);
        ssize_t n = recvmsg(r->listener, &msg, MSG_DONTWAIT);
        if (n < 0) return; /* EAGAIN; an error on a datagram socket is a datagram's */
        unmap(&src);
        /* Without its destination a datagram belongs to no flow (never expected: every
         * datagram the socket can receive carries one). */
        if (!original_dst(&msg, &dst) || (msg.msg_flags & MSG_TRUNC)) {
            r->overflow++;
            continue;
        }
        uint32_t hash = flow_hash(&src, &dst);
        struct flow *f = lookup(r, &src, &dst, hash);
        if (!f) {
            new_flow(r, &src, &dst, hash, (size_t)n, now);
            continue;
        }
        if (f->state == ALLOWED) {
            f->last_ms = now;
            send_up(f, r->buf, (size_t)n);
        } else if (f->state == NEW) {
            hold(f, r->buf, (size_t)n);
        } else {
            /* denied: silence is what ends it, so every datagram keeps it */
            f->last_ms = now;
            f->dropped++;
        }
    }
}

static void from_upstream(struct corral_udprelay *r, struct flow *f, int64_t now)
{
    for (int i = 0; i < TURN_BUDGET && f->state == ALLOWED; i++) {
        ssize_t n = recv(f->upstream, r->buf, DGRAM_MAX, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* ECONNREFUSED and the like: an ICMP error for an earlier datagram, reported
             * once; the socket goes on. */
            f->err = errno;
            continue;
        }
        f->last_ms = now;
        ssize_t m = sendto(f->reply->fd, r->buf, (size_t)n, MSG_DONTWAIT,
                           (struct sockaddr *)&f->src, addr_len(&f->src));
        if (m < 0) {
            f->dropped++;
            continue;
        }
        f->bytes_down += (uint64_t)m;
        f->received++;
    }
}

static void sweep(struct corral_udprelay *r, int64_t now)
{
    for (struct flow *f = r->first, *next; f; f = next) {
        next = f->next;
        /* a new flow is decided in the caller's next turn: it waits for no limit here */
        if (f->state != NEW && now - f->last_ms >= f->idle_ms) end_flow(r, f, CORRAL_UDPRELAY_IDLE);
    }
}

int corral_udprelay_run(struct corral_udprelay *r, struct corral_udprelay_event *events, size_t max)
{
    free_dead(r);
    struct epoll_event evs[64];
    int n = epoll_wait(r->ep, evs, 64, 0);
    if (n < 0 && errno != EINTR) return -errno;
    int64_t now = now_ms();
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == r) {
            from_tenant(r, now);
        } else {
            struct flow *f = evs[i].data.ptr;
            if (f->state == ALLOWED) from_upstream(r, f, now);
        }
    }
    if (now - r->last_sweep >= SWEEP_MS) {
        r->last_sweep = now;
        sweep(r, now);
    }
    if (r->overflow) {
        struct corral_udprelay_event ev = {.kind = CORRAL_UDPRELAY_OVERFLOW,
                                           .dropped = r->overflow};
        if (push_event(r, &ev) == 0) r->overflow = 0;
    }
    size_t k = r->nqueue < max ? r->nqueue : max;
    if (k == 0) return 0; /* the queue may not exist yet */
    memcpy(events, r->queue, k * sizeof *events);
    memmove(r->queue, r->queue + k, (r->nqueue - k) * sizeof *events);
    r->nqueue -= k;
    return (int)k;
}
