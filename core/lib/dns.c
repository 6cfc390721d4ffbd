/*
 * DNS query parser and answer builder for the in-namespace responder (see dns.h for the
 * contract). Every read goes through an offset checked against len before the access;
 * offsets are size_t and only ever grow by amounts already checked against len - off,
 * so no sum can wrap.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dns.h"

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int is_host_octet(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Records why the parse failed and returns the errno of that reason (see dns.h). */
static int refuse(struct corral_dns_query *q, enum corral_dns_reason reason, unsigned d0,
                  unsigned d1)
{
    q->reason = reason;
    q->detail[0] = d0;
    q->detail[1] = d1;
    switch (reason) {
    case CORRAL_DNS_REASON_SHORT:
        return -EMSGSIZE;
    case CORRAL_DNS_REASON_RESPONSE:
        return -EPROTO;
    case CORRAL_DNS_REASON_OPCODE:
        return -EOPNOTSUPP;
    default:
        return -EBADMSG;
    }
}

/*
 * Reads the uncompressed name at *off into q->name (presentation form) and advances *off
 * past its terminating zero octet.
 */
static int parse_name(const uint8_t *msg, size_t len, size_t *off, struct corral_dns_query *q)
{
    size_t o = *off, wire = 0, n = 0;
    q->hostname = 1;
    for (;;) {
        if (o >= len) return refuse(q, CORRAL_DNS_REASON_NAME_TRUNCATED, 0, 0);
        uint8_t l = msg[o++];
        wire++;
        if (l == 0) break;
        /* 0xc0.. is a pointer, 0x40.. and 0x80.. the extended label types RFC 6891
         * section 5 retired: none has a place in a query's one question. */
        if (l >= 0xc0) return refuse(q, CORRAL_DNS_REASON_POINTER, 0, 0);
        if (l > CORRAL_DNS_LABEL_MAX) return refuse(q, CORRAL_DNS_REASON_LABEL_TYPE, l, 0);
        wire += l;
        /* +1 leaves room for the root label still to come */
        if (wire + 1 > CORRAL_DNS_WIRE_NAME_MAX)
            return refuse(q, CORRAL_DNS_REASON_NAME_TOO_LONG, 0, 0);
        if (l > len - o) return refuse(q, CORRAL_DNS_REASON_NAME_TRUNCATED, 0, 0);
        if (n > 0) q->name[n++] = '.';
        for (size_t i = 0; i < l; i++) {
            uint8_t c = msg[o + i];
            if (is_host_octet(c)) {
                q->name[n++] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
            } else {
                q->hostname = 0;
                q->name[n++] = '\\';
                q->name[n++] = (char)('0' + c / 100);
                q->name[n++] = (char)('0' + c / 10 % 10);
                q->name[n++] = (char)('0' + c % 10);
            }
        }
        o += l;
    }
    q->name[n] = '\0';
    q->name_len = n;
    *off = o;
    return 0;
}

/* The one additional record a query may carry: an OPT pseudo-record (RFC 6891 6.1.2),
 * owner the root, its RDATA (options) within the message. Its content is not used. */
static int parse_opt(const uint8_t *msg, size_t len, size_t *off, struct corral_dns_query *q)
{
    size_t o = *off;
    /* root name, TYPE, CLASS (UDP size), TTL (extended rcode, version, flags), RDLEN */
    if (len - o < 11 || msg[o] != 0 || get16(msg + o + 1) != CORRAL_DNS_TYPE_OPT)
        return refuse(q, CORRAL_DNS_REASON_NOT_OPT, 0, 0);
    size_t rdlen = get16(msg + o + 9);
    o += 11;
    if (rdlen > len - o) return refuse(q, CORRAL_DNS_REASON_OPT_TRUNCATED, 0, 0);
    *off = o + rdlen;
    return 0;
}

