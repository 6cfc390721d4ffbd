/*
 * core/lib/inet.c: every accepted form is compared with the bytes inet_pton gives for
 * the canonical text, and every refused form is one that a looser parser (inet_aton,
 * getaddrinfo) would have accepted as some address, next to a control that parses.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "inet.h"

static int parse(const char *s, uint8_t out[16])
{
    return corral_inet_parse(s, strlen(s), out);
}

/* s parses to the same bytes as canon does under inet_pton(af). */
static bool parses_as(const char *s, int af, const char *canon)
{
    uint8_t got[16], want[16];
    int n = parse(s, got);
    if (inet_pton(af, canon, want) != 1) return false;
    return n == (af == AF_INET ? 4 : 16) && memcmp(got, want, (size_t)n) == 0;
}

static bool formats_as(const char *s, const char *want)
{
    uint8_t a[16];
    char text[CORRAL_INET_TEXT_MAX];
    int n = parse(s, a);
    if (n < 0) return false;
    int t = corral_inet_format(a, (size_t)n, text, sizeof text);
    return t == (int)strlen(want) && strcmp(text, want) == 0;
}

static int in_cidr(const char *addr, const char *net, unsigned prefix)
{
    uint8_t a[16], b[16];
    int an = parse(addr, a), bn = parse(net, b);
    if (an < 0 || bn < 0) return -1000;
    return corral_inet_in_cidr(a, (size_t)an, b, (size_t)bn, prefix);
}

