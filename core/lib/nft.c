/*
 * The sandbox egress ruleset over NETLINK_NETFILTER: built with libnftnl, sent as one
 * batch, read back with GETTABLE/GETCHAIN/GETRULE and compared expression by expression
 * with the rules the same plan builds. See nft.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_conntrack_common.h>
#include <linux/netfilter/nf_nat.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>

#include "nft.h"
#include "netlink.h"
#include "util.h"

#define MAX_RULES                                                                                  \
    96                   /* the plan builds 21, one per TCP port range, and with UDP 12 and one    \
                          * per UDP port range; the test hook one */
#define MAX_READ 128     /* read-back beyond this is a mismatch anyway */
#define BATCH_SIZE 65536 /* measured (strace): the apply batch is 3460 bytes */
#define MSG_MAX 4096     /* room checked before each message is built */
#define NL_RECV_SIZE 32768
#define ACK_TIMEOUT_MS 1000
#define VERIFY_TRIES 3

/* The kernel's LOOPBACK_IFINDEX: lo is registered first in every netns and always gets
 * ifindex 1 (include/linux/netdevice.h); `nft list` renders `oif 1` as `oif "lo"`. */
#define LO_IFINDEX 1u

struct chain_spec {
    const char *name, *type;
    int32_t prio;
    uint32_t policy;
    uint32_t hook;
};

/* nat at -100 (NF_IP_PRI_NAT_DST) so that redirects happen before filter at 0 sees the
 * packet, whose `ct status dnat` then accepts it. The UDP relay's three chains come last
 * and exist only in a plan with udp_port: route_out marks the allowed datagrams at
 * mangle (-150), before nat, so the kernel routes them again by the mark (to lo, see
 * corral_rtnl_mark_local); udp_in hands them, as they come back in through lo, to the
 * relay's socket with TPROXY, which keeps their destination (an nft redirect would
 * rewrite it, and UDP has no SO_ORIGINAL_DST); udp_out drops a marked datagram routed
 * anywhere but lo, so a missing mark route can never send one out of the sandbox's own
 * link. That check sits at postrouting because only there is `oif` the device the
 * reroute chose: in the output chains it stays the first route's (measured with nft
 * monitor trace on a sandbox with --link: oif "corral0" after route_out's mark). */
static const struct chain_spec CHAINS[] = {
    {CORRAL_NFT_NAT_CHAIN, "nat", -100, NF_ACCEPT, NF_INET_LOCAL_OUT},
    {CORRAL_NFT_FILTER_CHAIN, "filter", 0, NF_DROP, NF_INET_LOCAL_OUT},
    {CORRAL_NFT_INPUT_CHAIN, "filter", 0, NF_DROP, NF_INET_LOCAL_IN},
    {CORRAL_NFT_ROUTE_CHAIN, "route", -150, NF_ACCEPT, NF_INET_LOCAL_OUT},
    {CORRAL_NFT_UDP_IN_CHAIN, "filter", -150, NF_ACCEPT, NF_INET_PRE_ROUTING},
    {CORRAL_NFT_UDP_OUT_CHAIN, "filter", 0, NF_ACCEPT, NF_INET_POST_ROUTING},
};
#define NCHAINS_BASE 3
#define NCHAINS_MAX (sizeof CHAINS / sizeof CHAINS[0])

/* The chains a plan makes: the UDP relay's only with udp_port. */
static size_t plan_chains(const struct corral_nft_plan *p)
{
    return p->udp_port ? NCHAINS_MAX : NCHAINS_BASE;
}

struct ruleset {
    struct nftnl_rule *rule[MAX_RULES];
    size_t n;
};

static void ruleset_free(struct ruleset *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        nftnl_rule_free(rs->rule[i]);
    rs->n = 0;
}

#define _cleanup_ruleset_ __attribute__((cleanup(ruleset_free)))

static int plan_table(const struct corral_nft_plan *p, const char **table)
{
    if (!p || !p->dns_port || !p->acceptor_port) return -EINVAL;
    /* mark 0 would make `meta mark 0 return/accept` exempt every unmarked packet. */
    if (!p->mark) return -EINVAL;
    if (p->n_tcp_ports > CORRAL_NFT_MAX_PORT_RANGES) return -EINVAL;
    for (size_t i = 0; i < p->n_tcp_ports; i++)
        if (!p->tcp_ports[i].lo || p->tcp_ports[i].hi < p->tcp_ports[i].lo) return -EINVAL;
    /* The UDP mark routes datagrams to the relay: it can be neither 0 nor the host's own. */
    if (p->udp_port && (!p->udp_mark || p->udp_mark == p->mark)) return -EINVAL;
    if (p->n_udp_ports > CORRAL_NFT_MAX_PORT_RANGES || (p->n_udp_ports && !p->udp_port))
        return -EINVAL;
    for (size_t i = 0; i < p->n_udp_ports; i++)
        if (!p->udp_ports[i].lo || p->udp_ports[i].hi < p->udp_ports[i].lo) return -EINVAL;
    *table = p->table ? p->table : CORRAL_NFT_TABLE;
    size_t len = strlen(*table);
    return len == 0 || len >= NFT_TABLE_MAXNAMELEN ? -EINVAL : 0;
}

/* Rule builder: the first failure sticks in err and turns every later step into a no-op,
 * so a ruleset is written straight through and checked once. */
struct builder {
    struct ruleset *rs;
    struct nftnl_rule *r;
    int err;
};

static void rule_begin(struct builder *b, const char *table, const char *chain)
{
    if (b->err) return;
    if (b->rs->n == MAX_RULES) {
        b->err = -E2BIG;
        return;
    }
    struct nftnl_rule *r = nftnl_rule_alloc();
    if (!r) {
        b->err = -ENOMEM;
        return;
    }
    b->rs->rule[b->rs->n++] = r;
    b->r = r;
    nftnl_rule_set_u32(r, NFTNL_RULE_FAMILY, NFPROTO_INET);
    if (nftnl_rule_set_str(r, NFTNL_RULE_TABLE, table) < 0 ||
        nftnl_rule_set_str(r, NFTNL_RULE_CHAIN, chain) < 0)
        b->err = -ENOMEM;
}

static struct nftnl_expr *expr_add(struct builder *b, const char *name)
{
    if (b->err) return NULL;
    struct nftnl_expr *e = nftnl_expr_alloc(name);
    if (!e) {
        b->err = -ENOMEM;
        return NULL;
    }
    nftnl_rule_add_expr(b->r, e);
    return e;
}

static void meta_load(struct builder *b, uint32_t key)
{
    struct nftnl_expr *e = expr_add(b, "meta");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, NFT_REG_1);
}

static void cmp(struct builder *b, uint32_t op, const void *data, uint32_t len)
{
    struct nftnl_expr *e = expr_add(b, "cmp");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
    if (nftnl_expr_set(e, NFTNL_EXPR_CMP_DATA, data, len) < 0) b->err = -ENOMEM;
}

