/*
 * The DNS message codec of the in-namespace responder: it parses the tenant's queries and
 * builds the responder's answers, nothing else. It never parses a response (no upstream
 * DNS is ever consulted), never allocates, and treats every byte of a query as hostile:
 * each read is checked against the length the kernel delivered.
 *
 * What a caller does with each result of corral_dns_parse_query():
 *   0            answer: NOERROR + address, NODATA, NXDOMAIN or REFUSED (its policy)
 *   -EBADMSG     malformed, header intact: answer FORMERR (header only, no question)
 *   -EOPNOTSUPP  opcode other than QUERY: answer NOTIMP (header only, opcode echoed)
 *   -EPROTO      QR set, i.e. a response: drop. Answering one could start a loop between
 *                two responders, or with a tenant that spoofs the responder's own address.
 *   -EMSGSIZE    shorter than a header: drop (there is no id to answer to)
 * corral_dns_error_rcode() encodes this table. Every failure also leaves in q->reason the
 * one rule the query broke (enum corral_dns_reason), so that the caller can log which
 * without reading the packet a second time.
 */
#ifndef CORRAL_DNS_H
#define CORRAL_DNS_H

#include <stddef.h>
#include <stdint.h>

#define CORRAL_DNS_HEADER_LEN 12
/* RFC 1035 3.1: a name is at most 255 octets on the wire, each label at most 63. */
#define CORRAL_DNS_WIRE_NAME_MAX 255
#define CORRAL_DNS_LABEL_MAX 63
/*
 * The presentation form escapes every byte outside [A-Za-z0-9_-] as \DDD (and so '.' and
 * '\' inside a label), which makes it injective: a label "pypi.org" presents as
 * "pypi\046org" and can never equal the two-label name pypi.org. Worst case: 250 escaped
 * octets in four labels (254 wire octets before the root), 250 * 4 + 3 dots = 1003
 * characters, plus the NUL.
 */
#define CORRAL_DNS_NAME_MAX 1024
/* Largest answer the codec builds: header, question, one AAAA record by pointer. Under
 * the 512 octets of RFC 1035 UDP, so no answer ever needs TC or EDNS. */
#define CORRAL_DNS_ANSWER_MAX (CORRAL_DNS_HEADER_LEN + CORRAL_DNS_WIRE_NAME_MAX + 4 + 2 + 10 + 16)

enum {
    CORRAL_DNS_NOERROR = 0,
    CORRAL_DNS_FORMERR = 1,
    CORRAL_DNS_SERVFAIL = 2,
    CORRAL_DNS_NXDOMAIN = 3,
    CORRAL_DNS_NOTIMP = 4,
    CORRAL_DNS_REFUSED = 5,
};

enum {
    CORRAL_DNS_TYPE_A = 1,
    CORRAL_DNS_TYPE_TXT = 16,
    CORRAL_DNS_TYPE_AAAA = 28,
    CORRAL_DNS_TYPE_OPT = 41,
    CORRAL_DNS_TYPE_ANY = 255,
    CORRAL_DNS_CLASS_IN = 1,
};

/* Header flag bits (RFC 1035 4.1.1, RFC 4035 3.2.2 for CD). */
#define CORRAL_DNS_FLAG_QR 0x8000u
#define CORRAL_DNS_FLAG_OPCODE 0x7800u
#define CORRAL_DNS_FLAG_AA 0x0400u
#define CORRAL_DNS_FLAG_TC 0x0200u
#define CORRAL_DNS_FLAG_RD 0x0100u
#define CORRAL_DNS_FLAG_RA 0x0080u
#define CORRAL_DNS_FLAG_CD 0x0010u
#define CORRAL_DNS_FLAG_RCODE 0x000fu

/*
 * Why corral_dns_parse_query() refused a query: one value per rule, checked in this
 * order (a query that breaks two is named by the first). The errno each one returns is
 * in the comment; corral_dns_reason_to_string() names them, corral_dns_describe() writes
 * the sentence the responder logs.
 */
