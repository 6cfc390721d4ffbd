/*
 * JSON text for the C side of the session wire (docs/sessions-protocol: one request line
 * out, a few fixed answer shapes back), before any Lua state exists: a growing buffer,
 * a string written as a JSON string, and a reader of one object's members. Lua code
 * uses dkjson (lua/corral/json.lua); this exists only because `corral exec` runs in C.
 *
 * Strings are escaped so that any byte string makes valid JSON: quote, backslash and
 * control characters escaped, valid UTF-8 passed through, each byte of an invalid UTF-8
 * sequence written as \u00XX (the reader then sees U+00XX: lossy, never invalid).
 */
#ifndef CORRAL_JSONTEXT_H
#define CORRAL_JSONTEXT_H

#include <stddef.h>

/* A heap buffer that grows; data is NUL-terminated once anything was added. A failed
 * allocation sets failed and every later add is a no-op, so a writer checks once at
 * the end. */
struct corral_textbuf {
    char *data;
    size_t len, cap;
    int failed;
};

void corral_textbuf_add(struct corral_textbuf *b, const char *s, size_t n);
void corral_textbuf_addstr(struct corral_textbuf *b, const char *s);
void corral_textbuf_free(struct corral_textbuf *b);

/* Appends s (n bytes) as a quoted JSON string: a byte that is no part of valid UTF-8 as
 * \u00XX (strict JSON, but it reads back as U+00XX, another byte sequence). */
void corral_json_add_string(struct corral_textbuf *b, const char *s, size_t n);

/* The same, with such a byte written as itself: not strict JSON, but a reader that copies
 * what is not an escape (the keeper's) gets s back byte for byte, as a command's
 * arguments and environment must be (a file name need not be UTF-8). */
void corral_json_add_bytes(struct corral_textbuf *b, const char *s, size_t n);

/* A value of one member of a JSON object, as corral_json_member finds it. */
enum corral_json_type {
    CORRAL_JSON_NONE,
    CORRAL_JSON_NULL,
    CORRAL_JSON_BOOL,
    CORRAL_JSON_NUMBER,
    CORRAL_JSON_STRING,
    CORRAL_JSON_OBJECT,
    CORRAL_JSON_ARRAY,
};

struct corral_json_value {
    enum corral_json_type type;
    const char *start; /* the value's text in the document */
    size_t len;
};

/* Finds member `key` of the object that text (len bytes) holds, surrounding whitespace
 * allowed. Every member before it is read through, nested values included, so a
 * document that is not one well-formed object is refused wherever its fault lies.
 * Returns 1 found (*out set), 0 absent, -EINVAL malformed. */
int corral_json_member(const char *text, size_t len, const char *key,
                       struct corral_json_value *out);

/* A NUMBER value as an integer: 0, or -EINVAL when it has a fraction or exponent or
 * lies outside long long. */
int corral_json_integer(const struct corral_json_value *v, long long *out);

/* A BOOL value: 1 true, 0 false, -EINVAL otherwise. */
int corral_json_bool(const struct corral_json_value *v);

/* A STRING value unescaped into a malloc'd, NUL-terminated string (\u escapes and
 * surrogate pairs as UTF-8; \u0000 as U+FFFD, so the result stays one C string).
 * Returns 0 or -EINVAL (not a string), -ENOMEM. */
int corral_json_string(const struct corral_json_value *v, char **out);

#endif
