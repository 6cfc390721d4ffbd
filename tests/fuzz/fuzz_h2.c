/*
 * libFuzzer target for a terminated connection's HTTP/2 (core/lib/h2.c): the frames the
 * tenant sends and the ones the server answers (fuzz_split.h says how one input holds
 * both), on a connection to api.test that has a secret bound to it and one bound to
 * other.test. Besides the sanitizers' verdict, it checks that every call's result is
 * one it documents, that each event is of a kind the session makes with its texts
 * NUL-terminated, and that once the tenant's session is done it stays done.
 * Built and run by scripts/run-fuzz; replayed by tests/c/test_fuzz_corpus.c.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_split.h"
#include "h2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static const char *const api_hosts[] = {"api.test"};
static const char *const other_hosts[] = {"other.test"};
static const struct corral_intercept_secret secrets[] = {
    {"ghp_STANDINaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1", "ghp_realVALUEforAPI1", api_hosts, 1},
    {"ghp_STANDINbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2", "ghp_realVALUEforOTHER2", other_hosts, 1},
};

static void drain(struct corral_h2 *h)
{
    struct corral_intercept_event ev[8];
    size_t k;
    while ((k = corral_h2_take(h, ev, 8))) {
        ASSERT(k <= 8);
        for (size_t i = 0; i < k; i++) {
            ASSERT(ev[i].kind == CORRAL_INTERCEPT_REQUEST ||
                   ev[i].kind == CORRAL_INTERCEPT_REFUSED);
            ASSERT(memchr(ev[i].method, 0, sizeof ev[i].method));
            ASSERT(memchr(ev[i].host, 0, sizeof ev[i].host));
            ASSERT(memchr(ev[i].path, 0, sizeof ev[i].path));
            ASSERT(memchr(ev[i].reason, 0, sizeof ev[i].reason));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_split s = fuzz_split(data, size);
    struct corral_conn_conf conf = {"api.test", 443, secrets, 2, NULL, NULL};
    struct corral_h2 *h = corral_h2_new(&conf);
    ASSERT(h);
    struct corral_buf to_tenant = {0}, to_up = {0};
    int up = 1, done = 0;
    for (;;) {
        ASSERT(corral_h2_output(h, &to_tenant, &to_up) == 0);
        drain(h);
        corral_buf_clear(&to_tenant);
        corral_buf_clear(&to_up);
        if (done) ASSERT(corral_h2_done(h)); /* a finished session stays finished */
        if ((done = corral_h2_done(h))) break;
        const char *p;
        size_t n = fuzz_next(&s, &s.tenant, &p);
        if (n) {
            int r = corral_h2_from_tenant(h, p, n);
            ASSERT(r == 0 || r == -1);
        }
        size_t m = up ? fuzz_next(&s, &s.server, &p) : 0;
        if (m) {
            int r = corral_h2_from_upstream(h, p, m);
            ASSERT(r == 0 || r == -1);
            if (r < 0) {
                corral_h2_upstream_ended(h); /* as the relay does */
                up = 0;
            }
        }
        if (!n && !m) {
            /* both sides said all they had: the server's leg ends, as it would */
            if (up) corral_h2_upstream_ended(h);
            break;
        }
    }
    ASSERT(corral_h2_output(h, &to_tenant, &to_up) == 0);
    drain(h);
    corral_h2_free(h);
    corral_buf_free(&to_tenant);
    corral_buf_free(&to_up);
    return 0;
}
