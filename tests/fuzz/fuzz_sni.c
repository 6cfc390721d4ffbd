/*
 * libFuzzer target for the ClientHello / HTTP Host reader (core/lib/sni.c): every input
 * is the first flight a hostile tenant could send on a connection to an allowed name.
 * Besides the sanitizers' verdict, it checks:
 *  - the result is one of 0, -EAGAIN, -EBADMSG, and a name is only ever reported with 0;
 *  - a name is a NUL-terminated lowercase hostname of 1-255 bytes with no trailing dot,
 *    or (an HTTP Host in brackets) a valid IPv6 address in lowercase;
 *  - TLS is decided on the whole record: no strict prefix of an input read as TLS with
 *    0 is itself read as 0 (the check never answers on part of a ClientHello);
 *  - an HTTP head is decided at its blank line: a prefix that ends before it is -EAGAIN
 *    or -EBADMSG, never a name.
 * Built and run by scripts/run-fuzz.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "sni.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static void check_name(const struct corral_sni *s)
{
    ASSERT(s->name_len <= CORRAL_SNI_NAME_MAX && strlen(s->name) == s->name_len);
    struct in6_addr a;
    if (memchr(s->name, ':', s->name_len)) {
        /* an HTTP Host's [IPv6] literal: a valid address, in lowercase */
        ASSERT(s->kind == CORRAL_SNI_HTTP && inet_pton(AF_INET6, s->name, &a) == 1);
        for (size_t i = 0; i < s->name_len; i++)
            ASSERT(s->name[i] < 'A' || s->name[i] > 'Z');
        return;
    }
    if (s->name_len) ASSERT(s->name[s->name_len - 1] != '.');
    for (size_t i = 0; i < s->name_len; i++) {
        char c = s->name[i];
        ASSERT((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
               c == '_');
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct corral_sni s;
    int r = corral_sni_parse(data, size, &s);
    ASSERT(r == 0 || r == -EAGAIN || r == -EBADMSG);
    ASSERT(s.kind == CORRAL_SNI_OTHER || s.kind == CORRAL_SNI_TLS || s.kind == CORRAL_SNI_HTTP);
    if (r == 0) check_name(&s);
    if (r == 0 && s.kind == CORRAL_SNI_TLS) {
        for (size_t cut = 1; cut < size && cut < 5 + ((size_t)data[3] << 8 | data[4]); cut++) {
            struct corral_sni p;
            ASSERT(corral_sni_parse(data, cut, &p) != 0);
        }
    }
    if (r == 0 && s.kind == CORRAL_SNI_HTTP && size >= 4) {
        struct corral_sni p;
        int pr = corral_sni_parse(data, size - 1, &p);
        if (pr == 0) ASSERT(p.kind == CORRAL_SNI_HTTP);
        const uint8_t *blank = NULL;
        for (size_t i = 0; i + 3 < size && !blank; i++)
            if (!memcmp(data + i, "\r\n\r\n", 4)) blank = data + i;
        if (blank) {
            size_t before = (size_t)(blank - data) + 3;
            pr = corral_sni_parse(data, before, &p);
            ASSERT(pr != 0 || p.kind != CORRAL_SNI_HTTP);
        }
    }
    return 0;
}
