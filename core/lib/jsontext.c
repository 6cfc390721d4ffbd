/*
 * JSON text for the session wire's C side (see jsontext.h). The reader is a validating
 * scanner over RFC 8259's grammar with a nesting limit; it builds no tree, it only
 * finds where one member's value lies.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsontext.h"

/* Deeper documents are refused: the scanner recurses once per level. */
#define JSON_MAX_DEPTH 32

static int textbuf_reserve(struct corral_textbuf *b, size_t more)
{
    if (b->failed) return -1;
    if (b->len + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) {
        if (cap > SIZE_MAX / 2) goto fail;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) goto fail;
    b->data = p;
    b->cap = cap;
    return 0;
fail:
    b->failed = 1;
    return -1;
}

void corral_textbuf_add(struct corral_textbuf *b, const char *s, size_t n)
{
    if (textbuf_reserve(b, n) < 0) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void corral_textbuf_addstr(struct corral_textbuf *b, const char *s)
{
    corral_textbuf_add(b, s, strlen(s));
}

void corral_textbuf_free(struct corral_textbuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

/* The length of the well-formed UTF-8 sequence at s (at most n bytes), or 0: no
 * overlong forms, no surrogates, nothing past U+10FFFF (RFC 3629's table). */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

static void add_u00(struct corral_textbuf *b, unsigned char c)
{
    static const char hex[] = "0123456789abcdef";
    char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
    corral_textbuf_add(b, esc, sizeof esc);
}

/* raw_invalid: a byte that is no part of valid UTF-8 goes as itself, else as \u00XX */
static void add_string(struct corral_textbuf *b, const char *s, size_t n, int raw_invalid)
{
    const unsigned char *u = (const unsigned char *)s;
    corral_textbuf_add(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        const char *short_esc = NULL;
        switch (c) {
        case '"':
            short_esc = "\\\"";
            break;
        case '\\':
            short_esc = "\\\\";
            break;
        case '\n':
            short_esc = "\\n";
            break;
        case '\r':
            short_esc = "\\r";
            break;
        case '\t':
            short_esc = "\\t";
            break;
        case '\b':
            short_esc = "\\b";
            break;
        case '\f':
            short_esc = "\\f";
            break;
        default:
            break;
        }
        if (short_esc) {
            corral_textbuf_add(b, short_esc, 2);
            i++;
        } else if (c < 0x20) {
            add_u00(b, c);
            i++;
        } else {
            size_t len = utf8_sequence(u + i, n - i);
            if (len == 0 && raw_invalid) {
                corral_textbuf_add(b, s + i, 1);
                i++;
            } else if (len == 0) {
                add_u00(b, c);
                i++;
            } else {
                corral_textbuf_add(b, s + i, len);
                i += len;
            }
        }
    }
    corral_textbuf_add(b, "\"", 1);
}

void corral_json_add_string(struct corral_textbuf *b, const char *s, size_t n)
{
    add_string(b, s, n, 0);
}

void corral_json_add_bytes(struct corral_textbuf *b, const char *s, size_t n)
{
    add_string(b, s, n, 1);
}

/* ---- the reader ---------------------------------------------------------------------- */

struct scan {
    const char *p, *end;
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static void add_utf8(struct corral_textbuf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    corral_textbuf_add(b, u, n);
}

/* One \u escape (p at the 'u'), a surrogate pair read whole; the code point, or -1.
 * *used: the characters read after the backslash. A lone surrogate is U+FFFD. */
static long unicode_escape(const char *p, const char *end, size_t *used)
{
    unsigned hi, lo;
    if (end - p < 5 || hex4(p + 1, &hi) < 0) return -1;
    *used = 5;
    if (hi < 0xd800 || hi > 0xdfff) return hi;
    if (hi <= 0xdbff && end - p >= 11 && p[5] == '\\' && p[6] == 'u' && hex4(p + 7, &lo) == 0 &&
        lo >= 0xdc00 && lo <= 0xdfff) {
        *used = 11;
        return 0x10000 + (((long)hi - 0xd800) << 10) + ((long)lo - 0xdc00);
    }
    return 0xfffd;
}

/* A string at s->p (its opening quote); its unescaped bytes into out when out is not
 * NULL. Returns 0 or -1 malformed. */
static int scan_string(struct scan *s, struct corral_textbuf *out)
{
    if (s->p >= s->end || *s->p != '"') return -1;
    s->p++;
    while (s->p < s->end) {
        unsigned char c = (unsigned char)*s->p;
        if (c == '"') {
            s->p++;
            if (out) corral_textbuf_add(out, "", 0);
            return 0;
        }
        if (c < 0x20) return -1;
        if (c != '\\') {
            if (out) corral_textbuf_add(out, s->p, 1);
            s->p++;
            continue;
        }
        if (s->end - s->p < 2) return -1;
        const char *e = s->p + 1;
        char plain = 0;
        switch (*e) {
        case '"':
            plain = '"';
            break;
        case '\\':
            plain = '\\';
            break;
        case '/':
            plain = '/';
            break;
        case 'b':
            plain = '\b';
            break;
        case 'f':
            plain = '\f';
            break;
        case 'n':
            plain = '\n';
            break;
        case 'r':
            plain = '\r';
            break;
        case 't':
            plain = '\t';
            break;
        case 'u': {
            size_t used;
            long cp = unicode_escape(e, s->end, &used);
            if (cp < 0) return -1;
            if (out) add_utf8(out, cp == 0 ? 0xfffd : (unsigned)cp);
            s->p = e + used;
            continue;
        }
        default:
            return -1;
        }
        if (out) corral_textbuf_add(out, &plain, 1);
        s->p = e + 1;
    }
    return -1;
}

static int scan_digits(struct scan *s)
{
    const char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > start ? 0 : -1;
}

static int scan_number(struct scan *s)
{
    if (s->p < s->end && *s->p == '-') s->p++;
    if (s->p < s->end && *s->p == '0')
        s->p++;
    else if (scan_digits(s) < 0)
        return -1;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (scan_digits(s) < 0) return -1;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
        if (scan_digits(s) < 0) return -1;
    }
    return 0;
}

static int scan_word(struct scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return -1;
    s->p += n;
    return 0;
}

static int scan_value(struct scan *s, int depth, enum corral_json_type *type);

/* An object or array at s->p; close is '}' or ']'. */
static int scan_container(struct scan *s, int depth, char close)
{
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 0;
    }
    for (;;) {
        enum corral_json_type t;
        if (close == '}') {
            if (scan_string(s, NULL) < 0) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return -1;
            s->p++;
        }
        if (scan_value(s, depth + 1, &t) < 0) return -1;
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == close) {
            s->p++;
            return 0;
        }
        if (*s->p != ',') return -1;
        s->p++;
        skip_ws(s);
    }
}

