/*
 * libFuzzer target for the DNS codec (core/lib/dns.c): every input is a datagram a
 * hostile tenant could send to the responder. Besides the sanitizers' verdict, it checks:
 *  - a parse failure maps to a drop or to a header-only answer that echoes the id, and
 *    names a reason whose errno is the one returned, described within any buffer;
 *  - a parsed query yields a lowercase, NUL-free presentation name whose escapes agree
 *    with the hostname flag;
 *  - every kind of answer builds within CORRAL_DNS_ANSWER_MAX, fails cleanly one octet
 *    short, and carries the question back intact: turned back into a query (QR cleared,
 *    answer cut off) it parses to the same id, name, qtype and qclass.
 * Built and run by scripts/run-fuzz.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dns.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static void check_name(const struct corral_dns_query *q)
{
    ASSERT(q->name_len < sizeof q->name && strlen(q->name) == q->name_len);
    int escaped = 0;
    for (size_t i = 0; i < q->name_len; i++) {
        char c = q->name[i];
        ASSERT(c > ' ' && c < 0x7f && !(c >= 'A' && c <= 'Z'));
        if (c == '\\') escaped = 1;
    }
    ASSERT(q->hostname == !escaped);
    ASSERT(q->question_len >= 5 && q->question_len <= sizeof q->question);
}

/* The reason agrees with the errno, has a name, and its sentence fits or is cut safely. */
static void check_reason(const struct corral_dns_query *q, int r)
{
    enum corral_dns_reason why = q->reason;
    ASSERT(why > CORRAL_DNS_REASON_NONE && why < CORRAL_DNS_REASON_COUNT);
    ASSERT((why == CORRAL_DNS_REASON_SHORT) == (r == -EMSGSIZE));
    ASSERT((why == CORRAL_DNS_REASON_RESPONSE) == (r == -EPROTO));
    ASSERT((why == CORRAL_DNS_REASON_OPCODE) == (r == -EOPNOTSUPP));
    ASSERT(strcmp(corral_dns_reason_to_string(why), "unknown") != 0);
    char buf[128], tiny[4];
    int n = corral_dns_describe(q, buf, sizeof buf);
    ASSERT(n > 0 && (size_t)n < sizeof buf && strlen(buf) == (size_t)n);
    ASSERT(corral_dns_describe(q, tiny, sizeof tiny) == n && strlen(tiny) == sizeof tiny - 1);
}

static void round_trip(const struct corral_dns_query *q, int rcode, const uint8_t *addr,
                       size_t addr_len)
{
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    int n = corral_dns_build_answer(q, out, sizeof out, rcode, addr, addr_len, 300);
    ASSERT(n == (int)(CORRAL_DNS_HEADER_LEN + q->question_len + (addr ? 12 + addr_len : 0)));
    ASSERT(corral_dns_build_answer(q, out, (size_t)n - 1, rcode, addr, addr_len, 300) == -ENOSPC);
    ASSERT(get16(out) == q->id);
    uint16_t flags = get16(out + 2);
    ASSERT((flags & CORRAL_DNS_FLAG_QR) && (flags & CORRAL_DNS_FLAG_AA));
    ASSERT(!(flags & CORRAL_DNS_FLAG_RA) && (int)(flags & CORRAL_DNS_FLAG_RCODE) == rcode);
    ASSERT(!!(flags & CORRAL_DNS_FLAG_RD) == q->rd);
    ASSERT(get16(out + 4) == 1 && get16(out + 6) == (addr ? 1 : 0));
    if (addr) {
        const uint8_t *rr = out + CORRAL_DNS_HEADER_LEN + q->question_len;
        ASSERT(get16(rr) == 0xc00c && get16(rr + 2) == q->qtype);
        ASSERT(get16(rr + 10) == addr_len && memcmp(rr + 12, addr, addr_len) == 0);
    }

    /* the question back as a query */
    out[2] &= 0x7f;
    out[6] = out[7] = 0;
    struct corral_dns_query back;
    ASSERT(corral_dns_parse_query(out, CORRAL_DNS_HEADER_LEN + q->question_len, &back) == 0);
    ASSERT(back.id == q->id && back.qtype == q->qtype && back.qclass == q->qclass);
    ASSERT(back.name_len == q->name_len && memcmp(back.name, q->name, q->name_len + 1) == 0);
    ASSERT(back.hostname == q->hostname && back.edns == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct corral_dns_query q;
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    static const uint8_t v4[4] = {198, 18, 0, 1};
    static const uint8_t v6[16] = {0xfd, 0x00, 0xc0, 0x44, [15] = 1};

    int r = corral_dns_parse_query(data, size, &q);
    if (r < 0) {
        ASSERT(r == -EMSGSIZE || r == -EPROTO || r == -EBADMSG || r == -EOPNOTSUPP);
        ASSERT(q.question_len == 0 && q.name_len == 0 && q.qtype == 0 && !q.hostname && !q.edns);
        check_reason(&q, r);
        int rcode = corral_dns_error_rcode(r);
        if (rcode < 0) {
            ASSERT(r == -EMSGSIZE || r == -EPROTO);
            return 0;
        }
        int n = corral_dns_build_answer(&q, out, sizeof out, rcode, NULL, 0, 0);
        ASSERT(n == CORRAL_DNS_HEADER_LEN && get16(out) == get16(data));
        ASSERT(get16(out + 4) == 0 && (int)(get16(out + 2) & CORRAL_DNS_FLAG_RCODE) == rcode);
        ASSERT(corral_dns_build_answer(&q, out, sizeof out, 0, v4, 4, 0) == -EINVAL);
        return 0;
    }

    ASSERT(q.reason == CORRAL_DNS_REASON_NONE);
    ASSERT(size >= CORRAL_DNS_HEADER_LEN + q.question_len);
    ASSERT(memcmp(q.question, data + CORRAL_DNS_HEADER_LEN, q.question_len) == 0);
    check_name(&q);
    round_trip(&q, CORRAL_DNS_NOERROR, NULL, 0);
    round_trip(&q, CORRAL_DNS_NXDOMAIN, NULL, 0);
    round_trip(&q, CORRAL_DNS_REFUSED, NULL, 0);
    round_trip(&q, CORRAL_DNS_SERVFAIL, NULL, 0);
    int in = q.qclass == CORRAL_DNS_CLASS_IN;
    if (in && q.qtype == CORRAL_DNS_TYPE_A) round_trip(&q, CORRAL_DNS_NOERROR, v4, 4);
    if (in && q.qtype == CORRAL_DNS_TYPE_AAAA) round_trip(&q, CORRAL_DNS_NOERROR, v6, 16);
    /* the wrong family, or an address for any other question, never makes an answer */
    int a = in && q.qtype == CORRAL_DNS_TYPE_A;
    ASSERT(corral_dns_build_answer(&q, out, sizeof out, 0, a ? v6 : v4, a ? 16 : 4, 0) == -EINVAL);
    return 0;
}
