/*
 * The egress relay loop (see relay.h).
 *
 * Every socket is registered once, edge-triggered, for input and output; the loop keeps
 * what epoll last reported (rd/wr) and works each direction until the kernel says
 * EAGAIN, so back-pressure costs no epoll_ctl: a direction whose pipe is full simply
 * is not read until the pipe drains into the other socket.
 *
 * splice only, for small payloads too: a recv/send path for reads under 4 KiB (no pipe
 * until a send came up short) was measured here against it (scripts/bench/egress, the
 * two interleaved): 64-byte round trips +7.1 to +7.8 us over direct with either, and
 * connect + first byte equal within run-to-run noise, so it did not earn a second path.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "relay.h"
#include "sock.h"
#include "util.h"

/* epoll data of the loop's own fds; a connection's is its address | side (malloc
 * aligns to 16, and no address is below 4096): 0 the client, 1 upstream, 2 + i the
 * attempt at a race's address i. */
#define TAG_TIMER 1u
#define TAG_NOTIFY 2u
#define BATCH 256
#define KEY_BUCKETS 64
/* A connection moves at most this many pipe-fulls per direction before the loop turns
 * to the others, so one fast transfer cannot starve the rest of the loop. */
#define TURN_BUDGET 16
/* Each direction's pipe, and so the most a connection buffers per direction. Measured
 * here (scripts/bench/egress, 1 GiB, 2 vCPUs): relay/direct throughput 0.48 with the
 * default 64 KiB, 0.48-0.54 with 256 KiB, 0.54-0.59 with 1 MiB; the difference is
 * within run-to-run noise next to what a stalled reader would pin (1000 connections x
 * 2 directions x the pipe), so the middle. Pages are held only while bytes wait. */
#define PIPE_BYTES (256 * 1024)

/* Both legs probe an idle peer (TCP keepalive), so a long-lived connection with no
 * idle limit is still ended once either end is gone: the first probe after this many
 * seconds of silence, then every KEEPINTVL, dead after KEEPCNT unanswered. An end that
 * sends its own probes is answered by the leg it reaches, and the other leg carries its
 * own, so neither end's NAT or firewall sees a silent flow for longer than KEEPIDLE. */
#define KEEPIDLE 60
#define KEEPINTVL 20
#define KEEPCNT 6

enum state { CONNECTING, OPEN };

/* An upstream raced over several addresses (RFC 8305): one attempt starts, the next
 * after delay_ms or at once when the last one in flight fails, the first to connect
 * wins and the others are closed. Freed once a winner is chosen. */
struct race {
    struct sockaddr_storage addr[CORRAL_RELAY_RACE_MAX];
    size_t n, next;                /* addresses; the next one to try */
    int fd[CORRAL_RELAY_RACE_MAX]; /* the attempt at addr[i] while in flight, else -1 */
    size_t flying;                 /* attempts in flight */
    int64_t next_ms;               /* when the next attempt starts; 0: none */
    int delay_ms, last_err;
    int local_err; /* an address never tried for want of fds or memory here (EMFILE, …) */
    uint32_t mark;
    int netns_fd; /* a duplicate, closed with the race; -1: here */
    char *port_key;
};

struct key_entry {
    struct key_entry *next;
    size_t count;
    char name[];
};

struct dir {
    int pipe[2];    /* made on the first read; -1 until then */
    size_t queued;  /* bytes in the pipe */
    size_t cap;     /* what the pipe holds */
    uint64_t bytes; /* delivered to the destination socket */
    bool eof, shut; /* source read EOF; destination shut down for writing */
};

struct conn {
    struct conn *prev, *next; /* the live list, then the graveyard */
    struct conn *ready_next;  /* out of budget: to be worked again before waiting */
    uint64_t id;
    int fd[2];         /* [0] a, the client; [1] b, upstream */
    bool rd[2], wr[2]; /* readiness as last reported (edge-triggered) */
    struct dir d[2];   /* d[0]: a to b; d[1]: b to a */
    enum state state;
    bool dead, in_ready;
    bool held;        /* hold_a: a is not read until released */
    bool held_queued; /* a HELD event waits for a peek */
    bool a_ended;     /* a shut down its sending side (EPOLLRDHUP seen) */
    int idle_ms;
    int64_t last_ms;          /* last byte moved */
    int64_t connect_deadline; /* 0: none */
    struct key_entry *key;
    struct race *race; /* while racing addresses; fd[1] is -1 until one connects */
    char *preface;     /* opts' preface, until the proxy has answered it */
    bool proxying;     /* connected to the proxy, its answer awaited */
    int winner;        /* the address index that connected (0 without a race) */
};