static void test_parse(void)
{
    uint8_t a[16];
    CHECK(parses_as("1.2.3.4", AF_INET, "1.2.3.4"));
    CHECK(parses_as("0.0.0.0", AF_INET, "0.0.0.0"));
    CHECK(parses_as("255.255.255.255", AF_INET, "255.255.255.255"));
    CHECK(parses_as("2001:db8::1", AF_INET6, "2001:db8::1"));
    CHECK(parses_as("[2001:db8::1]", AF_INET6, "2001:db8::1"));
    CHECK(parses_as("::", AF_INET6, "::"));
    CHECK(parses_as("[::1]", AF_INET6, "::1"));
    CHECK(parses_as("2001:DB8::A", AF_INET6, "2001:db8::a"));
    CHECK(parses_as("::ffff:1.2.3.4", AF_INET6, "::ffff:1.2.3.4"));
    CHECK(parses_as("1:2:3:4:5:6:7:8", AF_INET6, "1:2:3:4:5:6:7:8"));
    /* the longest IPv6 text there is (45 characters), bare and bracketed */
    CHECK(parses_as("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", AF_INET6,
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    CHECK(parses_as("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]", AF_INET6,
                    "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));

    /* inet_aton reads these as 1.2.0.3, 8.0.0.1 (octal), 127.0.0.1 and 1.2.3.4: each is a
     * way to write an address past a filter that only knows dotted quads */
    CHECK(parse("1.2.3", a) == -EINVAL);
    CHECK(parse("010.0.0.1", a) == -EINVAL);
    CHECK(parse("0x7f000001", a) == -EINVAL);
    CHECK(parse("01.2.3.4", a) == -EINVAL);
    CHECK(parse("1.2.3.4.5", a) == -EINVAL);
    CHECK(parse("256.1.1.1", a) == -EINVAL);
    CHECK(parse("1.2.3.4 ", a) == -EINVAL);
    CHECK(parse(" 1.2.3.4", a) == -EINVAL);
    CHECK(parse("[1.2.3.4]", a) == -EINVAL);    /* brackets are for IPv6 only */
    CHECK(parse("[2001:db8::1", a) == -EINVAL); /* unbalanced */
    CHECK(parse("2001:db8::1]", a) == -EINVAL);
    CHECK(parse("[]", a) == -EINVAL);
    CHECK(parse("", a) == -EINVAL);
    CHECK(parse("fe80::1%eth0", a) == -EINVAL); /* zones are host-local: never policy */
    CHECK(parse("[fe80::1%1]", a) == -EINVAL);
    CHECK(parse("10.0.0.0/8", a) == -EINVAL);
    CHECK(parse("[2001:db8::1]:443", a) == -EINVAL);
    CHECK(parse("1:2:3:4:5:6:7:8:9", a) == -EINVAL);
    CHECK(parse("1::2::3", a) == -EINVAL);
    CHECK(parse("pypi.org", a) == -EINVAL);
    CHECK(parse("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.2555", a) == -EINVAL);
    /* an embedded NUL must not end the text early: "1.2.3.4\0junk" is not 1.2.3.4 */
    CHECK(corral_inet_parse("1.2.3.4\0junk", 12, a) == -EINVAL);
    CHECK(corral_inet_parse("1.2.3.4\0junk", 7, a) == 4);
    char longtext[200];
    memset(longtext, '1', sizeof longtext);
    CHECK(corral_inet_parse(longtext, sizeof longtext, a) == -EINVAL);
}

static void test_unmap_format(void)
{
    uint8_t a[16], v4[4];
    int n = parse("::ffff:169.254.169.254", a);
    CHECK(n == 16);
    CHECK(corral_inet_unmap(a, 16, v4) == 1);
    CHECK(memcmp(v4, "\xa9\xfe\xa9\xfe", 4) == 0);
    /* controls: neighbours of the mapped prefix are not mapped */
    CHECK(parse("::fffe:169.254.169.254", a) == 16);
    CHECK(corral_inet_unmap(a, 16, v4) == 0);
    CHECK(parse("::169.254.169.254", a) == 16); /* IPv4-compatible, not mapped */
    CHECK(corral_inet_unmap(a, 16, v4) == 0);
    CHECK(parse("169.254.169.254", a) == 4);
    CHECK(corral_inet_unmap(a, 4, v4) == 0);

    CHECK(formats_as("2001:0DB8:0:0:0:0:0:1", "2001:db8::1"));
    CHECK(formats_as("[::FFFF:1.2.3.4]", "::ffff:1.2.3.4"));
    CHECK(formats_as("10.0.0.1", "10.0.0.1"));
    char small[4];
    CHECK(parse("10.0.0.1", a) == 4);
    CHECK(corral_inet_format(a, 4, small, sizeof small) == -ENOSPC);
    char text[CORRAL_INET_TEXT_MAX];
    CHECK(corral_inet_format(a, 4, text, sizeof text) == 8);
    CHECK(corral_inet_format(a, 5, text, sizeof text) == -EINVAL);
}

static void test_cidr(void)
{
    CHECK(in_cidr("10.20.3.4", "10.20.0.0", 16) == 1);
    CHECK(in_cidr("10.21.3.4", "10.20.0.0", 16) == 0);
    /* a prefix that does not end on a byte: 172.16.0.0/12 is 172.16-172.31 */
    CHECK(in_cidr("172.31.255.255", "172.16.0.0", 12) == 1);
    CHECK(in_cidr("172.32.0.0", "172.16.0.0", 12) == 0);
    CHECK(in_cidr("172.15.255.255", "172.16.0.0", 12) == 0);
    CHECK(in_cidr("100.127.0.1", "100.64.0.0", 10) == 1);
    CHECK(in_cidr("100.128.0.1", "100.64.0.0", 10) == 0);
    CHECK(in_cidr("1.2.3.4", "0.0.0.0", 0) == 1);
    CHECK(in_cidr("1.2.3.4", "1.2.3.4", 32) == 1);
    CHECK(in_cidr("1.2.3.5", "1.2.3.4", 32) == 0);
    CHECK(in_cidr("2001:db8:ffff::1", "2001:db8::", 32) == 1);
    CHECK(in_cidr("2001:db9::1", "2001:db8::", 32) == 0);
    CHECK(in_cidr("fe80::1", "fe80::", 10) == 1);
    CHECK(in_cidr("febf::1", "fe80::", 10) == 1);
    CHECK(in_cidr("fec0::1", "fe80::", 10) == 0);
    CHECK(in_cidr("::1", "::1", 128) == 1);
    CHECK(in_cidr("::2", "::1", 128) == 0);
    /* no silent family crossing: a mapped address is not inside an IPv4 network until
     * the caller unmaps it, and an IPv4 address is not inside ::ffff:0:0/96 */
    CHECK(in_cidr("::ffff:10.0.0.1", "10.0.0.0", 8) == 0);
    CHECK(in_cidr("10.0.0.1", "::ffff:0.0.0.0", 96) == 0);
    CHECK(in_cidr("::ffff:10.0.0.1", "::ffff:0.0.0.0", 96) == 1);
    CHECK(in_cidr("1.2.3.4", "0.0.0.0", 33) == -EINVAL);
    CHECK(in_cidr("::1", "::", 129) == -EINVAL);
    CHECK(in_cidr("::1", "::", 128) == 0);
}

static void test_mask(void)
{
    uint8_t a[16], want[16];
    CHECK(parse("10.20.1.7", a) == 4);
    CHECK(corral_inet_mask(a, 4, 16) == 0);
    CHECK(parse("10.20.0.0", want) == 4 && memcmp(a, want, 4) == 0);
    CHECK(parse("172.31.9.9", a) == 4);
    CHECK(corral_inet_mask(a, 4, 12) == 0);
    CHECK(parse("172.16.0.0", want) == 4 && memcmp(a, want, 4) == 0);
    CHECK(parse("2001:db8:aaaa::1", a) == 16);
    CHECK(corral_inet_mask(a, 16, 33) == 0);
    CHECK(parse("2001:db8:8000::", want) == 16 && memcmp(a, want, 16) == 0);
    CHECK(parse("1.2.3.4", a) == 4);
    CHECK(corral_inet_mask(a, 4, 32) == 0);
    CHECK(parse("1.2.3.4", want) == 4 && memcmp(a, want, 4) == 0);
    CHECK(corral_inet_mask(a, 4, 0) == 0);
    CHECK(memcmp(a, "\0\0\0\0", 4) == 0);
    CHECK(corral_inet_mask(a, 4, 33) == -EINVAL);
    CHECK(corral_inet_mask(a, 3, 8) == -EINVAL);
}

int main(void)
{
    test_parse();
    test_unmap_format();
    test_cidr();
    test_mask();
    return DONE();
}