/* A value at s->p (after whitespace); s->p left just past it. */
static int scan_value(struct scan *s, int depth, enum corral_json_type *type)
{
    skip_ws(s);
    if (s->p >= s->end || depth > JSON_MAX_DEPTH) return -1;
    switch (*s->p) {
    case '{':
        *type = CORRAL_JSON_OBJECT;
        return scan_container(s, depth, '}');
    case '[':
        *type = CORRAL_JSON_ARRAY;
        return scan_container(s, depth, ']');
    case '"':
        *type = CORRAL_JSON_STRING;
        return scan_string(s, NULL);
    case 't':
        *type = CORRAL_JSON_BOOL;
        return scan_word(s, "true");
    case 'f':
        *type = CORRAL_JSON_BOOL;
        return scan_word(s, "false");
    case 'n':
        *type = CORRAL_JSON_NULL;
        return scan_word(s, "null");
    default:
        *type = CORRAL_JSON_NUMBER;
        return scan_number(s);
    }
}

int corral_json_member(const char *text, size_t len, const char *key, struct corral_json_value *out)
{
    struct scan s = {text, text + len};
    struct corral_textbuf name = {0};
    int found = 0;
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{') return -EINVAL;
    s.p++;
    skip_ws(&s);
    int empty = s.p < s.end && *s.p == '}';
    if (empty) s.p++;
    while (!empty) {
        name.len = 0;
        if (scan_string(&s, &name) < 0) goto bad;
        if (name.failed) {
            corral_textbuf_free(&name);
            return -ENOMEM;
        }
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ':') goto bad;
        s.p++;
        skip_ws(&s);
        struct corral_json_value v = {CORRAL_JSON_NONE, s.p, 0};
        if (scan_value(&s, 1, &v.type) < 0) goto bad;
        v.len = (size_t)(s.p - v.start);
        /* the first of a repeated key, as the order a keeper writes can never repeat one */
        if (!found && strlen(name.data) == name.len && strcmp(name.data, key) == 0) {
            *out = v;
            found = 1;
        }
        skip_ws(&s);
        if (s.p >= s.end) goto bad;
        if (*s.p == '}') {
            s.p++;
            break;
        }
        if (*s.p != ',') goto bad;
        s.p++;
        skip_ws(&s);
    }
    corral_textbuf_free(&name);
    skip_ws(&s);
    return s.p == s.end ? found : -EINVAL;
bad:
    corral_textbuf_free(&name);
    return -EINVAL;
}

int corral_json_integer(const struct corral_json_value *v, long long *out)
{
    if (v->type != CORRAL_JSON_NUMBER || v->len == 0 || v->len > 20) return -EINVAL;
    char digits[24];
    memcpy(digits, v->start, v->len);
    digits[v->len] = '\0';
    if (strpbrk(digits, ".eE")) return -EINVAL;
    errno = 0;
    char *end;
    long long n = strtoll(digits, &end, 10);
    if (errno == ERANGE || *end != '\0') return -EINVAL;
    *out = n;
    return 0;
}

int corral_json_bool(const struct corral_json_value *v)
{
    if (v->type != CORRAL_JSON_BOOL) return -EINVAL;
    return v->start[0] == 't';
}

int corral_json_string(const struct corral_json_value *v, char **out)
{
    if (v->type != CORRAL_JSON_STRING) return -EINVAL;
    struct scan s = {v->start, v->start + v->len};
    struct corral_textbuf b = {0};
    if (scan_string(&s, &b) < 0) {
        corral_textbuf_free(&b);
        return -EINVAL;
    }
    if (b.failed) {
        corral_textbuf_free(&b);
        return -ENOMEM;
    }
    *out = b.data;
    return 0;
}
