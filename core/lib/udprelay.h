/*
 * The UDP relay of one sandbox: the datagrams its ruleset hands over by TPROXY (nft.h,
 * udp_port), grouped into flows, each decided once by the caller and then relayed to a
 * connected upstream socket on the host, with the replies sent back to the tenant from
 * the address and port it wrote to.
 *
 * One IP_TRANSPARENT socket in the sandbox's netns (dual stack) receives every datagram
 * with its original destination (IP_ORIGDSTADDR / IPV6_ORIGDSTADDR: TPROXY, unlike a
 * redirect, leaves the destination as the tenant wrote it). A flow is (tenant source
 * address and port, original destination and port). The first datagram of a new flow is
 * reported (NEW) and held, with the few that follow it, until the caller allows or denies
 * the flow; an allowed flow's datagrams go to its upstream socket as they come, and what
 * the upstream answers goes back through a socket bound (IP_TRANSPARENT) to the flow's
 * original destination inside the netns, shared by every flow to that destination and
 * marked (SO_MARK, read back) so the ruleset exempts it. A denied flow is remembered, so
 * that its later datagrams are dropped and counted without waking the caller.
 *
 * Each flow ends after idle_ms without a datagram either way (END), or when cut. The
 * table holds at most max_entries flows of every state; a datagram of a new flow beyond
 * that is dropped and counted (OVERFLOW).
 *
 * The relay never calls back: corral_udprelay_run returns events and the caller acts on
 * them afterwards; corral_udprelay_fd is an epoll fd, readable when run has datagrams to
 * move. Every fd is CLOEXEC and owned by the relay.
 */
#ifndef CORRAL_UDPRELAY_H
#define CORRAL_UDPRELAY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct corral_udprelay;

struct corral_udprelay_opts {
    int netns_fd;       /* the sandbox's netns: the listener and reply sockets live there */
    uint32_t mark;      /* SO_MARK of the reply sockets (set and read back); not 0 */
    size_t max_entries; /* flows of every state the table holds; 0: 4096 */
    /* Upstream sockets are made in upstream_netns_fd with upstream_mark (a sandbox with
     * its own link), or, with -1, in the caller's netns without a mark. */
    int upstream_netns_fd;
    uint32_t upstream_mark;
};

enum corral_udprelay_kind {
    CORRAL_UDPRELAY_NEW = 1, /* a flow's first datagram: allow or deny it */
    CORRAL_UDPRELAY_END,     /* a flow ended (why, its counts) */
    CORRAL_UDPRELAY_OVERFLOW /* datagrams dropped because the table was full (dropped) */
};

enum corral_udprelay_why {
    CORRAL_UDPRELAY_IDLE = 1, /* idle_ms without a datagram either way */
    CORRAL_UDPRELAY_CUT,      /* corral_udprelay_cut */
    CORRAL_UDPRELAY_CLOSED,   /* corral_udprelay_shutdown */
};

struct corral_udprelay_event {
    int kind; /* enum corral_udprelay_kind */
    uint64_t id;
    struct sockaddr_storage src, dst; /* the tenant's address and the original destination */
    int why;                          /* END: enum corral_udprelay_why */
    int allowed;                      /* END: whether the flow had been allowed */
    uint64_t bytes_up, bytes_down;    /* payload relayed each way */
    uint64_t sent, received;          /* datagrams relayed each way */
    uint64_t dropped;                 /* datagrams not relayed (denied, queue or table full) */
    int err;                          /* END: the last error on the upstream socket (errno) */
    size_t size;                      /* NEW: the first datagram's length */
};

/*
 * A new relay for the netns opts->netns_fd: its listener is bound there on a port the
 * kernel chooses (*port, for the ruleset). The netns fds are duplicated. Returns 0 or
 * -errno (-EPERM without CAP_NET_ADMIN or CAP_NET_RAW over that netns for IP_TRANSPARENT).
 */
int corral_udprelay_new(const struct corral_udprelay_opts *opts, struct corral_udprelay **out,
                        uint16_t *port);

/* Closes every socket the relay holds and frees it. NULL is a no-op. */
void corral_udprelay_free(struct corral_udprelay *r);

/* The epoll fd: readable when run has datagrams to move. */
int corral_udprelay_fd(const struct corral_udprelay *r);

/*
 * Moves what is ready without waiting, ends the flows idle past their limit, and copies
 * up to max events out. Events that do not fit stay queued for the next call. Returns
 * the number copied, or -errno.
 */
int corral_udprelay_run(struct corral_udprelay *r, struct corral_udprelay_event *events,
                        size_t max);

/*
 * Allows the new flow id: connects an upstream socket to addrs[0], or to the next
 * address when one fails at once (no route, no such family), sends it the datagrams
 * held so far, and relays from then on; *used is the index of the address connected.
 * The flow ends after idle_ms (> 0) without a datagram. Returns 0 or -errno (-ENOENT:
 * no new flow has that id; the connect or reply socket's error: the flow stays new, to
 * be denied).
 */
int corral_udprelay_allow(struct corral_udprelay *r, uint64_t id,
                          const struct sockaddr_storage *addrs, size_t n, int idle_ms,
                          size_t *used);

/* Denies the new flow id: what it held is dropped, and so is every later datagram until
 * idle_ms pass without one. Returns 0 or -ENOENT. */
int corral_udprelay_deny(struct corral_udprelay *r, uint64_t id, int idle_ms);

/* Ends the flow id now (END, CUT). Returns 0 or -ENOENT. */
int corral_udprelay_cut(struct corral_udprelay *r, uint64_t id);

/* Ends every flow (END, CLOSED) and closes the listener: the next run reports them. */
void corral_udprelay_shutdown(struct corral_udprelay *r);

/* Flows allowed and not yet ended (the ones holding an upstream socket). */
size_t corral_udprelay_count(const struct corral_udprelay *r);

#endif
