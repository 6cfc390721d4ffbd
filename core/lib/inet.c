/* IP address parsing, formatting and prefix tests: see inet.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "inet.h"

static const uint8_t v4mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

int corral_inet_parse(const char *s, size_t len, uint8_t out[16])
{
    /* the longest IPv6 text with an embedded IPv4 tail is 45 characters; two brackets */
    char buf[CORRAL_INET_TEXT_MAX + 2];
    if (len == 0 || len >= sizeof buf || memchr(s, '\0', len)) return -EINVAL;
    bool bracketed = s[0] == '[';
    if (bracketed) {
        if (len < 3 || s[len - 1] != ']') return -EINVAL;
        s++;
        len -= 2;
    } else if (s[len - 1] == ']') {
        return -EINVAL;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    /* inet_pton rejects zones, prefixes, brackets and the short and octal IPv4 forms
     * that inet_aton accepts ("1.2.3", "010.0.0.1"): test_inet checks each. */
    if (!bracketed && inet_pton(AF_INET, buf, out) == 1) return 4;
    if (strchr(buf, ':') && inet_pton(AF_INET6, buf, out) == 1) return 16;
    return -EINVAL;
}

int corral_inet_unmap(const uint8_t *addr, size_t len, uint8_t out4[4])
{
    if (len != 16 || memcmp(addr, v4mapped_prefix, sizeof v4mapped_prefix) != 0) return 0;
    memcpy(out4, addr + 12, 4);
    return 1;
}

int corral_inet_format(const uint8_t *addr, size_t len, char *out, size_t size)
{
    char buf[CORRAL_INET_TEXT_MAX];
    int af = len == 4 ? AF_INET : len == 16 ? AF_INET6 : -1;
    if (af < 0) return -EINVAL;
    if (!inet_ntop(af, addr, buf, sizeof buf)) return -errno;
    size_t n = strlen(buf);
    if (n >= size) return -ENOSPC;
    memcpy(out, buf, n + 1);
    return (int)n;
}

static int valid(size_t len, unsigned prefix)
{
    return (len == 4 || len == 16) && prefix <= len * 8;
}

int corral_inet_in_cidr(const uint8_t *addr, size_t alen, const uint8_t *net, size_t nlen,
                        unsigned prefix)
{
    if (!valid(nlen, prefix) || (alen != 4 && alen != 16)) return -EINVAL;
    if (alen != nlen) return 0;
    size_t whole = prefix / 8;
    if (memcmp(addr, net, whole) != 0) return 0;
    unsigned rest = prefix % 8;
    if (rest == 0) return 1;
    uint8_t m = (uint8_t)(0xff << (8 - rest));
    return (addr[whole] & m) == (net[whole] & m);
}

int corral_inet_mask(uint8_t *addr, size_t len, unsigned prefix)
{
    if (!valid(len, prefix)) return -EINVAL;
    size_t i = prefix / 8;
    unsigned rest = prefix % 8;
    if (rest) addr[i++] &= (uint8_t)(0xff << (8 - rest));
    memset(addr + i, 0, len - i);
    return 0;
}