struct corral_relay {
    int epfd, timerfd, notifyfd;
    bool notified;
    int64_t armed_ms; /* the timer's expiry, 0 when disarmed */
    int64_t now_ms;
    uint64_t next_id;
    size_t live;
    size_t pipe_bytes;
    struct conn *conns, *graveyard, *ready;
    struct key_entry *keys[KEY_BUCKETS];
    struct corral_relay_event *q; /* events not yet returned: q[qhead .. qhead+qlen) */
    size_t qhead, qlen, qcap;
};

static int64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int sock_error(int fd)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return errno;
    return err;
}

static unsigned key_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % KEY_BUCKETS;
}

static struct key_entry *key_find(const struct corral_relay *r, const char *name)
{
    for (struct key_entry *e = r->keys[key_hash(name)]; e; e = e->next)
        if (strcmp(e->name, name) == 0) return e;
    return NULL;
}

static void key_release(struct corral_relay *r, struct key_entry *k)
{
    if (!k || --k->count) return;
    for (struct key_entry **p = &r->keys[key_hash(k->name)]; *p; p = &(*p)->next) {
        if (*p == k) {
            *p = k->next;
            free(k);
            return;
        }
    }
}

/* Room for every event the live connections can still produce (at most three each:
 * CONNECTED, one HELD waiting for its peek, and the end), so that queueing one never
 * fails. */
static int reserve_events(struct corral_relay *r)
{
    size_t need = r->qlen + 3 * (r->live + 1);
    if (r->qhead && r->qhead + need > r->qcap) {
        memmove(r->q, r->q + r->qhead, r->qlen * sizeof *r->q);
        r->qhead = 0;
    }
    if (r->qhead + need <= r->qcap) return 0;
    size_t cap = r->qcap ? r->qcap : 64;
    while (cap < r->qhead + need)
        cap *= 2;
    void *q = realloc(r->q, cap * sizeof *r->q);
    if (!q) return -ENOMEM;
    r->q = q;
    r->qcap = cap;
    return 0;
}

static void push_event(struct corral_relay *r, const struct conn *c, int kind, int err)
{
    struct corral_relay_event *e = &r->q[r->qhead + r->qlen++];
    e->id = c->id;
    e->kind = kind;
    e->err = err;
    e->bytes_a_to_b = c->d[0].bytes;
    e->bytes_b_to_a = c->d[1].bytes;
    e->addr_index = c->winner;
}

static void arm(struct corral_relay *r, int64_t at_ms)
{
    if (at_ms == r->armed_ms) return;
    struct itimerspec its = {{0, 0}, {at_ms / 1000, (at_ms % 1000) * 1000000}};
    if (timerfd_settime(r->timerfd, TFD_TIMER_ABSTIME, &its, NULL) == 0) r->armed_ms = at_ms;
}

static int64_t race_due(const struct conn *c)
{
    return c->race && c->race->next < c->race->n ? c->race->next_ms : 0;
}

static int64_t deadline(const struct conn *c)
{
    if (c->state == CONNECTING) {
        int64_t due = race_due(c);
        if (due && (!c->connect_deadline || due < c->connect_deadline)) return due;
        return c->connect_deadline;
    }
    return c->idle_ms > 0 ? c->last_ms + c->idle_ms : 0;
}

static void arm_for(struct corral_relay *r, const struct conn *c)
{
    int64_t dl = deadline(c);
    if (dl && (!r->armed_ms || dl < r->armed_ms)) arm(r, dl);
}

static void drop_fd(struct corral_relay *r, int *fd, bool reset)
{
    if (*fd < 0) return;
    /* Explicitly: a duplicate of the fd elsewhere (a fork) would keep it registered, and
     * its events would then name a freed connection. */
    epoll_ctl(r->epfd, EPOLL_CTL_DEL, *fd, NULL);
    if (reset)
        corral_reset(*fd);
    else
        close(*fd);
    *fd = -1;
}

static void close_pipes(struct conn *c)
{
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (c->d[i].pipe[j] >= 0) {
                close(c->d[i].pipe[j]);
                c->d[i].pipe[j] = -1;
            }
}

static void race_free(struct corral_relay *r, struct conn *c)
{
    struct race *x = c->race;
    if (!x) return;
    for (size_t i = 0; i < x->n; i++)
        drop_fd(r, &x->fd[i], false);
    if (x->netns_fd >= 0) close(x->netns_fd);
    free(x->port_key);
    free(x);
    c->race = NULL;
}

