/*
 * ClientHello and HTTP request-head reader (see sni.h). Every length is checked against
 * what remains before it is used; nothing is copied but the name.
 */
#include <errno.h>
#include <string.h>
#include <arpa/inet.h>

#include "sni.h"

#define TLS_HANDSHAKE 22
#define TLS_CLIENT_HELLO 1
#define TLS_EXT_SERVER_NAME 0
#define SNI_HOST_NAME 0

/* A bounded reader over one span: a read past its end sets `bad` and yields zeros. */
struct span {
    const uint8_t *p;
    size_t left;
    int bad;
};

static uint32_t take(struct span *s, size_t n)
{
    uint32_t v = 0;
    if (s->bad || s->left < n) {
        s->bad = 1;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        v = v << 8 | s->p[i];
    s->p += n;
    s->left -= n;
    return v;
}

static struct span sub(struct span *s, size_t n)
{
    struct span out = {.p = s->p, .left = n, .bad = 0};
    if (s->bad || s->left < n) {
        s->bad = 1;
        out.left = 0;
        out.bad = 1;
        return out;
    }
    s->p += n;
    s->left -= n;
    return out;
}

static int host_char(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
}

/* Copies a hostname, lowercased and without one trailing dot; -EBADMSG if it is empty,
 * too long, has an empty label, or holds a byte no hostname has. */
static int set_name(struct corral_sni *out, const uint8_t *p, size_t n)
{
    if (n > 0 && p[n - 1] == '.') n--;
    if (n == 0 || n > CORRAL_SNI_NAME_MAX) return -EBADMSG;
    for (size_t i = 0; i < n; i++) {
        if (!host_char(p[i])) return -EBADMSG;
        /* no empty label: a leading dot, two dots, or a second trailing one */
        if (p[i] == '.' && (i == 0 || p[i - 1] == '.' || i == n - 1)) return -EBADMSG;
        out->name[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
    }
    out->name[n] = '\0';
    out->name_len = n;
    return 0;
}

static int server_name(struct span ext, struct corral_sni *out)
{
    struct span list = sub(&ext, take(&ext, 2));
    if (ext.bad || ext.left) return -EBADMSG;
    int found = 0;
    while (list.left) {
        uint32_t type = take(&list, 1);
        struct span name = sub(&list, take(&list, 2));
        if (list.bad) return -EBADMSG;
        if (type != SNI_HOST_NAME) continue;
        /* RFC 6066: at most one name of each type; two would let the check and the server
         * read different ones. */
        if (found++) return -EBADMSG;
        int r = set_name(out, name.p, name.left);
        if (r) return r;
    }
    return found ? 0 : -EBADMSG;
}

static int parse_tls(const uint8_t *buf, size_t len, struct corral_sni *out)
{
    out->kind = CORRAL_SNI_TLS;
    if (len < 5) return -EAGAIN;
    struct span rec = {.p = buf, .left = len, .bad = 0};
    take(&rec, 1);
    uint32_t major = take(&rec, 1);
    take(&rec, 1);
    uint32_t rlen = take(&rec, 2);
    if (major != 3 || rlen == 0 || rlen > 16384 + 2048) return -EBADMSG;
    if (rec.left < 4 && rec.left < rlen) return -EAGAIN;
    struct span body = {.p = rec.p, .left = rec.left < rlen ? rec.left : rlen, .bad = 0};
    if (take(&body, 1) != TLS_CLIENT_HELLO) return -EBADMSG;
    uint32_t hlen = take(&body, 3);
    /* The whole ClientHello in the first record: a split one could show the check one
     * name and the server another, so it is refused, never read in part. */
    if (hlen + 4 > rlen) return -EBADMSG;
    if (rec.left < rlen) return -EAGAIN;
    struct span hello = sub(&body, hlen);
    take(&hello, 2 + 32);         /* legacy_version, random */
    sub(&hello, take(&hello, 1)); /* legacy_session_id */
    sub(&hello, take(&hello, 2)); /* cipher_suites */
    sub(&hello, take(&hello, 1)); /* legacy_compression_methods */
    if (hello.bad) return -EBADMSG;
    if (hello.left == 0) return 0; /* no extensions: no name */
    struct span exts = sub(&hello, take(&hello, 2));
    if (hello.bad || hello.left) return -EBADMSG;
    int seen = 0;
    while (exts.left) {
        uint32_t type = take(&exts, 2);
        struct span ext = sub(&exts, take(&exts, 2));
        if (exts.bad) return -EBADMSG;
        if (type != TLS_EXT_SERVER_NAME) continue;
        if (seen++) return -EBADMSG; /* one extension of each type (RFC 8446 4.2) */
        int r = server_name(ext, out);
        if (r) return r;
    }
    return 0;
}

static const char *const METHODS[] = {"GET",   "HEAD",    "POST",    "PUT",  "DELETE",
                                      "PATCH", "OPTIONS", "CONNECT", "TRACE"};

/* Whether buf starts as an HTTP request: 1 yes (a method and a space), 0 no, -EAGAIN for
 * a prefix of one. */
static int http_start(const uint8_t *buf, size_t len)
{
    int prefix = 0;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++) {
        size_t m = strlen(METHODS[i]);
        if (memcmp(buf, METHODS[i], len < m ? len : m) != 0) continue;
        if (len <= m) {
            prefix = 1;
        } else if (buf[m] == ' ') {
            return 1;
        }
    }
    return prefix ? -EAGAIN : 0;
}

/* An IPv6 literal (inside its brackets), copied lowercased once inet_pton takes it:
 * whether it is the address the client dialled is the caller's to judge. */
static int set_ip6_literal(struct corral_sni *out, const uint8_t *p, size_t n)
{
    if (n < 2 || n >= INET6_ADDRSTRLEN) return -EBADMSG;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i] >= 'A' && p[i] <= 'F' ? (uint8_t)(p[i] + 32) : p[i];
        /* only what an address is written with: a NUL would cut inet_pton's view short */
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == ':' || c == '.'))
            return -EBADMSG;
        out->name[i] = (char)c;
    }
    out->name[n] = '\0';
    struct in6_addr a;
    if (inet_pton(AF_INET6, out->name, &a) != 1) return -EBADMSG;
    out->name_len = n;
    return 0;
}

