/*
 * How the connection targets (fuzz_http1.c, fuzz_h2.c) read one input: its first byte is
 * the size of the pieces the bytes arrive in (0: all at once), the rest is what the
 * tenant sends, then FUZZ_SPLIT_MARK, then what the server answers. Two sides
 * interleaved piece by piece, as a relay hands them over.
 */
#ifndef CORRAL_FUZZ_SPLIT_H
#define CORRAL_FUZZ_SPLIT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FUZZ_SPLIT_MARK "\0SERVER\0"
#define FUZZ_SPLIT_MARK_LEN 8

struct fuzz_side {
    const char *p;
    size_t n, at;
};

struct fuzz_split {
    size_t piece;
    struct fuzz_side tenant, server;
};

static inline struct fuzz_split fuzz_split(const uint8_t *data, size_t size)
{
    static const char none[1];
    struct fuzz_split s = {(size_t)-1, {none, 0, 0}, {none, 0, 0}};
    if (size == 0) return s;
    s.piece = data[0] ? data[0] : (size_t)-1;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *mark = memmem(p, n, FUZZ_SPLIT_MARK, FUZZ_SPLIT_MARK_LEN);
    s.tenant = (struct fuzz_side){p, mark ? (size_t)(mark - p) : n, 0};
    if (mark) {
        const char *rest = mark + FUZZ_SPLIT_MARK_LEN;
        s.server = (struct fuzz_side){rest, n - (size_t)(rest - p), 0};
    }
    return s;
}

/* The next piece of a side: its length (0 once all was handed over), *p set. */
static inline size_t fuzz_next(struct fuzz_split *s, struct fuzz_side *side, const char **p)
{
    size_t left = side->n - side->at;
    size_t k = left < s->piece ? left : s->piece;
    *p = side->p + side->at;
    side->at += k;
    return k;
}

#endif