int corral_dns_parse_query(const uint8_t *msg, size_t len, struct corral_dns_query *q)
{
    q->question_len = 0;
    q->name_len = 0;
    q->name[0] = '\0';
    q->qtype = q->qclass = 0;
    q->hostname = q->edns = 0;
    q->reason = CORRAL_DNS_REASON_NONE;
    q->detail[0] = q->detail[1] = 0;
    if (len < CORRAL_DNS_HEADER_LEN) return refuse(q, CORRAL_DNS_REASON_SHORT, (unsigned)len, 0);

    q->id = get16(msg);
    q->flags = get16(msg + 2);
    q->rd = !!(q->flags & CORRAL_DNS_FLAG_RD);
    if (q->flags & CORRAL_DNS_FLAG_QR) return refuse(q, CORRAL_DNS_REASON_RESPONSE, 0, 0);
    if (q->flags & CORRAL_DNS_FLAG_OPCODE)
        return refuse(q, CORRAL_DNS_REASON_OPCODE, (q->flags & CORRAL_DNS_FLAG_OPCODE) >> 11, 0);
    uint16_t qdcount = get16(msg + 4), ancount = get16(msg + 6), nscount = get16(msg + 8),
             arcount = get16(msg + 10);
    if (qdcount != 1) return refuse(q, CORRAL_DNS_REASON_QDCOUNT, qdcount, 0);
    if (ancount != 0 || nscount != 0) return refuse(q, CORRAL_DNS_REASON_RECORDS, ancount, nscount);
    if (arcount > 1) return refuse(q, CORRAL_DNS_REASON_ARCOUNT, arcount, 0);

    size_t off = CORRAL_DNS_HEADER_LEN;
    int r = parse_name(msg, len, &off, q);
    if (r < 0) goto bad;
    if (len - off < 4) {
        r = refuse(q, CORRAL_DNS_REASON_QUESTION_TRUNCATED, 0, 0);
        goto bad;
    }
    q->qtype = get16(msg + off);
    q->qclass = get16(msg + off + 2);
    off += 4;
    size_t question_len = off - CORRAL_DNS_HEADER_LEN;

    if (arcount == 1) {
        r = parse_opt(msg, len, &off, q);
        if (r < 0) goto bad;
        q->edns = 1;
    }
    if (off != len) {
        r = refuse(q, CORRAL_DNS_REASON_TRAILING, (unsigned)(len - off), 0);
        goto bad;
    }

    memcpy(q->question, msg + CORRAL_DNS_HEADER_LEN, question_len);
    q->question_len = question_len;
    return 0;

bad:
    /* a partial question must not be mistaken for a parsed one */
    q->name_len = 0;
    q->name[0] = '\0';
    q->qtype = q->qclass = 0;
    q->hostname = q->edns = 0;
    return r;
}

int corral_dns_build_answer(const struct corral_dns_query *q, uint8_t *out, size_t cap, int rcode,
                            const uint8_t *addr, size_t addr_len, uint32_t ttl)
{
    if (rcode < 0 || rcode > 15) return -EINVAL;
    if (q->question_len > sizeof q->question) return -EINVAL;
    if (addr) {
        if (q->question_len == 0 || rcode != CORRAL_DNS_NOERROR) return -EINVAL;
        if (q->qclass != CORRAL_DNS_CLASS_IN) return -EINVAL;
        if (!((q->qtype == CORRAL_DNS_TYPE_A && addr_len == 4) ||
              (q->qtype == CORRAL_DNS_TYPE_AAAA && addr_len == 16)))
            return -EINVAL;
        if (ttl > INT32_MAX) return -EINVAL;
    } else if (addr_len != 0) {
        return -EINVAL;
    }

    size_t need = CORRAL_DNS_HEADER_LEN + q->question_len + (addr ? 12 + addr_len : 0);
    if (need > cap) return -ENOSPC;

    uint16_t flags = CORRAL_DNS_FLAG_QR | (uint16_t)rcode;
    flags |= q->flags & (CORRAL_DNS_FLAG_OPCODE | CORRAL_DNS_FLAG_RD | CORRAL_DNS_FLAG_CD);
    if (q->question_len) flags |= CORRAL_DNS_FLAG_AA;
    put16(out, q->id);
    put16(out + 2, flags);
    put16(out + 4, q->question_len ? 1 : 0);
    put16(out + 6, addr ? 1 : 0);
    put16(out + 8, 0);
    put16(out + 10, 0);
    size_t off = CORRAL_DNS_HEADER_LEN;
    memcpy(out + off, q->question, q->question_len);
    off += q->question_len;
    if (addr) {
        put16(out + off, 0xc000 | CORRAL_DNS_HEADER_LEN);
        put16(out + off + 2, q->qtype);
        put16(out + off + 4, CORRAL_DNS_CLASS_IN);
        put32(out + off + 6, ttl);
        put16(out + off + 10, (uint16_t)addr_len);
        memcpy(out + off + 12, addr, addr_len);
        off += 12 + addr_len;
    }
    return (int)off;
}