static void cmp_u8(struct builder *b, uint8_t v)
{
    cmp(b, NFT_CMP_EQ, &v, sizeof v);
}

static void cmp_u32(struct builder *b, uint32_t v)
{
    cmp(b, NFT_CMP_EQ, &v, sizeof v);
}

static void payload(struct builder *b, uint32_t base, uint32_t offset, uint32_t len)
{
    struct nftnl_expr *e = expr_add(b, "payload");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, offset);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
}

/* `REG_1 &= mask` (xor 0, as nft emits a prefix or a bit-set match); len at most 16. */
static void mask_reg1(struct builder *b, const void *mask, uint32_t len)
{
    static const uint8_t zero[16];
    if (len > sizeof zero) {
        b->err = -EINVAL;
        return;
    }
    struct nftnl_expr *e = expr_add(b, "bitwise");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, len);
    if (nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, mask, len) < 0 ||
        nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, zero, len) < 0)
        b->err = -ENOMEM;
}

/* `REG_1 = data` (an immediate, the operand of a statement such as redir or tproxy) */
static void load_imm(struct builder *b, const void *data, uint32_t len)
{
    struct nftnl_expr *e = expr_add(b, "immediate");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_1);
    if (nftnl_expr_set(e, NFTNL_EXPR_IMM_DATA, data, len) < 0) b->err = -ENOMEM;
}

static void verdict(struct builder *b, int v)
{
    struct nftnl_expr *e = expr_add(b, "immediate");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, (uint32_t)v);
}

/* `meta l4proto P` */
static void l4proto(struct builder *b, uint8_t proto)
{
    meta_load(b, NFT_META_L4PROTO);
    cmp_u8(b, proto);
}

/* `th dport P` (tcp and udp keep the destination port at offset 2) */
static void dport(struct builder *b, uint16_t port)
{
    uint16_t be = htons(port);
    payload(b, NFT_PAYLOAD_TRANSPORT_HEADER, 2, sizeof be);
    cmp(b, NFT_CMP_EQ, &be, sizeof be);
}

/* `th dport lo-hi` (a single port when lo == hi): ranges compare the big-endian bytes,
 * which orders them as numbers, as nft itself emits it. */
static void dport_range(struct builder *b, uint16_t lo, uint16_t hi)
{
    if (lo == hi) {
        dport(b, lo);
        return;
    }
    uint16_t blo = htons(lo), bhi = htons(hi);
    payload(b, NFT_PAYLOAD_TRANSPORT_HEADER, 2, sizeof blo);
    cmp(b, NFT_CMP_GTE, &blo, sizeof blo);
    cmp(b, NFT_CMP_LTE, &bhi, sizeof bhi);
}

/* `ip daddr 127.0.0.0/8`: in an inet table the family is matched first; a /8 is a 1-byte
 * load of the first byte of the destination (offset 16), as nft itself emits it. */
static void ip4_daddr_loopback(struct builder *b)
{
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, NFPROTO_IPV4);
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, 16, 1);
    cmp_u8(b, 127);
}

/* `ip6 daddr ::1` (destination at offset 24) */
static void ip6_daddr_loopback(struct builder *b)
{
    static const struct in6_addr lo6 = IN6ADDR_LOOPBACK_INIT;
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, NFPROTO_IPV6);
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, 24, sizeof lo6);
    cmp(b, NFT_CMP_EQ, &lo6, sizeof lo6);
}

/* `ip6 daddr fe80::/10`: the first two bytes masked to ten bits, as nft emits a prefix. */
static void ip6_daddr_link_local(struct builder *b)
{
    static const uint8_t mask[2] = {0xff, 0xc0}, want[2] = {0xfe, 0x80};
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, NFPROTO_IPV6);
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, 24, sizeof want);
    mask_reg1(b, mask, sizeof mask);
    cmp(b, NFT_CMP_EQ, want, sizeof want);
}

/* `ip daddr 224.0.0.0/4` or `ip6 daddr ff00::/8`: multicast, its first byte masked to
 * the prefix, as nft emits it. */
static void daddr_multicast(struct builder *b, uint8_t nfproto)
{
    const uint8_t mask = nfproto == NFPROTO_IPV4 ? 0xf0 : 0xff;
    const uint8_t want = nfproto == NFPROTO_IPV4 ? 0xe0 : 0xff;
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, nfproto);
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, nfproto == NFPROTO_IPV4 ? 16 : 24, 1);
    if (mask != 0xff) mask_reg1(b, &mask, 1);
    cmp_u8(b, want);
}

/* `redirect to :port`. PROTO_MAX and the flag are written the way the kernel reports them
 * back (nft_redir_init sets both when only PROTO_MIN is given), so that the read-back
 * compares equal. */
static void redirect(struct builder *b, uint16_t port)
{
    uint16_t be = htons(port);
    load_imm(b, &be, sizeof be);
    struct nftnl_expr *e = expr_add(b, "redir");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_REG_PROTO_MIN, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_REG_PROTO_MAX, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
}

/* `ct KEY & mask != 0` (ct state / ct status bit sets) */
static void ct_any(struct builder *b, uint32_t key, uint32_t mask)
{
    static const uint32_t zero;
    struct nftnl_expr *e = expr_add(b, "ct");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, NFT_REG_1);
    mask_reg1(b, &mask, sizeof mask);
    cmp(b, NFT_CMP_NEQ, &zero, sizeof zero);
}

/* `meta mark set V` */
static void set_mark(struct builder *b, uint32_t v)
{
    load_imm(b, &v, sizeof v);
    struct nftnl_expr *e = expr_add(b, "meta");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, NFT_META_MARK);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_SREG, NFT_REG_1);
}

/* `meta nfproto F tproxy ip|ip6 to :port`: the datagram is handed to the socket bound to
 * that port (IP_TRANSPARENT), its destination untouched. */
static void tproxy(struct builder *b, uint32_t nfproto, uint16_t port)
{
    uint16_t be = htons(port);
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, (uint8_t)nfproto);
    load_imm(b, &be, sizeof be);
    struct nftnl_expr *e = expr_add(b, "tproxy");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_TPROXY_FAMILY, nfproto);
    nftnl_expr_set_u32(e, NFTNL_EXPR_TPROXY_REG_PORT, NFT_REG_1);
}

static void reject(struct builder *b, uint32_t type, uint8_t code)
{
    struct nftnl_expr *e = expr_add(b, "reject");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, type);
    nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, code);
}

/* The sets of refusals, by family and protocol (TCP SYNs, UDP datagrams): destination .
 * port, a counter in each element. */
struct refused_set {
    const char *name;
    uint32_t nfproto, addr_len, addr_off, key_type, key_len, port_reg, id;
    uint8_t proto;
};
/* Key types as nft writes a concatenation (ipv4_addr 7 or ipv6_addr 8, shifted by
 * TYPE_BITS 6, then inet_service 13); the port is padded to 4 bytes in the key. */