/* Ends a connection whose sockets are already closed: queues its event, and moves it to
 * the graveyard, which run empties once no epoll event of this batch can name it. */
static void finish(struct corral_relay *r, struct conn *c, int kind, int err)
{
    race_free(r, c);
    free(c->preface);
    c->preface = NULL;
    close_pipes(c);
    c->dead = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        r->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = NULL;
    c->next = r->graveyard;
    r->graveyard = c;
    r->live--;
    key_release(r, c->key);
    c->key = NULL;
    push_event(r, c, kind, err);
}

/* Ends a connection on an error: the side that reported it (bad, or -1 for neither) is
 * closed, the other reset, so that an aborted relay never looks like a clean end. */
static void abort_conn(struct corral_relay *r, struct conn *c, int bad, int err)
{
    for (int i = 0; i < 2; i++)
        drop_fd(r, &c->fd[i], i != bad);
    finish(r, c, c->state == CONNECTING ? CORRAL_RELAY_FAILED : CORRAL_RELAY_CLOSED, err);
}

static void touch(struct corral_relay *r, struct conn *c)
{
    c->last_ms = r->now_ms;
}

static int pump_dir(struct corral_relay *r, struct conn *c, int i, bool *progress, int *bad)
{
    struct dir *d = &c->d[i];
    int src = c->fd[i], dst = c->fd[1 - i];
    bool open = c->state == OPEN;
    if (!open && i == 1) return 0;
    if (i == 0 && c->held) return 0; /* the client's bytes wait in its socket, unread */

    while (open && d->queued && c->wr[1 - i]) {
        ssize_t n =
            splice(d->pipe[0], NULL, dst, NULL, d->queued, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n > 0) {
            d->queued -= (size_t)n;
            d->bytes += (uint64_t)n;
            touch(r, c);
            *progress = true;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            c->wr[1 - i] = false;
        } else {
            *bad = 1 - i;
            return n < 0 ? -errno : -EIO;
        }
    }

    while (!d->eof && c->rd[i] && (d->pipe[0] < 0 || d->queued < d->cap)) {
        if (d->pipe[0] < 0) {
            if (pipe2(d->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
                *bad = -1;
                return -errno;
            }
            int sz = fcntl(d->pipe[1], F_SETPIPE_SZ, (int)r->pipe_bytes);
            if (sz < 0) sz = fcntl(d->pipe[1], F_GETPIPE_SZ);
            d->cap = sz > 0 ? (size_t)sz : 65536;
        }
        ssize_t n = splice(src, NULL, d->pipe[1], NULL, d->cap - d->queued,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n > 0) {
            d->queued += (size_t)n;
            touch(r, c);
            *progress = true;
        } else if (n == 0) {
            d->eof = true;
            *progress = true;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN) {
            /* With bytes queued, EAGAIN may mean the pipe ran out of slots (each holds a
             * fragment of an skb, not a full page), not that the socket is empty: keep
             * rd set and read again once the pipe has drained. */
            if (!d->queued) c->rd[i] = false;
            break;
        } else {
            *bad = i;
            return -errno;
        }
    }

    if (open && d->eof && !d->queued && !d->shut) {
        if (shutdown(dst, SHUT_WR) < 0 && errno != ENOTCONN) {
            *bad = 1 - i;
            return -errno;
        }
        d->shut = true;
        *progress = true;
    }
    return 0;
}

static bool pump_turns(struct corral_relay *r, struct conn *c);

/* splice takes no MSG_NOSIGNAL: a splice into a socket whose peer has closed and reset
 * (a server ending a test the way iperf3's does) fails with EPIPE and raises SIGPIPE,
 * which would end the host and every sandbox it relays for. The pumping runs under
 * corral_sigpipe_hold, and the connection ends as any reset one does
 * (tests/c/test_relay.c, test_epipe_survived). */
static void pump(struct corral_relay *r, struct conn *c)
{
    struct corral_sigpipe_guard g;
    corral_sigpipe_hold(&g);
    corral_sigpipe_release(&g, pump_turns(r, c));
}

/* Pumps c until it makes no progress or its turns run out; true when a write met EPIPE. */
static bool pump_turns(struct corral_relay *r, struct conn *c)
{
    for (int turn = 0;; turn++) {
        if (turn == TURN_BUDGET) {
            if (!c->in_ready) {
                c->in_ready = true;
                c->ready_next = r->ready;
                r->ready = c;
            }
            return false;
        }
        bool progress = false;
        for (int i = 0; i < 2; i++) {
            int bad = -1;
            int err = pump_dir(r, c, i, &progress, &bad);
            if (err < 0) {
                abort_conn(r, c, bad, -err);
                return err == -EPIPE;
            }
        }
        if (!progress) break;
    }
    if (c->state == OPEN && c->d[0].shut && c->d[1].shut) {
        drop_fd(r, &c->fd[0], false);
        drop_fd(r, &c->fd[1], false);
        finish(r, c, CORRAL_RELAY_CLOSED, 0);
    }
    return false;
}

static void opened(struct corral_relay *r, struct conn *c)
{
    c->state = OPEN;
    c->rd[1] = c->wr[1] = true;
    c->connect_deadline = 0;
    touch(r, c);
    push_event(r, c, CORRAL_RELAY_CONNECTED, 0);
    arm_for(r, c);
}

/* The TCP connect is done: the relay opens, or, with a preface, the proxy is asked
 * first. Returns whether c is still live. */
static bool connected(struct corral_relay *r, struct conn *c)
{
    if (!c->preface) {
        opened(r, c);
        return true;
    }
    size_t n = strlen(c->preface);
    c->proxying = true;
    if (send(c->fd[1], c->preface, n, MSG_NOSIGNAL) != (ssize_t)n) {
        abort_conn(r, c, 1, errno ? errno : EPROTO);
        return false;
    }
    return true;
}

/* The proxy's answer to the preface, once its head is whole: a 2xx opens the relay (what
 * follows the head is the tunnel's), anything else fails the connect. */
static void proxy_answer(struct corral_relay *r, struct conn *c)
{
    char head[4096];
    ssize_t n = recv(c->fd[1], head, sizeof head - 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        abort_conn(r, c, 1, n == 0 ? ECONNRESET : errno);
        return;
    }
    head[n] = '\0';
    char *end = strstr(head, "\r\n\r\n");
    if (!end) {
        if (n == sizeof head - 1) abort_conn(r, c, -1, EPROTO);
        return;
    }
    int major, minor, status;
    if (sscanf(head, "HTTP/%d.%d %d", &major, &minor, &status) != 3) status = 0;
    if (status < 200 || status > 299) {
        abort_conn(r, c, -1, status == 407 ? EACCES : status ? ECONNREFUSED : EPROTO);
        return;
    }
    size_t len = (size_t)(end + 4 - head);
    if (recv(c->fd[1], head, len, 0) != (ssize_t)len) {
        abort_conn(r, c, 1, EPROTO);
        return;
    }
    free(c->preface);
    c->preface = NULL;
    c->proxying = false;
    opened(r, c);
    pump(r, c);
}

static int prepare(int fd);

/* A shortage on this host, not an answer from the address: it must not be reported as
 * the upstream's refusal or silence. */
static bool local_shortage(int err)
{
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/* Why a race failed: a shortage here that kept an address from being tried says more
 * than the answers of the addresses that were. */
static int race_error(const struct conn *c, int err)
{
    return c->race && c->race->local_err ? c->race->local_err : err;
}

/* Starts the next attempt of c's race; an address whose socket cannot even be made is
 * skipped (its error kept). Ends c as FAILED when nothing is left in flight or to try. */
static void race_next(struct corral_relay *r, struct conn *c)
{
    struct race *x = c->race;
    while (x->next < x->n) {
        size_t i = x->next++;
        const struct sockaddr *sa = (const struct sockaddr *)&x->addr[i];
        socklen_t len =
            sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        int in_progress;
        int fd = corral_connect_marked_start(sa, len, x->mark, x->netns_fd, x->port_key,
                                             &in_progress, NULL);
        if (fd < 0) {
            x->last_err = -fd;
            if (local_shortage(-fd)) x->local_err = -fd;
            continue;
        }
        struct epoll_event ev = {.events = EPOLLOUT | EPOLLET,
                                 .data.u64 = (uint64_t)(uintptr_t)c | (uint64_t)(2 + i)};
        int err = prepare(fd);
        if (!err && epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) err = -errno;
        if (err) {
            x->last_err = -err;
            if (local_shortage(-err)) x->local_err = -err;
            corral_reset(fd);
            continue;
        }
        x->fd[i] = fd;
        x->flying++;
        x->next_ms = x->next < x->n ? r->now_ms + x->delay_ms : 0;
        arm_for(r, c);
        return;
    }
    x->next_ms = 0;
    if (!x->flying) abort_conn(r, c, -1, race_error(c, x->last_err ? x->last_err : ECONNREFUSED));
}

/* An event on attempt i of c's race: a failure starts the next attempt when none is
 * left in flight; the first to connect becomes the upstream (side 1). */
static void race_event(struct corral_relay *r, struct conn *c, size_t i, uint32_t ev)
{
    struct race *x = c->race;
    if (!x || i >= x->n || x->fd[i] < 0) return; /* an attempt already closed */
    int err = sock_error(x->fd[i]);
    if (!err && !(ev & EPOLLOUT)) return;
    if (err || (ev & EPOLLHUP)) {
        x->last_err = err ? err : ECONNRESET;
        drop_fd(r, &x->fd[i], false);
        x->flying--;
        if (!x->flying) race_next(r, c);
        return;
    }
    int fd = x->fd[i];
    x->fd[i] = -1;
    x->flying--;
    struct epoll_event mod = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                              .data.u64 = (uint64_t)(uintptr_t)c | 1u};
    if (epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &mod) < 0) {
        x->last_err = errno;
        corral_reset(fd);
        if (!x->flying) race_next(r, c);
        return;
    }
    c->fd[1] = fd;
    c->winner = (int)i;
    race_free(r, c);
    if (connected(r, c)) pump(r, c);
}