int corral_dns_error_rcode(int err)
{
    switch (err) {
    case -EBADMSG:
        return CORRAL_DNS_FORMERR;
    case -EOPNOTSUPP:
        return CORRAL_DNS_NOTIMP;
    default:
        return err < 0 ? err : -EINVAL;
    }
}

const char *corral_dns_reason_to_string(enum corral_dns_reason reason)
{
    switch (reason) {
    case CORRAL_DNS_REASON_NONE:
        return "none";
    case CORRAL_DNS_REASON_SHORT:
        return "short";
    case CORRAL_DNS_REASON_RESPONSE:
        return "response";
    case CORRAL_DNS_REASON_OPCODE:
        return "opcode";
    case CORRAL_DNS_REASON_QDCOUNT:
        return "qdcount";
    case CORRAL_DNS_REASON_RECORDS:
        return "records";
    case CORRAL_DNS_REASON_ARCOUNT:
        return "arcount";
    case CORRAL_DNS_REASON_NAME_TRUNCATED:
        return "name_truncated";
    case CORRAL_DNS_REASON_POINTER:
        return "pointer";
    case CORRAL_DNS_REASON_LABEL_TYPE:
        return "label_type";
    case CORRAL_DNS_REASON_NAME_TOO_LONG:
        return "name_too_long";
    case CORRAL_DNS_REASON_QUESTION_TRUNCATED:
        return "question_truncated";
    case CORRAL_DNS_REASON_NOT_OPT:
        return "not_opt";
    case CORRAL_DNS_REASON_OPT_TRUNCATED:
        return "opt_truncated";
    case CORRAL_DNS_REASON_TRAILING:
        return "trailing";
    case CORRAL_DNS_REASON_COUNT:
        break;
    }
    return "unknown";
}

int corral_dns_describe(const struct corral_dns_query *q, char *buf, size_t cap)
{
    unsigned a = q->detail[0], b = q->detail[1];
    switch (q->reason) {
    case CORRAL_DNS_REASON_NONE:
        return snprintf(buf, cap, "well-formed");
    case CORRAL_DNS_REASON_SHORT:
        return snprintf(buf, cap, "%u bytes: shorter than a DNS header", a);
    case CORRAL_DNS_REASON_RESPONSE:
        return snprintf(buf, cap, "a response (QR set), not a query: not answered");
    case CORRAL_DNS_REASON_OPCODE:
        return snprintf(buf, cap, "opcode %u: only QUERY (0) is answered", a);
    case CORRAL_DNS_REASON_QDCOUNT:
        return snprintf(buf, cap, "QDCOUNT %u: exactly one question is answered", a);
    case CORRAL_DNS_REASON_RECORDS:
        return snprintf(buf, cap, "ANCOUNT %u, NSCOUNT %u: a query carries neither", a, b);
    case CORRAL_DNS_REASON_ARCOUNT:
        return snprintf(buf, cap, "ARCOUNT %u: at most one (OPT) record", a);
    case CORRAL_DNS_REASON_NAME_TRUNCATED:
        return snprintf(buf, cap, "the question's name is truncated");
    case CORRAL_DNS_REASON_POINTER:
        return snprintf(buf, cap, "a compression pointer in the question's name");
    case CORRAL_DNS_REASON_LABEL_TYPE:
        return snprintf(buf, cap, "label type or length %u in the question's name", a);
    case CORRAL_DNS_REASON_NAME_TOO_LONG:
        return snprintf(buf, cap, "the question's name is longer than %d octets",
                        CORRAL_DNS_WIRE_NAME_MAX);
    case CORRAL_DNS_REASON_QUESTION_TRUNCATED:
        return snprintf(buf, cap, "the question is truncated (no QTYPE/QCLASS)");
    case CORRAL_DNS_REASON_NOT_OPT:
        return snprintf(buf, cap, "the additional record is not an OPT record");
    case CORRAL_DNS_REASON_OPT_TRUNCATED:
        return snprintf(buf, cap, "the OPT record is truncated");
    case CORRAL_DNS_REASON_TRAILING:
        return snprintf(buf, cap, "%u bytes after the question", a);
    case CORRAL_DNS_REASON_COUNT:
        break;
    }
    return snprintf(buf, cap, "malformed");
}