static const struct refused_set REFUSED[] = {
    {CORRAL_NFT_REFUSED4, NFPROTO_IPV4, 4, 16, (7u << 6) | 13u, 8, NFT_REG32_01, 1, IPPROTO_TCP},
    {CORRAL_NFT_REFUSED6, NFPROTO_IPV6, 16, 24, (8u << 6) | 13u, 20, NFT_REG_2, 2, IPPROTO_TCP},
    {CORRAL_NFT_REFUSED_UDP4, NFPROTO_IPV4, 4, 16, (7u << 6) | 13u, 8, NFT_REG32_01, 3,
     IPPROTO_UDP},
    {CORRAL_NFT_REFUSED_UDP6, NFPROTO_IPV6, 16, 24, (8u << 6) | 13u, 20, NFT_REG_2, 4, IPPROTO_UDP},
};
#define NREFUSED (sizeof REFUSED / sizeof REFUSED[0])

static const struct refused_set *refused_set(uint32_t nfproto, uint8_t proto)
{
    for (size_t i = 0; i < NREFUSED; i++)
        if (REFUSED[i].nfproto == nfproto && REFUSED[i].proto == proto) return &REFUSED[i];
    return NULL;
}

/* `meta l4proto tcp tcp flags & (syn|ack) == syn meta nfproto F counter
 *  add @refusedF { daddr . th dport }`: only a connection's first SYN, never the RST the
 * reject itself sends. For UDP (`meta l4proto udp meta nfproto F counter add
 * @refusedudpF …`) every datagram: each one is refused. */
static void record_refusal(struct builder *b, const char *table, uint32_t nfproto, uint8_t proto)
{
    static const uint8_t mask = 0x12, syn = 0x02;
    const struct refused_set *set = refused_set(nfproto, proto);
    struct nftnl_expr *e;
    rule_begin(b, table, CORRAL_NFT_FILTER_CHAIN);
    l4proto(b, proto);
    if (proto == IPPROTO_TCP) {
        payload(b, NFT_PAYLOAD_TRANSPORT_HEADER, 13, 1);
        mask_reg1(b, &mask, 1);
        cmp(b, NFT_CMP_EQ, &syn, 1);
    }
    meta_load(b, NFT_META_NFPROTO);
    cmp_u8(b, (uint8_t)nfproto);
    expr_add(b, "counter");
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, set->addr_off, set->addr_len);
    e = expr_add(b, "payload");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, set->port_reg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, NFT_PAYLOAD_TRANSPORT_HEADER);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, 2);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, 2);
    e = expr_add(b, "dynset");
    if (!e) return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_KEY, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_OP, NFT_DYNSET_OP_ADD);
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SET_ID, set->id);
    if (nftnl_expr_set_str(e, NFTNL_EXPR_DYNSET_SET_NAME, set->name) < 0) b->err = -ENOMEM;
}

/* The UDP relay's chains (see CHAINS). route_out marks a datagram to a port some udp:
 * entry names, unless it is the host's own (marked), to loopback, to a link-local address
 * (see nat_out) or DNS (nat_out redirects it to the responder, after this chain); udp_in
 * gives the marked datagrams coming in through lo to the relay, and drops one no relay
 * socket took. */
static void build_udp_rules(struct builder *b, const struct corral_nft_plan *p, const char *table)
{
    const char *route = CORRAL_NFT_ROUTE_CHAIN, *udp_in = CORRAL_NFT_UDP_IN_CHAIN;
    rule_begin(b, table, route);
    meta_load(b, NFT_META_MARK);
    cmp_u32(b, p->mark);
    verdict(b, NFT_RETURN);

    rule_begin(b, table, route);
    ip4_daddr_loopback(b);
    verdict(b, NFT_RETURN);

    rule_begin(b, table, route);
    ip6_daddr_loopback(b);
    verdict(b, NFT_RETURN);

    rule_begin(b, table, route);
    ip6_daddr_link_local(b);
    verdict(b, NFT_RETURN);

    /* Multicast is never relayed (never a destination: corral.egress.ranges), and
     * marked it would be routed to lo and dropped there before the relay saw it, unlogged:
     * left unmarked, filter_out records and refuses it. */
    rule_begin(b, table, route);
    daddr_multicast(b, NFPROTO_IPV4);
    verdict(b, NFT_RETURN);

    rule_begin(b, table, route);
    daddr_multicast(b, NFPROTO_IPV6);
    verdict(b, NFT_RETURN);

    rule_begin(b, table, route);
    l4proto(b, IPPROTO_UDP);
    dport(b, 53);
    verdict(b, NFT_RETURN);

    if (p->n_udp_ports == 0) {
        rule_begin(b, table, route);
        l4proto(b, IPPROTO_UDP);
        set_mark(b, p->udp_mark);
    }
    for (size_t i = 0; i < p->n_udp_ports; i++) {
        rule_begin(b, table, route);
        l4proto(b, IPPROTO_UDP);
        dport_range(b, p->udp_ports[i].lo, p->udp_ports[i].hi);
        set_mark(b, p->udp_mark);
    }

    static const uint32_t families[] = {NFPROTO_IPV4, NFPROTO_IPV6};
    for (size_t i = 0; i < 2; i++) {
        rule_begin(b, table, udp_in);
        meta_load(b, NFT_META_MARK);
        cmp_u32(b, p->udp_mark);
        meta_load(b, NFT_META_IIF);
        cmp_u32(b, LO_IFINDEX);
        l4proto(b, IPPROTO_UDP);
        tproxy(b, families[i], p->udp_port);
        verdict(b, NF_ACCEPT);
    }
    rule_begin(b, table, udp_in);
    meta_load(b, NFT_META_MARK);
    cmp_u32(b, p->udp_mark);
    verdict(b, NF_DROP);

    rule_begin(b, table, CORRAL_NFT_UDP_OUT_CHAIN);
    meta_load(b, NFT_META_MARK);
    cmp_u32(b, p->udp_mark);
    meta_load(b, NFT_META_OIF);
    cmp(b, NFT_CMP_NEQ, &(uint32_t){LO_IFINDEX}, sizeof(uint32_t));
    verdict(b, NF_DROP);
}

