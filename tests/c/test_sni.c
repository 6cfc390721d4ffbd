/*
 * core/lib/sni.c: a ClientHello built here field by field (and broken one field at a
 * time), HTTP request heads, and what is neither. Every refusal has its control.
 */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "sni.h"

static uint8_t buf[1024];

static void put16(uint8_t *p, size_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* A ClientHello naming `name` (NULL: no SNI), `names` host_name entries of it; `split`
 * makes the record shorter than the handshake message. Returns its length. */
static size_t hello(const char *name, int names, int split)
{
    uint8_t ext[300];
    size_t e = 0;
    if (name) {
        size_t n = strlen(name), list = (size_t)names * (3 + n);
        put16(ext, 0); /* server_name */
        put16(ext + 2, 2 + list);
        put16(ext + 4, list);
        e = 6;
        for (int i = 0; i < names; i++) {
            ext[e++] = 0;
            put16(ext + e, n);
            e += 2;
            memcpy(ext + e, name, n);
            e += n;
        }
    }
    uint8_t *h = buf + 9; /* after the record (5) and handshake (4) headers */
    size_t b = 0;
    h[b++] = 3;
    h[b++] = 3; /* legacy_version */
    memset(h + b, 0x11, 32);
    b += 32;
    h[b++] = 0; /* session id */
    put16(h + b, 2);
    h[b + 2] = 0x13;
    h[b + 3] = 0x01;
    b += 4;
    h[b++] = 1;
    h[b++] = 0; /* compression */
    put16(h + b, e);
    b += 2;
    memcpy(h + b, ext, e);
    b += e;
    buf[0] = 22;
    buf[1] = 3;
    buf[2] = 1;
    put16(buf + 3, 4 + b - (split ? 10 : 0));
    buf[5] = 1;
    buf[6] = 0;
    put16(buf + 7, b);
    return 9 + b - (split ? 10 : 0);
}

static int parse(const void *p, size_t n, struct corral_sni *s)
{
    return corral_sni_parse(p, n, s);
}

static void test_tls(void)
{
    struct corral_sni s;
    size_t n = hello("API.Test.", 1, 0);
    CHECK(parse(buf, n, &s) == 0 && s.kind == CORRAL_SNI_TLS && strcmp(s.name, "api.test") == 0);
    for (size_t cut = 1; cut < n; cut++)
        CHECK(parse(buf, cut, &s) == -EAGAIN); /* never decided on part of it */
    n = hello(NULL, 0, 0);
    CHECK(parse(buf, n, &s) == 0 && s.kind == CORRAL_SNI_TLS && s.name_len == 0);
    n = hello("api.test", 2, 0);
    CHECK(parse(buf, n, &s) == -EBADMSG); /* two names */
    n = hello("api.test", 1, 1);
    CHECK(parse(buf, n, &s) == -EBADMSG); /* split across records */
    n = hello("api..test", 1, 0);
    CHECK(parse(buf, n, &s) == -EBADMSG); /* empty label */
    n = hello("api test", 1, 0);
    CHECK(parse(buf, n, &s) == -EBADMSG); /* not a hostname */
    n = hello("api.test", 1, 0);
    buf[5] = 2; /* a ServerHello */
    CHECK(parse(buf, n, &s) == -EBADMSG);
    n = hello("api.test", 1, 0); /* control, after */
    CHECK(parse(buf, n, &s) == 0 && strcmp(s.name, "api.test") == 0);
}

static void test_http(void)
{
    struct corral_sni s;
    const char *get = "GET /x HTTP/1.1\r\nUser-Agent: t\r\nhost:  Pypi.ORG:8080 \r\n\r\n";
    CHECK(parse(get, strlen(get), &s) == 0 && s.kind == CORRAL_SNI_HTTP &&
          strcmp(s.name, "pypi.org") == 0);
    CHECK(parse(get, strlen(get) - 1, &s) == -EAGAIN);
    const char *none = "GET / HTTP/1.0\r\n\r\n";
    CHECK(parse(none, strlen(none), &s) == 0 && s.kind == CORRAL_SNI_HTTP && s.name_len == 0);
    const char *two = "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n";
    CHECK(parse(two, strlen(two), &s) == -EBADMSG);
    const char *abs = "GET http://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n";
    CHECK(parse(abs, strlen(abs), &s) == -EBADMSG);
    const char *abs_ok = "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n";
    CHECK(parse(abs_ok, strlen(abs_ok), &s) == 0 && strcmp(s.name, "api.test") == 0);
    const char *conn = "CONNECT evil.test:443 HTTP/1.1\r\n\r\n";
    CHECK(parse(conn, strlen(conn), &s) == 0 && strcmp(s.name, "evil.test") == 0);
    const char *port = "GET / HTTP/1.1\r\nHost: api.test:80x\r\n\r\n";
    CHECK(parse(port, strlen(port), &s) == -EBADMSG);
    /* an IPv6 literal Host, with and without a port; unclosed or a bad port refused */
    const char *v6 = "GET / HTTP/1.1\r\nHost: [64:FF9B:1::c612:5f96]:8080\r\n\r\n";
    CHECK(parse(v6, strlen(v6), &s) == 0 && strcmp(s.name, "64:ff9b:1::c612:5f96") == 0);
    const char *v6bare = "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n";
    CHECK(parse(v6bare, strlen(v6bare), &s) == 0 && strcmp(s.name, "::1") == 0);
    const char *v6open = "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n";
    CHECK(parse(v6open, strlen(v6open), &s) == -EBADMSG);
    const char *v6port = "GET / HTTP/1.1\r\nHost: [::1]:8x\r\n\r\n";
    CHECK(parse(v6port, strlen(v6port), &s) == -EBADMSG);
    const char *v6name = "GET / HTTP/1.1\r\nHost: [evil.test]\r\n\r\n";
    CHECK(parse(v6name, strlen(v6name), &s) == -EBADMSG);
    CHECK(parse("GE", 2, &s) == -EAGAIN);
    CHECK(parse("GET", 3, &s) == -EAGAIN);
}

static void test_other(void)
{
    struct corral_sni s;
    CHECK(parse("SSH-2.0-x\r\n", 11, &s) == 0 && s.kind == CORRAL_SNI_OTHER && s.name_len == 0);
    CHECK(parse("GETX / HTTP/1.1\r\n\r\n", 19, &s) == 0 && s.kind == CORRAL_SNI_OTHER);
    CHECK(parse("", 0, &s) == -EAGAIN);
}

int main(void)
{
    test_tls();
    test_http();
    test_other();
    return DONE();
}
