/*
 * The DNS codec against hand-built packets: a well-formed query for each kind of answer
 * (the controls), then every malformed shape a hostile tenant can send, each with the
 * result it must get. Each bad packet is copied into a heap buffer of exactly its length,
 * so that the ASan build (make asan) flags any read past the end.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dns.h"

struct pkt {
    uint8_t b[2048];
    size_t n;
};

static void put(struct pkt *p, const void *src, size_t n)
{
    memcpy(p->b + p->n, src, n);
    p->n += n;
}

static void put8(struct pkt *p, unsigned v)
{
    p->b[p->n++] = (uint8_t)v;
}

static void put16(struct pkt *p, unsigned v)
{
    put8(p, v >> 8);
    put8(p, v & 0xff);
}

static void header(struct pkt *p, unsigned id, unsigned flags, unsigned qd, unsigned an,
                   unsigned ns, unsigned ar)
{
    p->n = 0;
    put16(p, id);
    put16(p, flags);
    put16(p, qd);
    put16(p, an);
    put16(p, ns);
    put16(p, ar);
}

/* "pypi.org" -> 4 p y p i 3 o r g 0 */
static void name(struct pkt *p, const char *dotted)
{
    while (*dotted) {
        const char *dot = strchr(dotted, '.');
        size_t l = dot ? (size_t)(dot - dotted) : strlen(dotted);
        put8(p, (unsigned)l);
        put(p, dotted, l);
        dotted += l;
        if (*dotted == '.') dotted++;
    }
    put8(p, 0);
}

static void query(struct pkt *p, unsigned id, const char *dotted, unsigned qtype)
{
    header(p, id, 0x0100, 1, 0, 0, 0);
    name(p, dotted);
    put16(p, qtype);
    put16(p, 1);
}

/* A query whose name is three labels of 63 octets and one of last, each octet `octet`:
 * 255 wire octets with last = 61 (the longest legal name), 256 with last = 62. */
static void long_query(struct pkt *p, unsigned last, unsigned octet)
{
    header(p, 1, 0, 1, 0, 0, 0);
    for (int l = 0; l < 4; l++) {
        unsigned ll = l < 3 ? 63 : last;
        put8(p, ll);
        for (unsigned i = 0; i < ll; i++)
            put8(p, octet);
    }
    put8(p, 0);
    put16(p, 1);
    put16(p, 1);
}

static void opt(struct pkt *p, unsigned rdlen)
{
    put8(p, 0);
    put16(p, 41);
    put16(p, 1232);
    put16(p, 0);
    put16(p, 0);
    put16(p, rdlen);
    for (unsigned i = 0; i < rdlen; i++)
        put8(p, 0);
}

/* Parses a heap copy of exactly n octets, so ASan sees any overread. */
static int parse_exact(const uint8_t *b, size_t n, struct corral_dns_query *q)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) abort();
    memcpy(copy, b, n);
    int r = corral_dns_parse_query(copy, n, q);
    free(copy);
    return r;
}

static int parse(const struct pkt *p, struct corral_dns_query *q)
{
    return parse_exact(p->b, p->n, q);
}

static unsigned get16(const uint8_t *b)
{
    return (unsigned)b[0] << 8 | b[1];
}

static void test_a_query_and_answer(void)
{
    struct pkt p;
    struct corral_dns_query q;
    query(&p, 0xbeef, "pypi.org", 1);
    CHECK(parse(&p, &q) == 0);
    CHECK(q.id == 0xbeef);
    CHECK(q.qtype == CORRAL_DNS_TYPE_A && q.qclass == CORRAL_DNS_CLASS_IN);
    CHECK(strcmp(q.name, "pypi.org") == 0 && q.name_len == 8);
    CHECK(q.rd == 1 && q.hostname == 1 && q.edns == 0);
    CHECK(q.question_len == 10 + 4);

    const uint8_t addr[4] = {198, 18, 0, 7};
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    int n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NOERROR, addr, 4, 60);
    CHECK(n == 12 + 14 + 16);
    CHECK(get16(out) == 0xbeef);
    /* QR, AA, RD copied, RA = 0, NOERROR */
    CHECK(get16(out + 2) == 0x8500);
    CHECK(get16(out + 4) == 1 && get16(out + 6) == 1 && get16(out + 8) == 0 &&
          get16(out + 10) == 0);
    CHECK(memcmp(out + 12, p.b + 12, 14) == 0);
    const uint8_t *rr = out + 26;
    CHECK(get16(rr) == 0xc00c);
    CHECK(get16(rr + 2) == 1 && get16(rr + 4) == 1);
    CHECK(get16(rr + 6) == 0 && get16(rr + 8) == 60);
    CHECK(get16(rr + 10) == 4);
    CHECK(memcmp(rr + 12, addr, 4) == 0);

    /* the capacity bound: one octet short fails, the exact size succeeds */
    CHECK(corral_dns_build_answer(&q, out, (size_t)n - 1, 0, addr, 4, 60) == -ENOSPC);
    CHECK(corral_dns_build_answer(&q, out, (size_t)n, 0, addr, 4, 60) == n);
    /* an A question takes a 4-octet address only, and only with NOERROR */
    const uint8_t v6[16] = {0xfd, 0};
    CHECK(corral_dns_build_answer(&q, out, sizeof out, 0, v6, 16, 60) == -EINVAL);
    CHECK(corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NXDOMAIN, addr, 4, 60) ==
          -EINVAL);
    CHECK(corral_dns_build_answer(&q, out, sizeof out, 0, addr, 4, 0x80000000u) == -EINVAL);
    CHECK(corral_dns_build_answer(&q, out, sizeof out, 16, NULL, 0, 0) == -EINVAL);
}