static int build_rules(const struct corral_nft_plan *p, const char *table, struct ruleset *rs)
{
    const char *nat = CORRAL_NFT_NAT_CHAIN, *filter = CORRAL_NFT_FILTER_CHAIN;
    struct builder b = {.rs = rs, .r = NULL, .err = 0};

    /* nat_out: what is exempt returns first; DNS before the catch-all TCP redirect. */
    rule_begin(&b, table, nat);
    meta_load(&b, NFT_META_MARK);
    cmp_u32(&b, p->mark);
    verdict(&b, NFT_RETURN);

    rule_begin(&b, table, nat);
    ip4_daddr_loopback(&b);
    verdict(&b, NFT_RETURN);

    rule_begin(&b, table, nat);
    ip6_daddr_loopback(&b);
    verdict(&b, NFT_RETURN);

    /* A link-local destination carries its interface (the scope id binds the socket to
     * it), so a redirect to the acceptor on ::1 would be routed out of that interface and
     * lost, the connect hanging until the client's timeout. Left unredirected, it meets
     * the TCP reset below at once. */
    rule_begin(&b, table, nat);
    ip6_daddr_link_local(&b);
    verdict(&b, NFT_RETURN);

    static const uint8_t dns_protos[] = {IPPROTO_UDP, IPPROTO_TCP};
    for (size_t i = 0; i < sizeof dns_protos; i++) {
        rule_begin(&b, table, nat);
        l4proto(&b, dns_protos[i]);
        dport(&b, 53);
        redirect(&b, p->dns_port);
    }

    if (p->n_tcp_ports == 0 && !p->no_tcp) {
        rule_begin(&b, table, nat);
        l4proto(&b, IPPROTO_TCP);
        redirect(&b, p->acceptor_port);
    }
    /* Only the ports some entry allows: the rest is reset at the SYN (filter_out's TCP
     * reject), so a bare connect sees the refusal too (`nc -z` saw every port open when
     * the acceptor took every connection to reset it). */
    for (size_t i = 0; i < p->n_tcp_ports; i++) {
        rule_begin(&b, table, nat);
        l4proto(&b, IPPROTO_TCP);
        dport_range(&b, p->tcp_ports[i].lo, p->tcp_ports[i].hi);
        redirect(&b, p->acceptor_port);
    }

    /* filter_out, policy drop. A UDP flow's conntrack entry stays established after the
     * flow ends (a cut, a revoke, a ruleset without its port), and with a link its next
     * datagram, no longer marked for the relay, would take the link's route straight to
     * the destination: established UDP is accepted only on lo, and on the link only with
     * the host's mark (below), so such a datagram is refused and recorded like any other. */
    rule_begin(&b, table, filter);
    ct_any(&b, NFT_CT_STATE, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    meta_load(&b, NFT_META_L4PROTO);
    cmp(&b, NFT_CMP_NEQ, &(uint8_t){IPPROTO_UDP}, sizeof(uint8_t));
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, filter);
    meta_load(&b, NFT_META_OIF);
    cmp_u32(&b, LO_IFINDEX);
    ct_any(&b, NFT_CT_STATE, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, filter);
    meta_load(&b, NFT_META_MARK);
    cmp_u32(&b, p->mark);
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, filter);
    ct_any(&b, NFT_CT_STATUS, IPS_DST_NAT);
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, filter);
    meta_load(&b, NFT_META_OIF);
    cmp_u32(&b, LO_IFINDEX);
    ip4_daddr_loopback(&b);
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, filter);
    meta_load(&b, NFT_META_OIF);
    cmp_u32(&b, LO_IFINDEX);
    ip6_daddr_loopback(&b);
    verdict(&b, NF_ACCEPT);

    /* A datagram route_out marked for the UDP relay: its mark routes it to lo, and udp_out
     * drops it should it be routed anywhere else. */
    if (p->udp_port) {
        rule_begin(&b, table, filter);
        meta_load(&b, NFT_META_MARK);
        cmp_u32(&b, p->udp_mark);
        verdict(&b, NF_ACCEPT);
    }

    /* What reaches here is refused at its SYN (no entry names its port), or, for UDP, as
     * a datagram no udp: entry's port covers: each is counted and its destination and port
     * recorded in a set with a counter per element, so the host reads the refusals
     * (corral_nft_refused) without a packet ever waking it. The counter comes first: a
     * full set stops the rule at `add`, never the count. */
    record_refusal(&b, table, NFPROTO_IPV4, IPPROTO_TCP);
    record_refusal(&b, table, NFPROTO_IPV6, IPPROTO_TCP);
    record_refusal(&b, table, NFPROTO_IPV4, IPPROTO_UDP);
    record_refusal(&b, table, NFPROTO_IPV6, IPPROTO_UDP);

    /* Reject rather than leave it to the drop policy: a client gets ECONNREFUSED/EPERM at
     * once instead of retrying until its own timeout (tests/c/test_nft.c measures it). */
    rule_begin(&b, table, filter);
    l4proto(&b, IPPROTO_TCP);
    reject(&b, NFT_REJECT_TCP_RST, 0);

    rule_begin(&b, table, filter);
    reject(&b, NFT_REJECT_ICMPX_UNREACH, NFT_REJECT_ICMPX_ADMIN_PROHIBITED);

    /* filter_in, policy drop: only replies and loopback come in. On a sandbox's own link
     * the far side could otherwise open connections to the tenant (and the replies then
     * left as `established`): a two-way channel past the allowlist and the log. */
    const char *input = CORRAL_NFT_INPUT_CHAIN;
    rule_begin(&b, table, input);
    ct_any(&b, NFT_CT_STATE, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    verdict(&b, NF_ACCEPT);

    rule_begin(&b, table, input);
    meta_load(&b, NFT_META_IIF);
    cmp_u32(&b, LO_IFINDEX);
    verdict(&b, NF_ACCEPT);

    if (p->udp_port) build_udp_rules(&b, p, table);

    if (p->test_bad_message) {
        rule_begin(&b, table, "corral-no-such-chain");
        verdict(&b, NF_ACCEPT);
    }
    return b.err;
}

/* ---- batch ---- */

struct batch {
    char *buf;
    size_t len;
    uint32_t seq;
    uint32_t first; /* sequence number of the first message between BEGIN and END */
    uint32_t n;     /* messages between BEGIN and END, each of which the kernel acks */
};

static void batch_free(struct batch *b)
{
    free(b->buf);
}
#define _cleanup_batch_ __attribute__((cleanup(batch_free)))

static char *batch_slot(struct batch *b)
{
    return b->len + MSG_MAX <= BATCH_SIZE ? b->buf + b->len : NULL;
}

static int batch_commit(struct batch *b, struct nlmsghdr *nlh, int counted)
{
    if (nlh->nlmsg_len > MSG_MAX) return -E2BIG;
    b->len += NLMSG_ALIGN(nlh->nlmsg_len);
    b->seq++;
    b->n += counted ? 1 : 0;
    return 0;
}

static int batch_init(struct batch *b)
{
    b->buf = calloc(1, BATCH_SIZE);
    if (!b->buf) return -ENOMEM;
    b->len = 0;
    b->seq = 1;
    b->first = 2;
    b->n = 0;
    return batch_commit(b, nftnl_batch_begin(b->buf, b->seq), 0);
}

static int batch_end(struct batch *b)
{
    char *slot = batch_slot(b);
    if (!slot) return -E2BIG;
    return batch_commit(b, nftnl_batch_end(slot, b->seq), 0);
}

