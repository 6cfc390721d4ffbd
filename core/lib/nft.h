/*
 * The egress ruleset of a sandbox netns: one `inet` table with a nat/output chain that
 * redirects DNS to the in-netns responder and every other TCP connection to the acceptor,
 * and a filter/output chain (policy drop) that lets through only established, marked,
 * redirected and loopback traffic and rejects the rest at once. With a UDP relay
 * (udp_port), datagrams to the ports some udp: entry names are marked, routed to lo and
 * handed to the relay's socket by TPROXY with their destination intact.
 *
 * Programmed over NETLINK_NETFILTER (libnftnl + libmnl) in one batch, read back and
 * compared by corral_nft_verify. See docs/architecture.md, "Egress data path".
 */
#ifndef CORRAL_NFT_H
#define CORRAL_NFT_H

#include <stdbool.h>
#include <stdint.h>

#define CORRAL_NFT_TABLE "corral"
#define CORRAL_NFT_MARK 42
#define CORRAL_NFT_NAT_CHAIN "nat_out"
#define CORRAL_NFT_FILTER_CHAIN "filter_out"
#define CORRAL_NFT_INPUT_CHAIN "filter_in"
#define CORRAL_NFT_ROUTE_CHAIN "route_out"
#define CORRAL_NFT_UDP_IN_CHAIN "udp_in"
#define CORRAL_NFT_UDP_OUT_CHAIN "udp_out"

#define CORRAL_NFT_MAX_PORT_RANGES 16

/* The sets that record the SYNs and datagrams refused by the ruleset (destination . port,
 * a counter in each element), at most CORRAL_NFT_REFUSED_SIZE elements each: past that
 * only the total is counted. */
#define CORRAL_NFT_REFUSED4 "refused4"
#define CORRAL_NFT_REFUSED6 "refused6"
#define CORRAL_NFT_REFUSED_UDP4 "refusedudp4"
#define CORRAL_NFT_REFUSED_UDP6 "refusedudp6"
#define CORRAL_NFT_REFUSED_SIZE 4096

struct corral_nft_port_range {
    uint16_t lo, hi;
};

struct corral_nft_plan {
    const char *table;      /* NULL: CORRAL_NFT_TABLE */
    uint16_t dns_port;      /* udp/tcp 53 is redirected to 127.0.0.1 / [::1] this port */
    uint16_t acceptor_port; /* every other TCP connection is redirected here */
    uint32_t mark;          /* sockets with this SO_MARK bypass both chains; never 0 */
    /* When not empty, only TCP to these destination ports is redirected to the acceptor;
     * any other TCP connection meets the reset at its SYN, so connect() itself fails.
     * Empty: every TCP connection is redirected (the acceptor decides them all). */
    struct corral_nft_port_range tcp_ports[CORRAL_NFT_MAX_PORT_RANGES];
    size_t n_tcp_ports;
    bool no_tcp; /* no TCP redirected at all (nothing may be allowed): all reset at SYN */
    /* The UDP relay (0: none, and every datagram but DNS is rejected): UDP to udp_ports
     * (none listed: every port but 53) is marked udp_mark, which must route to lo
     * (corral_rtnl_mark_local), and TPROXYed there to udp_port, where the relay's
     * IP_TRANSPARENT socket reads each datagram's original destination. udp_mark is
     * neither 0 nor `mark`. */
    uint16_t udp_port;
    uint32_t udp_mark;
    struct corral_nft_port_range udp_ports[CORRAL_NFT_MAX_PORT_RANGES];
    size_t n_udp_ports;
    /* apply: replace an existing table in the same transaction (delete, then create),
     * so there is never a moment without the ruleset. */
    bool replace;
    /* Test hook: appends to the batch one rule for a chain that does not exist, so the
     * kernel must reject the batch and create nothing. */
    bool test_bad_message;
};

/*
 * Creates the table, both chains and all rules in one batch inside netns_fd. The kernel
 * applies the batch whole or not at all; -EEXIST if the table already exists, -EINVAL
 * for a plan with a zero port or mark.
 */
int corral_nft_apply(int netns_fd, const struct corral_nft_plan *plan);

/*
 * Reads the table back (table flags, chains with hook, priority, type and policy, every
 * rule's expressions in order) and compares it with what the plan implies. 0 if equal,
 * -EPROTO on any difference, -ENOENT if the table is missing.
 */
int corral_nft_verify(int netns_fd, const struct corral_nft_plan *plan);

/* One destination refused at its SYN (TCP) or per datagram (UDP): how many SYNs or
 * datagrams it has seen since the table was made. */
struct corral_nft_refusal {
    uint8_t addr[16]; /* network order; the first 4 bytes for IPv4 */
    uint8_t addr_len; /* 4 or 16 */
    uint8_t proto;    /* IPPROTO_TCP or IPPROTO_UDP */
    uint16_t port;
    uint64_t packets;
};

/*
 * Reads the refusals the ruleset recorded: up to `max` destinations into `out` (*n set),
 * and in *total every refused SYN and datagram, itemised or not (a full set, or more
 * than `max`).
 * No side effect on the counts; -ENOENT if the table is missing.
 */
int corral_nft_refused(int netns_fd, const char *table, struct corral_nft_refusal *out, size_t max,
                       size_t *n, uint64_t *total);

/*
 * The table as the kernel holds it, decoded from the same read-back verify uses, as
 * text for a person: a line for the table, one per chain (type, hook, priority,
 * policy) and one per rule (its handle, then each expression as libnftnl prints it).
 * *text is malloc'ed (the caller frees it) and NUL-terminated, *len its length.
 * Returns 0 or -errno (-ENOENT if the table is missing).
 */
int corral_nft_dump(int netns_fd, const char *table, char **text, size_t *len);

/* Deletes the table (NULL: CORRAL_NFT_TABLE) and everything in it; -ENOENT if missing. */
int corral_nft_delete(int netns_fd, const char *table);

#endif
