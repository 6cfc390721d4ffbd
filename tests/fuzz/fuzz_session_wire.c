/*
 * libFuzzer target for the C side of the session socket (core/lib/session_wire.c and
 * its JSON reader core/lib/jsontext.c): every input is an answer line a keeper (or
 * whatever listens on session-ID.sock) could send `corral exec`. Besides the
 * sanitizers' verdict, it checks:
 *  - an answer is read as 0, -EINVAL or -ENOMEM, and one read as 0 is one of the three
 *    shapes with its numbers in range (status 1-255, exit 0-255, pid >= 1);
 *  - each member the reader finds lies inside the input, and a string one unescapes to
 *    a C string;
 *  - any input written as a JSON string reads back whole: the same bytes where they are
 *    valid UTF-8 without NUL (the writer's escaping is lossless there).
 * Built and run by scripts/run-fuzz; replayed by tests/c/test_fuzz_corpus.c.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "session_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static void check_answer(const char *line, size_t len)
{
    struct corral_session_answer a;
    memset(&a, 0, sizeof a);
    int r = corral_session_answer_parse(line, len, &a);
    ASSERT(r == 0 || r == -EINVAL || r == -ENOMEM);
    if (r != 0) return;
    switch (a.kind) {
    case CORRAL_ANSWER_REFUSED:
        ASSERT(a.error && a.status >= 1 && a.status <= 255);
        free(a.error);
        break;
    case CORRAL_ANSWER_STARTED:
        ASSERT(a.pid >= 1);
        break;
    case CORRAL_ANSWER_ENDED:
        ASSERT(a.exit >= 0 && a.exit <= 255);
        break;
    default:
        ASSERT(0);
    }
}

static void check_member(const char *text, size_t len, const char *key)
{
    struct corral_json_value v;
    int r = corral_json_member(text, len, key, &v);
    ASSERT(r == 1 || r == 0 || r == -EINVAL);
    if (r != 1) return;
    ASSERT(v.start >= text && v.start + v.len <= text + len);
    long long n;
    if (v.type == CORRAL_JSON_NUMBER) (void)corral_json_integer(&v, &n);
    if (v.type == CORRAL_JSON_BOOL) ASSERT(corral_json_bool(&v) >= 0);
    char *s = NULL;
    int sr = corral_json_string(&v, &s);
    ASSERT(v.type == CORRAL_JSON_STRING ? (sr == 0 || sr == -ENOMEM) : sr == -EINVAL);
    if (sr == 0) ASSERT(strlen(s) <= v.len * 3);
    free(s);
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 when there is none. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80) return 1;
    size_t k = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (!k || k > n || p[0] > 0xf4) return 0;
    for (size_t i = 1; i < k; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (k == 3 && p[0] == 0xe0 && p[1] < 0xa0) return 0;  /* overlong */
    if (k == 3 && p[0] == 0xed && p[1] >= 0xa0) return 0; /* a surrogate */
    if (k == 4 && p[0] == 0xf0 && p[1] < 0x90) return 0;  /* overlong */
    if (k == 4 && p[0] == 0xf4 && p[1] >= 0x90) return 0; /* past U+10FFFF */
    return k;
}

static int plain_utf8(const uint8_t *p, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!p[i] || !(k = utf8_seq(p + i, n - i))) return 0;
    return 1;
}

static void check_round_trip(const uint8_t *data, size_t size)
{
    struct corral_textbuf b = {0};
    corral_textbuf_addstr(&b, "{\"k\":");
    corral_json_add_string(&b, (const char *)data, size);
    corral_textbuf_addstr(&b, "}");
    if (b.failed) return corral_textbuf_free(&b);
    struct corral_json_value v;
    ASSERT(corral_json_member(b.data, b.len, "k", &v) == 1 && v.type == CORRAL_JSON_STRING);
    char *s = NULL;
    int r = corral_json_string(&v, &s);
    ASSERT(r == 0 || r == -ENOMEM);
    if (r == 0 && plain_utf8(data, size)) ASSERT(strlen(s) == size && !memcmp(s, data, size));
    free(s);
    corral_textbuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the line as a heap copy of its exact size: a read past its end is an ASan report */
    char *line = malloc(size ? size : 1);
    ASSERT(line);
    if (size) memcpy(line, data, size);
    check_answer(line, size);
    static const char *const keys[] = {"ok", "error", "status", "result", "pid", "exit", ""};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        check_member(line, size, keys[i]);
    free(line);
    check_round_trip(data, size);
    return 0;
}