static int batch_table(struct batch *b, const char *name, uint16_t type, uint16_t flags)
{
    char *slot = batch_slot(b);
    if (!slot) return -E2BIG;
    struct nftnl_table *t = nftnl_table_alloc();
    if (!t) return -ENOMEM;
    nftnl_table_set_u32(t, NFTNL_TABLE_FAMILY, NFPROTO_INET);
    if (nftnl_table_set_str(t, NFTNL_TABLE_NAME, name) < 0) {
        nftnl_table_free(t);
        return -ENOMEM;
    }
    struct nlmsghdr *nlh =
        nftnl_nlmsg_build_hdr(slot, type, NFPROTO_INET, flags | NLM_F_ACK, b->seq);
    nftnl_table_nlmsg_build_payload(nlh, t);
    nftnl_table_free(t);
    return batch_commit(b, nlh, 1);
}

static int batch_chain(struct batch *b, const char *table, const struct chain_spec *spec)
{
    char *slot = batch_slot(b);
    if (!slot) return -E2BIG;
    struct nftnl_chain *c = nftnl_chain_alloc();
    if (!c) return -ENOMEM;
    nftnl_chain_set_u32(c, NFTNL_CHAIN_FAMILY, NFPROTO_INET);
    nftnl_chain_set_u32(c, NFTNL_CHAIN_HOOKNUM, spec->hook);
    nftnl_chain_set_s32(c, NFTNL_CHAIN_PRIO, spec->prio);
    nftnl_chain_set_u32(c, NFTNL_CHAIN_POLICY, spec->policy);
    if (nftnl_chain_set_str(c, NFTNL_CHAIN_TABLE, table) < 0 ||
        nftnl_chain_set_str(c, NFTNL_CHAIN_NAME, spec->name) < 0 ||
        nftnl_chain_set_str(c, NFTNL_CHAIN_TYPE, spec->type) < 0) {
        nftnl_chain_free(c);
        return -ENOMEM;
    }
    struct nlmsghdr *nlh = nftnl_nlmsg_build_hdr(slot, NFT_MSG_NEWCHAIN, NFPROTO_INET,
                                                 NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, b->seq);
    nftnl_chain_nlmsg_build_payload(nlh, c);
    nftnl_chain_free(c);
    return batch_commit(b, nlh, 1);
}

static int batch_set(struct batch *b, const char *table, const struct refused_set *spec)
{
    char *slot = batch_slot(b);
    if (!slot) return -E2BIG;
    struct nftnl_set *s = nftnl_set_alloc();
    struct nftnl_expr *counter = nftnl_expr_alloc("counter");
    if (!s || !counter) {
        if (s) nftnl_set_free(s);
        if (counter) nftnl_expr_free(counter);
        return -ENOMEM;
    }
    nftnl_set_add_expr(s, counter); /* owned by the set from here */
    nftnl_set_set_u32(s, NFTNL_SET_FAMILY, NFPROTO_INET);
    nftnl_set_set_u32(s, NFTNL_SET_KEY_TYPE, spec->key_type);
    nftnl_set_set_u32(s, NFTNL_SET_KEY_LEN, spec->key_len);
    nftnl_set_set_u32(s, NFTNL_SET_FLAGS, NFT_SET_EVAL);
    nftnl_set_set_u32(s, NFTNL_SET_ID, spec->id);
    nftnl_set_set_u32(s, NFTNL_SET_DESC_SIZE, CORRAL_NFT_REFUSED_SIZE);
    if (nftnl_set_set_str(s, NFTNL_SET_TABLE, table) < 0 ||
        nftnl_set_set_str(s, NFTNL_SET_NAME, spec->name) < 0) {
        nftnl_set_free(s);
        return -ENOMEM;
    }
    struct nlmsghdr *nlh = nftnl_nlmsg_build_hdr(slot, NFT_MSG_NEWSET, NFPROTO_INET,
                                                 NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, b->seq);
    nftnl_set_nlmsg_build_payload(nlh, s);
    nftnl_set_free(s);
    return batch_commit(b, nlh, 1);
}

static int batch_rule(struct batch *b, struct nftnl_rule *r)
{
    char *slot = batch_slot(b);
    if (!slot) return -E2BIG;
    struct nlmsghdr *nlh = nftnl_nlmsg_build_hdr(slot, NFT_MSG_NEWRULE, NFPROTO_INET,
                                                 NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK, b->seq);
    nftnl_rule_nlmsg_build_payload(nlh, r);
    return batch_commit(b, nlh, 1);
}

/*
 * Sends the batch and collects one ack per message between BEGIN and END. The kernel
 * processes a batch inside sendmsg and queues every ack (errors included: nfnetlink
 * reports all of them, then aborts the whole batch) before sendmsg returns; the poll
 * timeout only guards against a reply that never comes.
 */
static int batch_run(struct mnl_socket *nl, const struct batch *b)
{
    int fd = mnl_socket_get_fd(nl);
    uint32_t portid = mnl_socket_get_portid(nl);
    uint32_t acked = 0;
    int first_err = 0;
    _cleanup_free_ char *buf = malloc(NL_RECV_SIZE);
    if (!buf) return -ENOMEM;

    if (mnl_socket_sendto(nl, b->buf, b->len) < 0) return -errno;
    while (acked < b->n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN, .revents = 0};
        int pr = poll(&pfd, 1, ACK_TIMEOUT_MS);
        if (pr < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (pr == 0) break;
        ssize_t got = recv(fd, buf, NL_RECV_SIZE, MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -errno;
        }
        int len = (int)got;
        for (const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf; mnl_nlmsg_ok(nlh, len);
             nlh = mnl_nlmsg_next(nlh, &len)) {
            if (nlh->nlmsg_pid != portid || nlh->nlmsg_type != NLMSG_ERROR) continue;
            if (nlh->nlmsg_len < mnl_nlmsg_size(sizeof(struct nlmsgerr))) {
                if (!first_err) first_err = -EPROTO;
                continue;
            }
            const struct nlmsgerr *e = mnl_nlmsg_get_payload(nlh);
            if (e->error && !first_err) first_err = e->error > 0 ? -e->error : e->error;
            if (nlh->nlmsg_seq >= b->first && nlh->nlmsg_seq < b->first + b->n) acked++;
        }
    }
    if (first_err) return first_err;
    return acked == b->n ? 0 : -ETIMEDOUT;
}

static int nft_open(int netns_fd, struct mnl_socket **nl)
{
    int err = corral_netlink_open_in(netns_fd, NETLINK_NETFILTER, nl);
    if (err) return err;
    /* Errors then carry only the header of the failed message, not a copy of it. */
    int one = 1;
    (void)mnl_socket_setsockopt(*nl, NETLINK_CAP_ACK, &one, sizeof one);
    return 0;
}

