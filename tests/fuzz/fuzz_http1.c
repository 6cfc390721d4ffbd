/*
 * libFuzzer target for a terminated connection's HTTP/1.1 (core/lib/http1.c): the
 * tenant's requests and the server's responses (fuzz_split.h says how one input holds
 * both), on a connection to api.test that has two secrets: one bound to api.test, one
 * to other.test. Besides the sanitizers' verdict, it checks:
 *  - a request's result is 0, 1 (refused: a 403 with a reason) or -EPROTO (a 400), and
 *    nothing is fed once the connection has ended;
 *  - no stand-in ever goes upstream, and the other host's secret never does either
 *    (unless the tenant itself sent that value);
 *  - every event's texts are NUL-terminated within their fields.
 * Built and run by scripts/run-fuzz; replayed by tests/c/test_fuzz_corpus.c.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_split.h"
#include "http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

#define STANDIN_API "ghp_STANDINaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"
#define STANDIN_OTHER "ghp_STANDINbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2"
#define VALUE_API "ghp_realVALUEforAPIxxxxxxxxxxxxxxxxxxxxx1"
#define VALUE_OTHER "ghp_realVALUEforOTHERyyyyyyyyyyyyyyyyyy2"

static const char *const api_hosts[] = {"api.test"};
static const char *const other_hosts[] = {"other.test"};
static const struct corral_intercept_secret secrets[] = {
    {STANDIN_API, VALUE_API, api_hosts, 1},
    {STANDIN_OTHER, VALUE_OTHER, other_hosts, 1},
};

static void check_event(const struct corral_intercept_event *ev)
{
    ASSERT(memchr(ev->method, 0, sizeof ev->method));
    ASSERT(memchr(ev->host, 0, sizeof ev->host));
    ASSERT(memchr(ev->path, 0, sizeof ev->path));
    ASSERT(memchr(ev->reason, 0, sizeof ev->reason));
    ASSERT(memchr(ev->names, 0, sizeof ev->names));
}

/* The conf's ask: every request may go, its event checked on the way. */
static int ask(void *arg, struct corral_intercept_event *ev)
{
    (void)arg;
    check_event(ev);
    return 1;
}

static void check_upstream(const struct corral_buf *out, const struct fuzz_split *s)
{
    if (!out->n) return;
    ASSERT(!memmem(out->p, out->n, STANDIN_API, sizeof STANDIN_API - 1));
    ASSERT(!memmem(out->p, out->n, STANDIN_OTHER, sizeof STANDIN_OTHER - 1));
    if (!memmem(s->tenant.p, s->tenant.n, VALUE_OTHER, sizeof VALUE_OTHER - 1))
        ASSERT(!memmem(out->p, out->n, VALUE_OTHER, sizeof VALUE_OTHER - 1));
}

/* One piece of the tenant's: 1 when the connection goes on. */
static int request(struct corral_http1 *h, struct fuzz_split *s, const char *p, size_t n)
{
    struct corral_buf out = {0};
    struct corral_intercept_event ev;
    memset(&ev, 0, sizeof ev);
    int r = corral_http1_request(h, p, n, &out, &ev);
    ASSERT(r == 0 || r == 1 || r == -EPROTO || r == -ENOMEM);
    check_upstream(&out, s);
    corral_buf_free(&out);
    if (r == 1) ASSERT(ev.kind == CORRAL_INTERCEPT_REFUSED && ev.status == 403);
    if (r == -EPROTO) ASSERT(ev.status == 400);
    if (r != 0) check_event(&ev);
    return r == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_split s = fuzz_split(data, size);
    struct corral_conn_conf conf = {"api.test", 443, secrets, 2, ask, NULL};
    struct corral_http1 *h = corral_http1_new(&conf);
    ASSERT(h);
    int open = 1, up = 1;
    while (open || up) {
        const char *p;
        size_t n = open ? fuzz_next(&s, &s.tenant, &p) : 0;
        if (open) open = request(h, &s, p, n) && n > 0;
        n = up ? fuzz_next(&s, &s.server, &p) : 0;
        if (up) {
            struct corral_intercept_event ev[8];
            size_t k = corral_http1_response(h, p, n, ev, 8);
            ASSERT(k <= 8);
            for (size_t i = 0; i < k; i++) {
                ASSERT(ev[i].kind == CORRAL_INTERCEPT_REQUEST);
                check_event(&ev[i]);
            }
            up = n > 0;
        }
        (void)corral_http1_awaiting(h);
    }
    corral_http1_free(h);
    return 0;
}