static void handle(struct corral_relay *r, struct conn *c, int side, uint32_t ev)
{
    if (c->dead) return;
    if (side >= 2) {
        race_event(r, c, (size_t)side - 2, ev);
        return;
    }
    if (ev & EPOLLERR) {
        int err = sock_error(c->fd[side]);
        if (err) {
            abort_conn(r, c, side, err);
            return;
        }
    }
    if (c->state == CONNECTING && side == 1 && c->proxying) {
        proxy_answer(r, c);
        return;
    }
    if (c->state == CONNECTING && side == 1) {
        if (!(ev & EPOLLOUT) || !connected(r, c)) return;
    }
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) c->rd[side] = true;
    if (ev & (EPOLLOUT | EPOLLHUP)) c->wr[side] = true;
    if (side == 0 && c->held && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))) {
        if (ev & (EPOLLRDHUP | EPOLLHUP)) c->a_ended = true;
        if (!c->held_queued) {
            c->held_queued = true;
            push_event(r, c, CORRAL_RELAY_HELD, 0);
        }
    }
    pump(r, c);
}

static void sweep(struct corral_relay *r)
{
    int64_t next = 0;
    struct conn *c = r->conns;
    while (c) {
        struct conn *after = c->next;
        int64_t dl = deadline(c);
        if (dl && dl <= r->now_ms && dl == race_due(c) &&
            (!c->connect_deadline || dl < c->connect_deadline)) {
            race_next(r, c); /* the head start is over: the next address joins */
            dl = c->dead ? 0 : deadline(c);
            if (dl && (!next || dl < next)) next = dl;
        } else if (dl && dl <= r->now_ms) {
            /* Both reset on an idle timeout too: a peer must not take a cut stream for a
             * complete one. */
            abort_conn(r, c, -1, race_error(c, ETIMEDOUT));
        } else if (dl && (!next || dl < next)) {
            next = dl;
        }
        c = after;
    }
    if (next) {
        arm(r, next);
    } else if (r->armed_ms) {
        struct itimerspec off = {{0, 0}, {0, 0}};
        timerfd_settime(r->timerfd, 0, &off, NULL);
        r->armed_ms = 0;
    }
}