int corral_nft_apply(int netns_fd, const struct corral_nft_plan *plan)
{
    const char *table;
    _cleanup_ruleset_ struct ruleset rs = {.n = 0};
    _cleanup_batch_ struct batch b = {.buf = NULL};
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    int err = plan_table(plan, &table);
    if (err) return err;
    err = build_rules(plan, table, &rs);
    if (err) return err;

    err = batch_init(&b);
    if (!err && plan->replace) err = batch_table(&b, table, NFT_MSG_DELTABLE, 0);
    if (!err) err = batch_table(&b, table, NFT_MSG_NEWTABLE, NLM_F_CREATE | NLM_F_EXCL);
    for (size_t i = 0; !err && i < plan_chains(plan); i++)
        err = batch_chain(&b, table, &CHAINS[i]);
    for (size_t i = 0; !err && i < NREFUSED; i++)
        err = batch_set(&b, table, &REFUSED[i]);
    for (size_t i = 0; !err && i < rs.n; i++)
        err = batch_rule(&b, rs.rule[i]);
    if (!err) err = batch_end(&b);
    if (err) return err;

    err = nft_open(netns_fd, &nl);
    if (err) return err;
    return batch_run(nl, &b);
}

int corral_nft_delete(int netns_fd, const char *table)
{
    _cleanup_batch_ struct batch b = {.buf = NULL};
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    if (!table) table = CORRAL_NFT_TABLE;
    size_t len = strlen(table);
    if (len == 0 || len >= NFT_TABLE_MAXNAMELEN) return -EINVAL;

    int err = batch_init(&b);
    if (!err) err = batch_table(&b, table, NFT_MSG_DELTABLE, 0);
    if (!err) err = batch_end(&b);
    if (!err) err = nft_open(netns_fd, &nl);
    if (err) return err;
    return batch_run(nl, &b);
}

/* ---- read back ---- */

struct readback {
    const char *table;
    int table_seen;
    uint32_t table_flags;
    struct nftnl_chain *chain[MAX_READ];
    size_t nchain;
    struct nftnl_rule *rule[MAX_READ];
    size_t nrule;
    int overflow;
};

static void readback_free(struct readback *rb)
{
    for (size_t i = 0; i < rb->nchain; i++)
        nftnl_chain_free(rb->chain[i]);
    for (size_t i = 0; i < rb->nrule; i++)
        nftnl_rule_free(rb->rule[i]);
    rb->nchain = rb->nrule = 0;
    rb->table_seen = 0;
    rb->overflow = 0;
}
#define _cleanup_readback_ __attribute__((cleanup(readback_free)))

static int str_eq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* One callback for the three dumps: each message is parsed as the object its type names,
 * and only what belongs to rb->table counts (the table's flags noted, at most MAX_READ
 * chains and rules kept). */
static int readback_cb(const struct nlmsghdr *nlh, void *data)
{
    struct readback *rb = data;
    struct nftnl_table *t = NULL;
    struct nftnl_chain *c = NULL;
    struct nftnl_rule *r = NULL;
    const char *table = NULL;
    int parsed = -1;
    switch (NFNL_MSG_TYPE(nlh->nlmsg_type)) {
    case NFT_MSG_NEWTABLE:
        if ((t = nftnl_table_alloc()) && (parsed = nftnl_table_nlmsg_parse(nlh, t)) >= 0)
            table = nftnl_table_get_str(t, NFTNL_TABLE_NAME);
        break;
    case NFT_MSG_NEWCHAIN:
        if ((c = nftnl_chain_alloc()) && (parsed = nftnl_chain_nlmsg_parse(nlh, c)) >= 0)
            table = nftnl_chain_get_str(c, NFTNL_CHAIN_TABLE);
        break;
    case NFT_MSG_NEWRULE:
        if ((r = nftnl_rule_alloc()) && (parsed = nftnl_rule_nlmsg_parse(nlh, r)) >= 0)
            table = nftnl_rule_get_str(r, NFTNL_RULE_TABLE);
        break;
    default:
        return MNL_CB_OK;
    }
    int rc = MNL_CB_OK;
    if (!t && !c && !r) {
        errno = ENOMEM;
        rc = MNL_CB_ERROR;
    } else if (parsed < 0) {
        errno = EPROTO;
        rc = MNL_CB_ERROR;
    } else if (str_eq(table, rb->table)) {
        if (t) {
            rb->table_seen = 1;
            rb->table_flags = nftnl_table_is_set(t, NFTNL_TABLE_FLAGS)
                                  ? nftnl_table_get_u32(t, NFTNL_TABLE_FLAGS)
                                  : 0;
        } else if (c && rb->nchain < MAX_READ) {
            rb->chain[rb->nchain++] = corral_steal_pointer(&c);
        } else if (r && rb->nrule < MAX_READ) {
            rb->rule[rb->nrule++] = corral_steal_pointer(&r);
        } else {
            rb->overflow = 1;
        }
    }
    if (t) nftnl_table_free(t);
    if (c) nftnl_chain_free(c);
    if (r) nftnl_rule_free(r);
    return rc;
}

static int read_back(struct mnl_socket *nl, struct readback *rb)
{
    char buf[1024];
    struct nlmsghdr *nlh;

    struct nftnl_table *t = nftnl_table_alloc();
    if (!t) return -ENOMEM;
    if (nftnl_table_set_str(t, NFTNL_TABLE_NAME, rb->table) < 0) {
        nftnl_table_free(t);
        return -ENOMEM;
    }
    nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_GETTABLE, NFPROTO_INET, NLM_F_ACK, 0);
    nftnl_table_nlmsg_build_payload(nlh, t);
    nftnl_table_free(t);
    int err = corral_netlink_talk(nl, nlh, readback_cb, rb);
    if (err) return err;
    if (!rb->table_seen) return -ENOENT;

    nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_GETCHAIN, NFPROTO_INET, NLM_F_DUMP, 0);
    err = corral_netlink_talk(nl, nlh, readback_cb, rb);
    if (err) return err;

    /* The kernel filters a rule dump by NFTA_RULE_TABLE; readback_cb checks it again. */
    struct nftnl_rule *r = nftnl_rule_alloc();
    if (!r) return -ENOMEM;
    if (nftnl_rule_set_str(r, NFTNL_RULE_TABLE, rb->table) < 0) {
        nftnl_rule_free(r);
        return -ENOMEM;
    }
    nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_GETRULE, NFPROTO_INET, NLM_F_DUMP, 0);
    nftnl_rule_nlmsg_build_payload(nlh, r);
    nftnl_rule_free(r);
    return corral_netlink_talk(nl, nlh, readback_cb, rb);
}

/* One expression as libnftnl prints it ("cmp eq reg 1 0x0000002a"), its name first: the
 * rendering covers every attribute the kernel reports for the expressions used here. */
