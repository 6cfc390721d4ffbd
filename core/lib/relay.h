/*
 * The egress relay: one epoll loop per host process that copies bytes both ways
 * between pairs of connected TCP sockets (the tenant's accepted connection and its
 * upstream), with half-close, reset propagation, idle and connect timeouts, bounded
 * buffers and per-key connection caps.
 *
 * Each direction moves through a pipe with splice(2), so payload pages go from one
 * socket to the other without a copy through user space, and the pipe's capacity is the
 * only buffer: while it is full the loop stops reading that side. The pipes are made on
 * the first byte of each direction, so an idle connection holds only its two sockets.
 *
 * The loop never calls back: corral_relay_run returns what happened as events, and the
 * caller (Lua) acts on them afterwards. corral_relay_fd is an epoll fd that is readable
 * whenever run has work to do, so the loop nests inside any other event loop.
 *
 * Ownership: every add verb takes its sockets whatever it returns. On a failure it
 * resets them (SO_LINGER 0), so a tenant sees the same immediate reset as a deny.
 */
#ifndef CORRAL_RELAY_H
#define CORRAL_RELAY_H

#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

struct corral_relay;

struct corral_relay_opts {
    int idle_ms;         /* 0: none; else both sockets closed after this long with no byte */
    const char *key;     /* NULL: none; else counted under this key (e.g. a sandbox id) */
    int max_per_key;     /* 0: no cap; else an add that would exceed it fails -EUSERS
                          * (a cap needs a key: -EINVAL without one) */
    const char *preface; /* NULL: none; else written upstream once connected (an HTTP
                          * proxy's CONNECT request, copied), and the relay opens only
                          * on the proxy's 2xx answer, its head consumed; any other
                          * answer fails the connect (EACCES for 407, ECONNREFUSED for
                          * another status, EPROTO for no HTTP), within its timeout */
    int hold_a;          /* nonzero: nothing is read from a (the client) until
                          * corral_relay_release; b to a flows meanwhile, and run reports HELD
                          * whenever a has new bytes (or its end) for the caller to peek */
};

enum corral_relay_kind {
    CORRAL_RELAY_CONNECTED = 1, /* an add_connect's upstream connected; now a pair */
    CORRAL_RELAY_CLOSED,        /* a pair ended; err 0 for a clean end both ways */
    CORRAL_RELAY_FAILED,        /* an add_connect never connected; the client was reset */
    CORRAL_RELAY_HELD,          /* a held client (hold_a) has new bytes, or ended: peek them;
                                 * reported once, then again only after a peek */
};

struct corral_relay_event {
    uint64_t id;
    int kind; /* enum corral_relay_kind */
    /* Positive errno: CLOSED: 0 (both directions ended), ETIMEDOUT (idle), or the error
     * one side reported (ECONNRESET, EPIPE, …; the other side was then reset).
     * FAILED: the connect error (ECONNREFUSED, ETIMEDOUT for the connect timeout, …). */
    int err;
    uint64_t bytes_a_to_b; /* delivered from a (the client) to b (upstream) */
    uint64_t bytes_b_to_a;
    int addr_index; /* add_race: the address that connected (0 otherwise) */
};

/* A new, empty loop. Returns 0 or -errno. */
int corral_relay_new(struct corral_relay **out);

/* Resets every connection the loop holds and closes every fd it owns. NULL is a no-op. */
void corral_relay_free(struct corral_relay *r);

/* The epoll fd: readable when corral_relay_run has work (I/O, a timer, queued events). */
int corral_relay_fd(const struct corral_relay *r);

/*
 * Relays between two connected sockets a (client side) and b (upstream side); both
 * become non-blocking and the loop's. *id (may be NULL) receives the connection's id.
 * Returns 0 or -errno: -EUSERS when opts->key already has max_per_key connections
 * (chosen over -EMFILE, which a real fd shortage also returns), -EINVAL, -ENOMEM, or
 * what epoll_ctl reports. opts may be NULL.
 */
int corral_relay_add_pair(struct corral_relay *r, int a, int b,
                          const struct corral_relay_opts *opts, uint64_t *id);

/*
 * Connects to upstream (a TCP socket made here, non-blocking, with SO_MARK mark set and
 * read back when mark is not 0) and relays client_fd to it once connected: run reports
 * CONNECTED, then CLOSED; or FAILED (and client_fd reset) when the connect fails or
 * takes longer than connect_timeout_ms (0: no limit). Bytes the client sends meanwhile
 * wait in the pipe. Returns 0 or -errno for what fails before the connect is under way
 * (socket, mark: -EPERM or -EPROTO, -EUSERS as above); a refused connect is a FAILED
 * event, not a return value.
 */