int corral_relay_new(struct corral_relay **out)
{
    struct corral_relay *r = calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    r->epfd = r->timerfd = r->notifyfd = -1;
    r->next_id = 1;
    r->pipe_bytes = PIPE_BYTES;
    int err = 0;
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (r->epfd < 0) goto fail;
    r->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (r->timerfd < 0) goto fail;
    r->notifyfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->notifyfd < 0) goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_TIMER};
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->timerfd, &ev) < 0) goto fail;
    ev.data.u64 = TAG_NOTIFY;
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->notifyfd, &ev) < 0) goto fail;
    *out = r;
    return 0;
fail:
    err = -errno;
    corral_relay_free(r);
    return err;
}

static void free_list(struct conn *c)
{
    while (c) {
        struct conn *next = c->next;
        free(c->preface);
        free(c);
        c = next;
    }
}

void corral_relay_free(struct corral_relay *r)
{
    if (!r) return;
    for (struct conn *c = r->conns; c; c = c->next) {
        for (int i = 0; i < 2; i++)
            if (c->fd[i] >= 0) corral_reset(c->fd[i]);
        race_free(r, c);
        close_pipes(c);
    }
    free_list(r->conns);
    free_list(r->graveyard);
    for (int i = 0; i < KEY_BUCKETS; i++) {
        struct key_entry *e = r->keys[i];
        while (e) {
            struct key_entry *next = e->next;
            free(e);
            e = next;
        }
    }
    if (r->epfd >= 0) close(r->epfd);
    if (r->timerfd >= 0) close(r->timerfd);
    if (r->notifyfd >= 0) close(r->notifyfd);
    free(r->q);
    free(r);
}