static int expr_text(const struct nftnl_expr *e, char *buf, size_t size)
{
    const char *name = nftnl_expr_get_str(e, NFTNL_EXPR_NAME);
    int n = snprintf(buf, size, "%s ", name ? name : "?");
    if (n < 0 || (size_t)n >= size) return -1;
    /* A counter's values are the traffic's, not the plan's: its presence is compared. */
    if (name && strcmp(name, "counter") == 0) return 0;
    /* The kernel reports a dynset's timeout (0) even when none may be sent (a set without
     * timeouts refuses one): what is compared is the operation, the key and the set. */
    if (name && strcmp(name, "dynset") == 0) {
        const char *set = nftnl_expr_get_str(e, NFTNL_EXPR_DYNSET_SET_NAME);
        int m = snprintf(buf + n, size - (size_t)n, "op %u key %u set %s",
                         nftnl_expr_get_u32(e, NFTNL_EXPR_DYNSET_OP),
                         nftnl_expr_get_u32(e, NFTNL_EXPR_DYNSET_SREG_KEY), set ? set : "?");
        return m < 0 || (size_t)m >= size - (size_t)n ? -1 : 0;
    }
    int m = nftnl_expr_snprintf(buf + n, size - (size_t)n, e, NFTNL_OUTPUT_DEFAULT, 0);
    return m < 0 || (size_t)m >= size - (size_t)n ? -1 : 0;
}

static int rule_equal(const struct nftnl_rule *want, const struct nftnl_rule *got)
{
    char a[512], b[512];
    int equal = 1;
    struct nftnl_expr_iter *iw = nftnl_expr_iter_create(want);
    struct nftnl_expr_iter *ig = nftnl_expr_iter_create(got);
    if (!iw || !ig) {
        equal = -ENOMEM;
    } else {
        for (;;) {
            struct nftnl_expr *ew = nftnl_expr_iter_next(iw);
            struct nftnl_expr *eg = nftnl_expr_iter_next(ig);
            if (!ew || !eg) {
                equal = !ew && !eg;
                break;
            }
            if (expr_text(ew, a, sizeof a) < 0 || expr_text(eg, b, sizeof b) < 0 ||
                strcmp(a, b) != 0) {
                equal = 0;
                break;
            }
        }
    }
    if (iw) nftnl_expr_iter_destroy(iw);
    if (ig) nftnl_expr_iter_destroy(ig);
    return equal;
}

static int chain_matches(const struct nftnl_chain *c, const struct chain_spec *spec)
{
    return nftnl_chain_is_set(c, NFTNL_CHAIN_HOOKNUM) && nftnl_chain_is_set(c, NFTNL_CHAIN_PRIO) &&
           nftnl_chain_is_set(c, NFTNL_CHAIN_POLICY) &&
           nftnl_chain_get_u32(c, NFTNL_CHAIN_HOOKNUM) == spec->hook &&
           nftnl_chain_get_s32(c, NFTNL_CHAIN_PRIO) == spec->prio &&
           nftnl_chain_get_u32(c, NFTNL_CHAIN_POLICY) == spec->policy &&
           str_eq(nftnl_chain_get_str(c, NFTNL_CHAIN_TYPE), spec->type);
}

static int compare(const struct readback *rb, const struct ruleset *want, size_t nchains)
{
    if (rb->table_flags != 0) return -EPROTO; /* dormant, or owned by some socket */
    if (rb->overflow || rb->nchain != nchains || rb->nrule != want->n) return -EPROTO;
    for (size_t i = 0; i < nchains; i++) {
        const struct nftnl_chain *c = NULL;
        for (size_t j = 0; j < rb->nchain; j++)
            if (str_eq(nftnl_chain_get_str(rb->chain[j], NFTNL_CHAIN_NAME), CHAINS[i].name))
                c = rb->chain[j];
        if (!c || !chain_matches(c, &CHAINS[i])) return -EPROTO;

        /* The rules of this chain, in kernel order, against the plan's, in plan order. */
        size_t g = 0;
        for (size_t w = 0; w < want->n; w++) {
            if (!str_eq(nftnl_rule_get_str(want->rule[w], NFTNL_RULE_CHAIN), CHAINS[i].name))
                continue;
            while (g < rb->nrule &&
                   !str_eq(nftnl_rule_get_str(rb->rule[g], NFTNL_RULE_CHAIN), CHAINS[i].name))
                g++;
            if (g == rb->nrule) return -EPROTO;
            int eq = rule_equal(want->rule[w], rb->rule[g]);
            if (eq < 0) return eq;
            if (!eq) return -EPROTO;
            g++;
        }
        while (g < rb->nrule) {
            if (str_eq(nftnl_rule_get_str(rb->rule[g], NFTNL_RULE_CHAIN), CHAINS[i].name))
                return -EPROTO;
            g++;
        }
    }
    return 0;
}

/* Calls use(nl, rb, arg) on table's ruleset as read back from netns_fd. A dump that raced
 * with a ruleset change (NLM_F_DUMP_INTR: -EINTR from the read-back or from use) is read
 * again from the start on a fresh socket: the rest of the interrupted dump is still
 * queued on the old one. Returns use's result, -errno, or -EAGAIN after VERIFY_TRIES. */
static int with_read_back(int netns_fd, const char *table,
                          int (*use)(struct mnl_socket *nl, const struct readback *rb, void *arg),
                          void *arg)
{
    for (int tries = 0; tries < VERIFY_TRIES; tries++) {
        _cleanup_nl_ struct mnl_socket *nl = NULL;
        _cleanup_readback_ struct readback rb = {.table = table};
        int err = nft_open(netns_fd, &nl);
        if (err) return err;
        err = read_back(nl, &rb);
        if (!err) err = use(nl, &rb, arg);
        if (err != -EINTR) return err;
    }
    return -EAGAIN;
}

struct expected {
    const struct ruleset *rules;
    size_t nchains;
};

static int compare_read_back(struct mnl_socket *nl, const struct readback *rb, void *arg)
{
    (void)nl;
    const struct expected *want = arg;
    return compare(rb, want->rules, want->nchains);
}

int corral_nft_verify(int netns_fd, const struct corral_nft_plan *plan)
{
    const char *table;
    _cleanup_ruleset_ struct ruleset rs = {.n = 0};
    int err = plan_table(plan, &table);
    if (err) return err;
    struct corral_nft_plan good = *plan;
    good.test_bad_message = false;
    err = build_rules(&good, table, &rs);
    if (err) return err;
    struct expected want = {.rules = &rs, .nchains = plan_chains(plan)};
    return with_read_back(netns_fd, table, compare_read_back, &want);
}

/* ---- refusals ---- */

struct refusals {
    const struct refused_set *set;
    struct corral_nft_refusal *out;
    size_t max, n;
    int err;
    const char *table;
    uint64_t total;
};

static int counter_packets(struct nftnl_expr *e, void *data)
{
    const char *name = nftnl_expr_get_str(e, NFTNL_EXPR_NAME);
    if (name && strcmp(name, "counter") == 0)
        *(uint64_t *)data += nftnl_expr_get_u64(e, NFTNL_EXPR_CTR_PACKETS);
    return 0;
}