static void test_aaaa_nodata_nxdomain_refused(void)
{
    struct pkt p;
    struct corral_dns_query q;
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    query(&p, 7, "files.pythonhosted.org", 28);
    CHECK(parse(&p, &q) == 0);
    CHECK(q.qtype == CORRAL_DNS_TYPE_AAAA);
    const uint8_t v6[16] = {0xfd, 0x00, 0xc0, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};
    int n = corral_dns_build_answer(&q, out, sizeof out, 0, v6, 16, 0);
    CHECK(n == (int)(12 + q.question_len + 12 + 16));
    CHECK(get16(out + n - 18) == 16);
    CHECK(get16(out + n - 26) == 28);
    CHECK(memcmp(out + n - 16, v6, 16) == 0);

    /* NODATA: NOERROR, the question, no answer */
    n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NOERROR, NULL, 0, 0);
    CHECK(n == (int)(12 + q.question_len));
    CHECK((get16(out + 2) & 0xf) == 0 && get16(out + 4) == 1 && get16(out + 6) == 0);

    n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NXDOMAIN, NULL, 0, 0);
    CHECK(n == (int)(12 + q.question_len) && get16(out + 2) == 0x8503);

    query(&p, 8, "pypi.org", 16);
    CHECK(parse(&p, &q) == 0 && q.qtype == CORRAL_DNS_TYPE_TXT);
    n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_REFUSED, NULL, 0, 0);
    CHECK(n == (int)(12 + q.question_len) && get16(out + 2) == 0x8505);
    /* an address for a TXT question makes no answer */
    const uint8_t addr[4] = {198, 18, 0, 1};
    CHECK(corral_dns_build_answer(&q, out, sizeof out, 0, addr, 4, 0) == -EINVAL);
}

static void test_name_forms(void)
{
    struct pkt p;
    struct corral_dns_query q;
    /* uppercase is lowercased in the name, kept as received in the echoed question */
    query(&p, 1, "PyPI.Org", 1);
    CHECK(parse(&p, &q) == 0);
    CHECK(strcmp(q.name, "pypi.org") == 0 && q.hostname == 1);
    CHECK(memcmp(q.question, p.b + 12, q.question_len) == 0 && q.question[1] == 'P');

    /* the root: one zero octet */
    header(&p, 2, 0, 1, 0, 0, 0);
    put8(&p, 0);
    put16(&p, 2);
    put16(&p, 1);
    CHECK(parse(&p, &q) == 0);
    CHECK(q.name_len == 0 && q.name[0] == '\0' && q.rd == 0 && q.question_len == 5);

    /* a label holding a dot cannot pose as two labels; and is not a hostname */
    header(&p, 3, 0, 1, 0, 0, 0);
    put8(&p, 8);
    put(&p, "pypi.org", 8);
    put8(&p, 0);
    put16(&p, 1);
    put16(&p, 1);
    CHECK(parse(&p, &q) == 0);
    CHECK(strcmp(q.name, "pypi\\046org") == 0 && q.hostname == 0);

    /* NUL, backslash and high octets are escaped; '_' and '-' are hostname octets */
    header(&p, 4, 0, 1, 0, 0, 0);
    put8(&p, 4);
    put(&p, "a\0\\\xff", 4);
    put8(&p, 5);
    put(&p, "_x-y9", 5);
    put8(&p, 0);
    put16(&p, 1);
    put16(&p, 1);
    CHECK(parse(&p, &q) == 0);
    CHECK(strcmp(q.name, "a\\000\\092\\255._x-y9") == 0 && q.hostname == 0);
    query(&p, 5, "_x-y9.example", 1);
    CHECK(parse(&p, &q) == 0 && q.hostname == 1);

    /* largest legal name: 255 wire octets (3 * 64 + 62 + root), all escaped: the
     * presentation buffer's worst case */
    long_query(&p, 61, 0xff);
    CHECK(p.n == 12 + 255 + 4);
    CHECK(parse(&p, &q) == 0);
    CHECK(q.name_len == 250 * 4 + 3 && strlen(q.name) == q.name_len);
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    CHECK(corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NXDOMAIN, NULL, 0, 0) ==
          12 + 259);
}