enum corral_dns_reason {
    CORRAL_DNS_REASON_NONE = 0,           /* 0: a well-formed query */
    CORRAL_DNS_REASON_SHORT,              /* -EMSGSIZE: fewer octets than a header */
    CORRAL_DNS_REASON_RESPONSE,           /* -EPROTO: QR set */
    CORRAL_DNS_REASON_OPCODE,             /* -EOPNOTSUPP: an opcode other than QUERY */
    CORRAL_DNS_REASON_QDCOUNT,            /* -EBADMSG from here on: QDCOUNT not 1 */
    CORRAL_DNS_REASON_RECORDS,            /* an answer or authority record */
    CORRAL_DNS_REASON_ARCOUNT,            /* more than one additional record */
    CORRAL_DNS_REASON_NAME_TRUNCATED,     /* the name runs past the message */
    CORRAL_DNS_REASON_POINTER,            /* a compression pointer in the name */
    CORRAL_DNS_REASON_LABEL_TYPE,         /* an extended label type (0x40, 0x80) */
    CORRAL_DNS_REASON_NAME_TOO_LONG,      /* over CORRAL_DNS_WIRE_NAME_MAX octets */
    CORRAL_DNS_REASON_QUESTION_TRUNCATED, /* no room for QTYPE and QCLASS */
    CORRAL_DNS_REASON_NOT_OPT,            /* the additional record is not a root OPT */
    CORRAL_DNS_REASON_OPT_TRUNCATED,      /* its RDATA runs past the message */
    CORRAL_DNS_REASON_TRAILING,           /* octets after the last record */
    CORRAL_DNS_REASON_COUNT,
};

struct corral_dns_query {
    uint16_t id;
    uint16_t flags; /* the header flags as received */
    uint16_t qtype, qclass;
    int rd;
    /* 1 when every label octet is in [A-Za-z0-9_-]: only such a name can be on an
     * allowlist of A-label hostnames; the caller answers NXDOMAIN for any other. */
    int hostname;
    int edns; /* 1 when an OPT record came along (it is otherwise ignored) */
    /* The question exactly as received (wire name, QTYPE, QCLASS; case preserved, as
     * resolvers that randomise case compare it); 0 when only the header could be read. */
    size_t question_len;
    uint8_t question[CORRAL_DNS_WIRE_NAME_MAX + 4];
    /* Presentation form: lowercase ASCII, no trailing dot, "" for the root. */
    size_t name_len;
    char name[CORRAL_DNS_NAME_MAX];
    /* Why the parse failed (CORRAL_DNS_REASON_NONE when it did not), and the numbers
     * that broke the rule, for corral_dns_describe(): the length of a short message;
     * the opcode; QDCOUNT; ANCOUNT and NSCOUNT; ARCOUNT; the label octet; the count of
     * trailing octets. 0 where the rule has none. */
    enum corral_dns_reason reason;
    unsigned detail[2];
};

/*
 * Parses one query of len octets. Returns 0 or a negative errno as tabled above, with
 * q->reason saying which rule failed. On every result but -EMSGSIZE, q->id and q->flags
 * hold the header (q->question_len is 0 unless the result is 0), so that
 * corral_dns_build_answer() can answer FORMERR or NOTIMP.
 * Rejected as -EBADMSG: qdcount != 1; an answer or authority record; more than one
 * additional record, or one that is not a well-formed OPT with the root name; any
 * compression pointer or extended label type in a name (a query's one question has
 * nothing before it to point to); a label over 63 or a name over 255 octets; anything
 * running past len; and trailing octets after the last record.
 */
int corral_dns_parse_query(const uint8_t *msg, size_t len, struct corral_dns_query *q);

/*
 * Builds the answer to q into out (cap octets) and returns its length, or -ENOSPC when
 * cap is too small (CORRAL_DNS_ANSWER_MAX always suffices), or -EINVAL. The header echoes
 * id, opcode, RD and CD, sets QR, AA (when there is a question), RA = 0 and rcode; the
 * question is copied as received. With addr (4 octets for an IN A question, 16 for IN
 * AAAA, rcode NOERROR, else -EINVAL) one answer record follows, its owner a compression
 * pointer to the question (offset 12), its TTL ttl (at most 2^31 - 1, RFC 2181 8).
 * Without addr and with NOERROR the answer section is empty: NODATA.
 */
int corral_dns_build_answer(const struct corral_dns_query *q, uint8_t *out, size_t cap, int rcode,
                            const uint8_t *addr, size_t addr_len, uint32_t ttl);

/* The rcode to answer a parse failure err with (FORMERR, NOTIMP), or err itself (< 0)
 * when the packet must be dropped. */
int corral_dns_error_rcode(int err);

/* A stable identifier for reason ("qdcount", "pointer", …; "none" for a well-formed
 * query, "unknown" outside the enum): a static string, never NULL. */
const char *corral_dns_reason_to_string(enum corral_dns_reason reason);

/*
 * Writes into buf (cap octets, NUL-terminated, truncated to fit) the sentence naming the
 * rule q broke with its numbers, e.g. "QDCOUNT 2: exactly one question is answered", for
 * a parse that failed; returns what snprintf returns.
 */
int corral_dns_describe(const struct corral_dns_query *q, char *buf, size_t cap);

#endif