int corral_relay_fd(const struct corral_relay *r)
{
    return r ? r->epfd : -EINVAL;
}

static int prepare(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -errno;
    /* The loop forwards each chunk as it arrives; with Nagle on its side, the second
     * small write of a request would wait for the ACK of the first, which the server
     * delays until it answers: a 40 ms stall added to an exchange the ends made without
     * one. (Not a TCP socket: ignored.) */
    int one = 1, idle = KEEPIDLE, intvl = KEEPINTVL, cnt = KEEPCNT;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    return 0;
}

static int key_admits(const struct corral_relay *r, const struct corral_relay_opts *o)
{
    if (!o || !o->key || o->max_per_key <= 0) return 0;
    const struct key_entry *e = key_find(r, o->key);
    return e && e->count >= (size_t)o->max_per_key ? -EUSERS : 0;
}

static int add(struct corral_relay *r, int a, int b, enum state state, int connect_timeout_ms,
               const struct corral_relay_opts *o, struct race *race, uint64_t *id)
{
    int err;
    struct conn *c = NULL;
    struct key_entry *k = NULL;
    if (!r || a < 0 || (b < 0 && !race) || a == b) {
        err = -EINVAL;
        goto fail;
    }
    if (o && (o->idle_ms < 0 || o->max_per_key < 0 || (o->max_per_key && !o->key))) {
        err = -EINVAL;
        goto fail;
    }
    if ((err = key_admits(r, o)) < 0) goto fail;
    if ((err = prepare(a)) < 0 || (b >= 0 && (err = prepare(b)) < 0)) goto fail;
    if ((err = reserve_events(r)) < 0) goto fail;
    c = calloc(1, sizeof *c);
    if (!c) {
        err = -ENOMEM;
        goto fail;
    }
    if (o && o->key) {
        k = key_find(r, o->key);
        if (!k) {
            size_t n = strlen(o->key);
            k = calloc(1, sizeof *k + n + 1);
            if (!k) {
                err = -ENOMEM;
                goto fail;
            }
            memcpy(k->name, o->key, n + 1);
            unsigned h = key_hash(o->key);
            k->next = r->keys[h];
            r->keys[h] = k;
        }
        k->count++;
    }
    r->now_ms = mono_ms();
    c->id = r->next_id++;
    c->fd[0] = a;
    c->fd[1] = b;
    for (int i = 0; i < 2; i++)
        c->d[i].pipe[0] = c->d[i].pipe[1] = -1;
    c->state = state;
    c->held = o && o->hold_a;
    c->idle_ms = o ? o->idle_ms : 0;
    c->last_ms = r->now_ms;
    c->connect_deadline =
        state == CONNECTING && connect_timeout_ms > 0 ? r->now_ms + connect_timeout_ms : 0;
    c->key = k;
    if (o && o->preface && !(c->preface = strdup(o->preface))) {
        err = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < 2; i++) {
        if (c->fd[i] < 0) continue;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.u64 = (uint64_t)(uintptr_t)c | (uint64_t)i};
        if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, c->fd[i], &ev) < 0) {
            err = -errno;
            goto fail;
        }
    }
    c->next = r->conns;
    if (r->conns) r->conns->prev = c;
    r->conns = c;
    r->live++;
    if (id) *id = c->id;
    if (race) {
        c->race = race;
        race_next(r, c); /* a failure here is a FAILED event, as for any connect */
    } else {
        arm_for(r, c);
    }
    return 0;

fail:
    if (c) {
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, a, NULL);
        if (b >= 0) epoll_ctl(r->epfd, EPOLL_CTL_DEL, b, NULL);
        free(c->preface);
        free(c);
    }
    if (k) key_release(r, k);
    if (a >= 0) corral_reset(a);
    if (b >= 0 && b != a) corral_reset(b);
    return err;
}