int corral_relay_add_connect(struct corral_relay *r, int client_fd, const struct sockaddr *upstream,
                             socklen_t len, uint32_t mark, int connect_timeout_ms,
                             const struct corral_relay_opts *opts, uint64_t *id);

/*
 * As add_connect with an upstream socket the caller made: upstream_fd is a TCP socket
 * whose non-blocking connect has been started (corral_connect_marked_start, e.g. in
 * another netns) or has completed.
 */
int corral_relay_add_connecting(struct corral_relay *r, int client_fd, int upstream_fd,
                                int connect_timeout_ms, const struct corral_relay_opts *opts,
                                uint64_t *id);

/* The most addresses one add_race tries (and the epoll tag's room: 2 + index < 16). */
#define CORRAL_RELAY_RACE_MAX 12

struct corral_relay_race {
    const struct sockaddr_storage *addrs; /* AF_INET / AF_INET6, port set, in try order */
    size_t n;                             /* 1 .. CORRAL_RELAY_RACE_MAX */
    uint32_t mark;                        /* 0: none (else set and read back) */
    int netns_fd;                         /* upstream made in this netns; -1: here */
    const char *port_key;                 /* source-port slice key; NULL: opts->key */
    int connect_timeout_ms;               /* for the whole race; 0: no limit */
    int attempt_delay_ms;                 /* head start of each attempt over the next */
};

/*
 * Connects client_fd's upstream by racing addresses, as RFC 8305 ("Happy Eyeballs")
 * asks: addrs[0] first; addrs[i + 1] after attempt_delay_ms, or at once when every
 * attempt in flight has failed; the first to connect is relayed (CONNECTED, with its
 * addr_index) and the others are closed. FAILED (the client reset) carries the last
 * attempt's error once all have failed, ETIMEDOUT when connect_timeout_ms passes first.
 * The caller orders addrs (IPv6 first, families interleaved); netns_fd is duplicated and
 * port_key copied, so neither need outlive the call. Returns 0 or -errno (-EINVAL,
 * -EAFNOSUPPORT, -ENOMEM, -EUSERS as add_pair).
 */
int corral_relay_add_race(struct corral_relay *r, int client_fd,
                          const struct corral_relay_race *how, const struct corral_relay_opts *opts,
                          uint64_t *id);

/*
 * Waits up to timeout_ms (-1: no limit, 0: poll) for work, does it, and copies up to max
 * events into events. Events that do not fit stay queued for the next call (which then
 * does not wait). Returns the number of events copied, or -errno.
 */
int corral_relay_run(struct corral_relay *r, int timeout_ms, struct corral_relay_event *events,
                     size_t max);

/*
 * Polls n fds for input (pfd's events are set to POLLIN; one of them may be the relay's
 * own fd) and, while the relay's fd is the only one ready and no event is queued for the
 * caller, does the relay's work (as corral_relay_run without taking events) and polls
 * again, up to timeout_ms in all (-1: no limit). The bytes of a relayed exchange thus
 * cross without a turn of the caller's loop, which is woken only for what it must see:
 * one of its own fds, an event, the end of the wait. Sets each revents; returns how many
 * are ready (the relay's fd among them when events are queued; 0 at the end of the
 * wait), or -errno.
 */
int corral_relay_poll(struct corral_relay *r, struct pollfd *pfd, size_t n, int timeout_ms);

/*
 * Resets the live connection id on both sides (RST), as an operator's cut: the run then
 * reports it CLOSED (FAILED while it was connecting) with err ECONNABORTED and the bytes
 * it had moved. Returns 0, or -ENOENT when no live connection has that id.
 */
int corral_relay_reset(struct corral_relay *r, uint64_t id);

/*
 * What the held client of connection id has sent, not consumed (MSG_PEEK): up to max
 * bytes into buf. Returns the count (0: nothing but its end), or -EAGAIN (nothing yet),
 * -ENOENT (no live connection id), -EINVAL (not held). *ended (may be NULL) is set when
 * the client has shut down its sending side, so no more will come. Rearms HELD.
 */
ssize_t corral_relay_peek(struct corral_relay *r, uint64_t id, void *buf, size_t max, int *ended);

/*
 * Lets connection id's client bytes through (the end of hold_a): they are relayed from
 * the first one, as if never held. Returns 0 (also when it was not held), or -ENOENT.
 */
int corral_relay_release(struct corral_relay *r, uint64_t id);

/*
 * Milliseconds until the loop's timer (idle limits, connect timeouts, the next raced
 * address) fires, as the kernel holds it; 0 when it is disarmed. Returns 0 or -errno.
 */
int corral_relay_timer_ms(const struct corral_relay *r, int64_t *ms);

/* Live connections (connecting or relaying): all of them when key is NULL, else those
 * counted under key. */
size_t corral_relay_count(const struct corral_relay *r, const char *key);

#endif