static void test_edns(void)
{
    struct pkt p;
    struct corral_dns_query q;
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1; /* arcount */
    opt(&p, 0);
    CHECK(parse(&p, &q) == 0 && q.edns == 1 && strcmp(q.name, "pypi.org") == 0);
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1;
    opt(&p, 12); /* a cookie option's worth of RDATA */
    CHECK(parse(&p, &q) == 0 && q.edns == 1);
    /* the answer does not carry the OPT along */
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    const uint8_t addr[4] = {198, 18, 0, 2};
    int n = corral_dns_build_answer(&q, out, sizeof out, 0, addr, 4, 0);
    CHECK(n == 12 + 14 + 16 && get16(out + 10) == 0);

    /* RDATA running past the end */
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1;
    opt(&p, 12);
    CHECK(parse_exact(p.b, p.n - 1, &q) == -EBADMSG);
    /* a non-OPT additional record, or an OPT with a non-root owner */
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1;
    opt(&p, 0);
    p.b[p.n - 10] = 0;
    p.b[p.n - 9] = 250; /* TSIG */
    CHECK(parse(&p, &q) == -EBADMSG && q.id == 9);
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1;
    put8(&p, 1);
    put8(&p, 'x');
    opt(&p, 0);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* arcount 1 with nothing there; arcount 2 */
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 1;
    CHECK(parse(&p, &q) == -EBADMSG);
    query(&p, 9, "pypi.org", 1);
    p.b[11] = 2;
    opt(&p, 0);
    opt(&p, 0);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* trailing octets after the question */
    query(&p, 9, "pypi.org", 1);
    put8(&p, 0);
    CHECK(parse(&p, &q) == -EBADMSG);
}