int corral_relay_add_pair(struct corral_relay *r, int a, int b,
                          const struct corral_relay_opts *opts, uint64_t *id)
{
    return add(r, a, b, OPEN, 0, opts, NULL, id);
}

int corral_relay_add_connecting(struct corral_relay *r, int client_fd, int upstream_fd,
                                int connect_timeout_ms, const struct corral_relay_opts *opts,
                                uint64_t *id)
{
    /* Registering a socket whose connect already finished reports EPOLLOUT at once, so
     * one path serves both. */
    return add(r, client_fd, upstream_fd, CONNECTING, connect_timeout_ms, opts, NULL, id);
}

int corral_relay_add_connect(struct corral_relay *r, int client_fd, const struct sockaddr *upstream,
                             socklen_t len, uint32_t mark, int connect_timeout_ms,
                             const struct corral_relay_opts *opts, uint64_t *id)
{
    int err = r ? key_admits(r, opts) : -EINVAL;
    if (err < 0) {
        if (client_fd >= 0) corral_reset(client_fd);
        return err;
    }
    int in_progress;
    int up = corral_connect_marked_start(upstream, len, mark, -1, opts ? opts->key : NULL,
                                         &in_progress, NULL);
    if (up < 0) {
        if (client_fd >= 0) corral_reset(client_fd);
        return up;
    }
    return add(r, client_fd, up, CONNECTING, connect_timeout_ms, opts, NULL, id);
}

int corral_relay_add_race(struct corral_relay *r, int client_fd,
                          const struct corral_relay_race *how, const struct corral_relay_opts *opts,
                          uint64_t *id)
{
    int err = r && how && how->n >= 1 && how->n <= CORRAL_RELAY_RACE_MAX && how->addrs &&
                      how->attempt_delay_ms >= 0
                  ? key_admits(r, opts)
                  : -EINVAL;
    struct race *x = NULL;
    if (!err && !(x = calloc(1, sizeof *x))) err = -ENOMEM;
    if (!err) {
        x->netns_fd = -1;
        for (size_t i = 0; i < how->n; i++) {
            int fam = how->addrs[i].ss_family;
            if (fam != AF_INET && fam != AF_INET6) err = -EAFNOSUPPORT;
            x->addr[i] = how->addrs[i];
            x->fd[i] = -1;
        }
        x->n = how->n;
        x->delay_ms = how->attempt_delay_ms;
        x->mark = how->mark;
    }
    if (!err && how->netns_fd >= 0 && (x->netns_fd = fcntl(how->netns_fd, F_DUPFD_CLOEXEC, 0)) < 0)
        err = -errno;
    const char *pk = how && how->port_key ? how->port_key : opts ? opts->key : NULL;
    if (!err && pk && !(x->port_key = strdup(pk))) err = -ENOMEM;
    if (err) {
        if (x) {
            if (x->netns_fd >= 0) close(x->netns_fd);
            free(x->port_key);
            free(x);
        }
        if (client_fd >= 0) corral_reset(client_fd);
        return err;
    }
    err = add(r, client_fd, -1, CONNECTING, how->connect_timeout_ms, opts, x, id);
    if (err < 0) {
        if (x->netns_fd >= 0) close(x->netns_fd);
        free(x->port_key);
        free(x);
    }
    return err;
}

static void dispatch(struct corral_relay *r, const struct epoll_event *ev)
{
    uint64_t tag = ev->data.u64;
    if (tag == TAG_TIMER) {
        uint64_t ticks;
        ssize_t got = read(r->timerfd, &ticks, sizeof ticks); /* EAGAIN: already read */
        (void)got;
        r->armed_ms = 0;
        sweep(r);
        return;
    }
    if (tag == TAG_NOTIFY) return;
    handle(r, (struct conn *)(uintptr_t)(tag & ~(uint64_t)15), (int)(tag & 15), ev->events);
}

static void notify(struct corral_relay *r)
{
    bool pending = r->qlen || r->ready;
    uint64_t v = 1;
    if (pending && !r->notified) {
        if (write(r->notifyfd, &v, sizeof v) == sizeof v) r->notified = true;
    } else if (!pending && r->notified) {
        if (read(r->notifyfd, &v, sizeof v) == sizeof v) r->notified = false;
    }
}