static void take_element(struct refusals *r, struct nftnl_set_elem *e)
{
    uint32_t len = 0;
    const uint8_t *key = nftnl_set_elem_get(e, NFTNL_SET_ELEM_KEY, &len);
    uint64_t packets = 0;
    if (!key || len != r->set->key_len) {
        r->err = -EPROTO;
        return;
    }
    nftnl_set_elem_expr_foreach(e, counter_packets, &packets);
    if (r->n == r->max) return;
    struct corral_nft_refusal *o = &r->out[r->n++];
    memset(o, 0, sizeof *o);
    memcpy(o->addr, key, r->set->addr_len);
    o->addr_len = (uint8_t)r->set->addr_len;
    o->proto = r->set->proto;
    uint16_t be;
    memcpy(&be, key + r->set->addr_len, sizeof be);
    o->port = ntohs(be);
    o->packets = packets;
}

static int elems_cb(const struct nlmsghdr *nlh, void *data)
{
    struct refusals *r = data;
    struct nftnl_set *s = nftnl_set_alloc();
    if (!s) {
        errno = ENOMEM;
        return MNL_CB_ERROR;
    }
    if (nftnl_set_elems_nlmsg_parse(nlh, s) < 0) {
        nftnl_set_free(s);
        errno = EPROTO;
        return MNL_CB_ERROR;
    }
    struct nftnl_set_elems_iter *it = nftnl_set_elems_iter_create(s);
    if (it) {
        /* iter_next returns the current element and moves on: starting from iter_cur
         * would read the first element twice. */
        for (struct nftnl_set_elem *e = nftnl_set_elems_iter_next(it); e;
             e = nftnl_set_elems_iter_next(it))
            take_element(r, e);
        nftnl_set_elems_iter_destroy(it);
    } else {
        r->err = -ENOMEM;
    }
    nftnl_set_free(s);
    return MNL_CB_OK;
}

static int read_elements(struct mnl_socket *nl, const char *table, struct refusals *r)
{
    char buf[1024];
    struct nftnl_set *s = nftnl_set_alloc();
    if (!s) return -ENOMEM;
    if (nftnl_set_set_str(s, NFTNL_SET_TABLE, table) < 0 ||
        nftnl_set_set_str(s, NFTNL_SET_NAME, r->set->name) < 0) {
        nftnl_set_free(s);
        return -ENOMEM;
    }
    struct nlmsghdr *nlh =
        nftnl_nlmsg_build_hdr(buf, NFT_MSG_GETSETELEM, NFPROTO_INET, NLM_F_DUMP, 0);
    nftnl_set_elems_nlmsg_build_payload(nlh, s);
    nftnl_set_free(s);
    int err = corral_netlink_talk(nl, nlh, elems_cb, r);
    return err ? err : r->err;
}

/* The filter chain's refusal counters and the refused sets' elements into r. */
static int read_refusals(struct mnl_socket *nl, const struct readback *rb, void *arg)
{
    struct refusals *r = arg;
    r->total = 0;
    r->n = 0;
    r->err = 0;
    for (size_t i = 0; i < rb->nrule; i++)
        if (str_eq(nftnl_rule_get_str(rb->rule[i], NFTNL_RULE_CHAIN), CORRAL_NFT_FILTER_CHAIN))
            nftnl_expr_foreach(rb->rule[i], counter_packets, &r->total);
    int err = 0;
    for (size_t i = 0; !err && i < NREFUSED; i++) {
        r->set = &REFUSED[i];
        err = read_elements(nl, r->table, r);
    }
    return err;
}

int corral_nft_refused(int netns_fd, const char *table, struct corral_nft_refusal *out, size_t max,
                       size_t *n, uint64_t *total)
{
    if (!table) table = CORRAL_NFT_TABLE;
    size_t len = strlen(table);
    if (len == 0 || len >= NFT_TABLE_MAXNAMELEN || (max && !out)) return -EINVAL;
    struct refusals r = {.out = out, .max = max, .table = table};
    int err = with_read_back(netns_fd, table, read_refusals, &r);
    if (err) return err;
    *n = r.n;
    *total = r.total;
    return 0;
}

static const char *hook_name(uint32_t hook)
{
    static const char *const names[] = {"prerouting", "input", "forward", "output", "postrouting"};
    return hook < sizeof names / sizeof names[0] ? names[hook] : "?";
}

static void dump_rule(FILE *out, const struct nftnl_rule *r)
{
    char buf[512];
    fprintf(out, "    rule %llu:", (unsigned long long)nftnl_rule_get_u64(r, NFTNL_RULE_HANDLE));
    struct nftnl_expr_iter *it = nftnl_expr_iter_create(r);
    for (struct nftnl_expr *e = it ? nftnl_expr_iter_next(it) : NULL; e;
         e = nftnl_expr_iter_next(it)) {
        if (expr_text(e, buf, sizeof buf) < 0) snprintf(buf, sizeof buf, "?");
        size_t n = strlen(buf);
        while (n > 0 && buf[n - 1] == ' ')
            buf[--n] = '\0';
        fprintf(out, " [%s]", buf);
    }
    if (it) nftnl_expr_iter_destroy(it);
    fputc('\n', out);
}

static void dump(FILE *out, const struct readback *rb)
{
    fprintf(out, "table inet %s flags %u\n", rb->table, rb->table_flags);
    for (size_t i = 0; i < rb->nchain; i++) {
        const struct nftnl_chain *c = rb->chain[i];
        const char *name = nftnl_chain_get_str(c, NFTNL_CHAIN_NAME);
        fprintf(out, "  chain %s", name ? name : "?");
        if (nftnl_chain_is_set(c, NFTNL_CHAIN_HOOKNUM)) {
            const char *type = nftnl_chain_get_str(c, NFTNL_CHAIN_TYPE);
            uint32_t policy = nftnl_chain_get_u32(c, NFTNL_CHAIN_POLICY);
            fprintf(out, " type %s hook %s priority %d policy %s", type ? type : "?",
                    hook_name(nftnl_chain_get_u32(c, NFTNL_CHAIN_HOOKNUM)),
                    nftnl_chain_get_s32(c, NFTNL_CHAIN_PRIO),
                    policy == NF_DROP     ? "drop"
                    : policy == NF_ACCEPT ? "accept"
                                          : "?");
        }
        fputc('\n', out);
        for (size_t j = 0; j < rb->nrule; j++)
            if (str_eq(nftnl_rule_get_str(rb->rule[j], NFTNL_RULE_CHAIN), name))
                dump_rule(out, rb->rule[j]);
    }
    if (rb->overflow) fputs("  (more than fit the read-back: not shown)\n", out);
}

struct dump_text {
    char **text;
    size_t *len;
};

static int dump_read_back(struct mnl_socket *nl, const struct readback *rb, void *arg)
{
    (void)nl;
    const struct dump_text *t = arg;
    FILE *out = open_memstream(t->text, t->len);
    if (out == NULL) return -errno;
    dump(out, rb);
    if (fclose(out) != 0) {
        free(*t->text);
        *t->text = NULL;
        return -ENOMEM;
    }
    return 0;
}

int corral_nft_dump(int netns_fd, const char *table, char **text, size_t *len)
{
    if (table == NULL) table = CORRAL_NFT_TABLE;
    struct dump_text t = {.text = text, .len = len};
    return with_read_back(netns_fd, table, dump_read_back, &t);
}