static void test_bad_shapes(void)
{
    struct pkt p;
    struct corral_dns_query q;
    uint8_t out[CORRAL_DNS_ANSWER_MAX];

    /* short headers: 0..11 octets are dropped, 12 is a header (then malformed) */
    query(&p, 0x1234, "pypi.org", 1);
    for (size_t n = 0; n < 12; n++)
        CHECK(parse_exact(p.b, n, &q) == -EMSGSIZE);
    CHECK(parse_exact(p.b, 12, &q) == -EBADMSG && q.id == 0x1234);
    CHECK(corral_dns_error_rcode(-EMSGSIZE) < 0);

    /* every truncation of a valid query is malformed, never read past */
    for (size_t n = 12; n < p.n; n++)
        CHECK(parse_exact(p.b, n, &q) == -EBADMSG && q.question_len == 0 && q.name_len == 0);
    CHECK(parse_exact(p.b, p.n, &q) == 0);

    /* a pointer to itself (c0 0c at offset 12: the loop) */
    header(&p, 1, 0, 1, 0, 0, 0);
    put16(&p, 0xc00c);
    put16(&p, 1);
    put16(&p, 1);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* a pointer after a label, to the label (the loop one step later) */
    header(&p, 1, 0, 1, 0, 0, 0);
    put8(&p, 1);
    put8(&p, 'a');
    put16(&p, 0xc00c);
    put16(&p, 1);
    put16(&p, 1);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* a forward pointer into the rest of the packet */
    header(&p, 1, 0, 1, 0, 0, 0);
    put16(&p, 0xc012);
    put16(&p, 1);
    put16(&p, 1);
    name(&p, "pypi.org");
    CHECK(parse(&p, &q) == -EBADMSG);
    /* extended label types 0x40 and 0x80 */
    header(&p, 1, 0, 1, 0, 0, 0);
    put8(&p, 0x41);
    put8(&p, 0);
    put16(&p, 1);
    put16(&p, 1);
    CHECK(parse(&p, &q) == -EBADMSG);
    p.b[12] = 0x81;
    CHECK(parse(&p, &q) == -EBADMSG);

    /* label length 64 (control: 63 parses) */
    for (unsigned ll = 63; ll <= 64; ll++) {
        header(&p, 1, 0, 1, 0, 0, 0);
        put8(&p, ll);
        for (unsigned i = 0; i < ll; i++)
            put8(&p, 'a');
        put8(&p, 0);
        put16(&p, 1);
        put16(&p, 1);
        CHECK(parse(&p, &q) == (ll == 63 ? 0 : -EBADMSG));
    }
    /* a 256-octet name (control: the 255-octet one in test_name_forms) */
    long_query(&p, 62, 'a');
    CHECK(p.n == 12 + 256 + 4);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* a long run of labels that never ends within 255 octets */
    header(&p, 1, 0, 1, 0, 0, 0);
    for (int i = 0; i < 600; i++) {
        put8(&p, 1);
        put8(&p, 'a');
    }
    CHECK(parse(&p, &q) == -EBADMSG);

    /* a label running past the end */
    header(&p, 1, 0, 1, 0, 0, 0);
    put8(&p, 10);
    put(&p, "pypi", 4);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* a name without its root label */
    header(&p, 1, 0, 1, 0, 0, 0);
    put8(&p, 4);
    put(&p, "pypi", 4);
    CHECK(parse(&p, &q) == -EBADMSG);
    /* truncated qtype / qclass */
    query(&p, 1, "pypi.org", 1);
    CHECK(parse_exact(p.b, p.n - 1, &q) == -EBADMSG);
    CHECK(parse_exact(p.b, p.n - 3, &q) == -EBADMSG);
    CHECK(parse_exact(p.b, p.n - 4, &q) == -EBADMSG);

    /* qdcount 0, 2 and 65535 (control: 1 parses) */
    unsigned qds[] = {1, 0, 2, 65535};
    for (size_t i = 0; i < sizeof qds / sizeof qds[0]; i++) {
        query(&p, 0x4242, "pypi.org", 1);
        p.b[4] = (uint8_t)(qds[i] >> 8);
        p.b[5] = (uint8_t)qds[i];
        CHECK(parse(&p, &q) == (qds[i] == 1 ? 0 : -EBADMSG));
    }
    /* FORMERR for one: header only, id kept, RD echoed */
    int n =
        corral_dns_build_answer(&q, out, sizeof out, corral_dns_error_rcode(-EBADMSG), NULL, 0, 0);
    CHECK(n == 12 && get16(out) == 0x4242 && get16(out + 2) == 0x8101 && get16(out + 4) == 0);
    const uint8_t addr[4] = {1, 2, 3, 4};
    CHECK(corral_dns_build_answer(&q, out, sizeof out, 0, addr, 4, 0) == -EINVAL);

    /* an answer or authority record in a query */
    query(&p, 1, "pypi.org", 1);
    p.b[7] = 1;
    CHECK(parse(&p, &q) == -EBADMSG);
    query(&p, 1, "pypi.org", 1);
    p.b[9] = 1;
    CHECK(parse(&p, &q) == -EBADMSG);

    /* QR set: a response, dropped */
    query(&p, 1, "pypi.org", 1);
    p.b[2] |= 0x80;
    CHECK(parse(&p, &q) == -EPROTO && corral_dns_error_rcode(-EPROTO) < 0);
    /* opcode 2 (STATUS) and 5 (UPDATE): NOTIMP, opcode echoed */
    for (unsigned op = 2; op <= 5; op += 3) {
        query(&p, 0x77, "pypi.org", 1);
        p.b[2] |= (uint8_t)(op << 3);
        CHECK(parse(&p, &q) == -EOPNOTSUPP);
        CHECK(corral_dns_error_rcode(-EOPNOTSUPP) == CORRAL_DNS_NOTIMP);
        n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NOTIMP, NULL, 0, 0);
        CHECK(n == 12 && get16(out) == 0x77 && get16(out + 2) == (0x8104 | op << 11));
    }
}

/* Parses p and checks the result, the reason, its name and the sentence it describes. */
static void expect(const struct pkt *p, size_t n, int err, enum corral_dns_reason reason,
                   const char *reason_name, const char *why)
{
    struct corral_dns_query q;
    char buf[128];
    CHECK(parse_exact(p->b, n, &q) == err);
    CHECK(q.reason == reason);
    CHECK(strcmp(corral_dns_reason_to_string(q.reason), reason_name) == 0);
    CHECK(corral_dns_describe(&q, buf, sizeof buf) == (int)strlen(why));
    CHECK(strcmp(buf, why) == 0);
}