int corral_relay_run(struct corral_relay *r, int timeout_ms, struct corral_relay_event *events,
                     size_t max)
{
    if (!r || (max && !events)) return -EINVAL;
    struct epoll_event evs[BATCH];
    int wait = r->qlen || r->ready ? 0 : timeout_ms;
    int n = epoll_wait(r->epfd, evs, BATCH, wait);
    if (n < 0) {
        if (errno != EINTR) return -errno;
        n = 0;
    }
    r->now_ms = mono_ms();
    for (int i = 0; i < n; i++)
        dispatch(r, &evs[i]);

    struct conn *ready = r->ready;
    r->ready = NULL;
    while (ready) {
        struct conn *c = ready;
        ready = c->ready_next;
        c->in_ready = false;
        if (!c->dead) pump(r, c);
    }
    /* A deadline can pass while connections keep the loop busy; the timer is level-
     * triggered, but a loop that never waits would not see it before the next batch. */
    if (r->armed_ms && r->armed_ms <= r->now_ms) {
        r->armed_ms = 0;
        sweep(r);
    }

    free_list(r->graveyard);
    r->graveyard = NULL;

    size_t k = r->qlen < max ? r->qlen : max;
    if (k) memcpy(events, r->q + r->qhead, k * sizeof *events);
    r->qhead += k;
    r->qlen -= k;
    if (!r->qlen) r->qhead = 0;
    notify(r);
    return (int)k;
}

int corral_relay_poll(struct corral_relay *r, struct pollfd *pfd, size_t n, int timeout_ms)
{
    if (!r || (n && !pfd)) return -EINVAL;
    int64_t until = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
    size_t self = n;
    for (size_t i = 0; i < n; i++) {
        pfd[i].events = POLLIN;
        if (pfd[i].fd == r->epfd) self = i;
    }
    for (;;) {
        int wait = -1;
        if (until >= 0) {
            int64_t left = until - mono_ms();
            wait = left > 0 ? (int)left : 0;
        }
        int k = poll(pfd, (nfds_t)n, wait);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -errno;
        if (k != 1 || self == n || !pfd[self].revents || r->qlen) return k;
        int err = corral_relay_run(r, 0, NULL, 0); /* events stay queued for the caller */
        if (err < 0) return err;
        if (r->qlen) return 1;
        pfd[self].revents = 0;
        if (until >= 0 && mono_ms() >= until) return 0;
    }
}

int corral_relay_reset(struct corral_relay *r, uint64_t id)
{
    if (!r) return -EINVAL;
    for (struct conn *c = r->conns; c; c = c->next) {
        if (c->id != id || c->dead) continue;
        /* Both sides reset, so neither end mistakes a cut for a finished exchange. */
        abort_conn(r, c, -1, ECONNABORTED);
        notify(r);
        return 0;
    }
    return -ENOENT;
}

static struct conn *live_conn(struct corral_relay *r, uint64_t id)
{
    for (struct conn *c = r->conns; c; c = c->next)
        if (c->id == id && !c->dead) return c;
    return NULL;
}

ssize_t corral_relay_peek(struct corral_relay *r, uint64_t id, void *buf, size_t max, int *ended)
{
    if (!r || (max && !buf)) return -EINVAL;
    struct conn *c = live_conn(r, id);
    if (!c) return -ENOENT;
    if (!c->held) return -EINVAL;
    c->held_queued = false;
    if (ended) *ended = c->a_ended;
    ssize_t n;
    do
        n = recv(c->fd[0], buf, max, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

int corral_relay_release(struct corral_relay *r, uint64_t id)
{
    if (!r) return -EINVAL;
    struct conn *c = live_conn(r, id);
    if (!c) return -ENOENT;
    if (!c->held) return 0;
    c->held = false;
    /* rd[0] kept what epoll last said of the client: its bytes are read from here */
    pump(r, c);
    notify(r);
    return 0;
}

int corral_relay_timer_ms(const struct corral_relay *r, int64_t *ms)
{
    if (!r || !ms) return -EINVAL;
    struct itimerspec its;
    if (timerfd_gettime(r->timerfd, &its) < 0) return -errno;
    *ms = (int64_t)its.it_value.tv_sec * 1000 + (its.it_value.tv_nsec + 999999) / 1000000;
    return 0;
}

size_t corral_relay_count(const struct corral_relay *r, const char *key)
{
    if (!r) return 0;
    if (!key) return r->live;
    const struct key_entry *e = key_find(r, key);
    return e ? e->count : 0;
}