static int digits(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return 1;
}

/* host[:port] or [IPv6]:port from p..p+n into out (user information, or a port that is
 * not digits: -EBADMSG). */
static int authority(const uint8_t *p, size_t n, struct corral_sni *out)
{
    size_t h = 0;
    if (n && p[0] == '[') {
        const uint8_t *close = memchr(p, ']', n);
        if (close == NULL) return -EBADMSG;
        size_t end = (size_t)(close - p);
        if (end + 1 < n && (p[end + 1] != ':' || !digits(p + end + 2, n - end - 2)))
            return -EBADMSG;
        return set_ip6_literal(out, p + 1, end - 1);
    }
    while (h < n && p[h] != ':') {
        if (p[h] == '@') return -EBADMSG;
        h++;
    }
    if (h < n && !digits(p + h + 1, n - h - 1)) return -EBADMSG;
    return set_name(out, p, h);
}

static int ieq(const uint8_t *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = a[i] >= 'A' && a[i] <= 'Z' ? (uint8_t)(a[i] + 32) : a[i];
        if (c != (uint8_t)b[i]) return 0;
    }
    return 1;
}

/* The request line's target names a host in absolute form (`GET http://evil.test/`,
 * which an origin server must prefer to Host, RFC 9112 3.2.2) and in authority form
 * (`CONNECT evil.test:443`): that name is read too, and a Host that differs from it is
 * refused. */
static int request_target(const uint8_t *line, size_t n, struct corral_sni *out)
{
    size_t sp = 0;
    while (sp < n && line[sp] != ' ')
        sp++;
    size_t t = sp + 1, e = t;
    while (e < n && line[e] != ' ')
        e++;
    if (t >= n) return -EBADMSG;
    const uint8_t *target = line + t;
    size_t tn = e - t;
    if (sp == 7 && memcmp(line, "CONNECT", 7) == 0) return authority(target, tn, out);
    size_t k = 0;
    while (k + 2 < tn && target[k] != ':' && target[k] != '/')
        k++;
    if (k + 2 < tn && target[k] == ':' && target[k + 1] == '/' && target[k + 2] == '/') {
        const uint8_t *a = target + k + 3;
        size_t an = 0;
        while (k + 3 + an < tn && a[an] != '/' && a[an] != '?' && a[an] != '#')
            an++;
        return authority(a, an, out);
    }
    return 0;
}

static int parse_http(const uint8_t *buf, size_t len, struct corral_sni *out)
{
    out->kind = CORRAL_SNI_HTTP;
    size_t end = 0;
    for (size_t i = 0; i + 3 < len; i++)
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            end = i + 2;
            break;
        }
    if (!end) return len >= CORRAL_SNI_PEEK_MAX ? -EBADMSG : -EAGAIN;
    size_t at = 0;
    while (at < end && buf[at] != '\n')
        at++;
    int r = request_target(buf, at && buf[at - 1] == '\r' ? at - 1 : at, out);
    if (r) return r;
    char target[CORRAL_SNI_NAME_MAX + 1];
    size_t target_len = out->name_len;
    memcpy(target, out->name, target_len + 1);
    at++;
    int found = 0;
    /* Header lines after the request line, up to the blank one. */
    while (at < end) {
        size_t eol = at;
        while (eol < end && buf[eol] != '\n')
            eol++;
        size_t n = eol > at && buf[eol - 1] == '\r' ? eol - 1 - at : eol - at;
        const uint8_t *line = buf + at;
        if (n >= 5 && ieq(line, "host:", 5)) {
            /* Two Host headers are a request smuggling shape (RFC 9112 3.2): refused. */
            if (found++) return -EBADMSG;
            size_t v = 5, w = n;
            while (v < w && (line[v] == ' ' || line[v] == '\t'))
                v++;
            while (w > v && (line[w - 1] == ' ' || line[w - 1] == '\t'))
                w--;
            r = authority(line + v, w - v, out);
            if (r) return r;
            if (target_len &&
                (out->name_len != target_len || memcmp(out->name, target, target_len)))
                return -EBADMSG;
        }
        at = eol + 1;
    }
    return 0;
}

int corral_sni_parse(const uint8_t *buf, size_t len, struct corral_sni *out)
{
    out->kind = CORRAL_SNI_OTHER;
    out->name[0] = '\0';
    out->name_len = 0;
    if (len == 0) return -EAGAIN;
    if (len > CORRAL_SNI_PEEK_MAX) len = CORRAL_SNI_PEEK_MAX;
    if (buf[0] == TLS_HANDSHAKE) return parse_tls(buf, len, out);
    int h = http_start(buf, len);
    if (h < 0) return h;
    return h ? parse_http(buf, len, out) : 0;
}