/* Each reason code for the shape that breaks its rule, with a well-formed control. */
static void test_reasons(void)
{
    struct pkt p;
    query(&p, 1, "pypi.org", 1);
    expect(&p, p.n, 0, CORRAL_DNS_REASON_NONE, "none", "well-formed"); /* the control */
    expect(&p, 5, -EMSGSIZE, CORRAL_DNS_REASON_SHORT, "short",
           "5 bytes: shorter than a DNS header");

    p.b[2] |= 0x80;
    expect(&p, p.n, -EPROTO, CORRAL_DNS_REASON_RESPONSE, "response",
           "a response (QR set), not a query: not answered");
    query(&p, 1, "pypi.org", 1);
    p.b[2] |= 2 << 3;
    expect(&p, p.n, -EOPNOTSUPP, CORRAL_DNS_REASON_OPCODE, "opcode",
           "opcode 2: only QUERY (0) is answered");

    query(&p, 1, "pypi.org", 1);
    p.b[5] = 2;
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_QDCOUNT, "qdcount",
           "QDCOUNT 2: exactly one question is answered");
    query(&p, 1, "pypi.org", 1);
    p.b[7] = 1;
    p.b[9] = 3;
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_RECORDS, "records",
           "ANCOUNT 1, NSCOUNT 3: a query carries neither");
    query(&p, 1, "pypi.org", 1);
    p.b[11] = 2;
    opt(&p, 0);
    opt(&p, 0);
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_ARCOUNT, "arcount",
           "ARCOUNT 2: at most one (OPT) record");

    /* the header alone, then a label running past the end */
    query(&p, 1, "pypi.org", 1);
    expect(&p, 12, -EBADMSG, CORRAL_DNS_REASON_NAME_TRUNCATED, "name_truncated",
           "the question's name is truncated");
    expect(&p, 15, -EBADMSG, CORRAL_DNS_REASON_NAME_TRUNCATED, "name_truncated",
           "the question's name is truncated");
    header(&p, 1, 0, 1, 0, 0, 0);
    put16(&p, 0xc00c);
    put16(&p, 1);
    put16(&p, 1);
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_POINTER, "pointer",
           "a compression pointer in the question's name");
    p.b[12] = 0x41;
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_LABEL_TYPE, "label_type",
           "label type or length 65 in the question's name");

    /* 256 octets of name: too long, even where the message also ends inside it */
    long_query(&p, 62, 'a');
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_NAME_TOO_LONG, "name_too_long",
           "the question's name is longer than 255 octets");
    expect(&p, p.n - 10, -EBADMSG, CORRAL_DNS_REASON_NAME_TOO_LONG, "name_too_long",
           "the question's name is longer than 255 octets");

    query(&p, 1, "pypi.org", 1);
    expect(&p, p.n - 1, -EBADMSG, CORRAL_DNS_REASON_QUESTION_TRUNCATED, "question_truncated",
           "the question is truncated (no QTYPE/QCLASS)");

    /* ARCOUNT 1: nothing there, a TSIG instead of an OPT, an OPT cut short */
    query(&p, 1, "pypi.org", 1);
    p.b[11] = 1;
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_NOT_OPT, "not_opt",
           "the additional record is not an OPT record");
    opt(&p, 4);
    p.b[p.n - 14] = 0;
    p.b[p.n - 13] = 250;
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_NOT_OPT, "not_opt",
           "the additional record is not an OPT record");
    p.b[p.n - 13] = 41;
    expect(&p, p.n, 0, CORRAL_DNS_REASON_NONE, "none", "well-formed"); /* the control */
    expect(&p, p.n - 1, -EBADMSG, CORRAL_DNS_REASON_OPT_TRUNCATED, "opt_truncated",
           "the OPT record is truncated");

    query(&p, 1, "pypi.org", 1);
    put(&p, "junk", 4);
    expect(&p, p.n, -EBADMSG, CORRAL_DNS_REASON_TRAILING, "trailing", "4 bytes after the question");

    /* outside the enum: named, never NULL */
    CHECK(strcmp(corral_dns_reason_to_string(CORRAL_DNS_REASON_COUNT), "unknown") == 0);
    /* a buffer too small is truncated, NUL-terminated, and says how much was wanted */
    struct corral_dns_query q;
    char small[8];
    query(&p, 1, "pypi.org", 1);
    p.b[5] = 0;
    CHECK(parse(&p, &q) == -EBADMSG && q.detail[0] == 0);
    CHECK(corral_dns_describe(&q, small, sizeof small) ==
          (int)strlen("QDCOUNT 0: exactly one question is answered"));
    CHECK(strcmp(small, "QDCOUNT") == 0);
}

int main(void)
{
    test_a_query_and_answer();
    test_aaaa_nodata_nxdomain_refused();
    test_name_forms();
    test_edns();
    test_bad_shapes();
    test_reasons();
    return DONE();
}
