/*
 * core/lib/jsontext.c: strings written as JSON (quotes, backslashes, control characters,
 * valid UTF-8 through, invalid bytes as \u00XX) read back by the same reader; members
 * found whatever their order; malformed documents refused; escapes and surrogate pairs
 * decoded.
 */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "jsontext.h"

/* s (n bytes) written as a JSON string, the text compared with want. */
static int escapes_to(const char *s, size_t n, const char *want)
{
    struct corral_textbuf b = {0};
    corral_json_add_string(&b, s, n);
    int same = !b.failed && strcmp(b.data, want) == 0;
    if (!same) fprintf(stderr, "escaped: %s, wanted %s\n", b.data ? b.data : "(null)", want);
    corral_textbuf_free(&b);
    return same;
}

static void test_escape(void)
{
    CHECK(escapes_to("", 0, "\"\""));
    CHECK(escapes_to("plain text", 10, "\"plain text\""));
    CHECK(escapes_to("a\"b\\c", 5, "\"a\\\"b\\\\c\""));
    CHECK(escapes_to("\n\r\t\b\f", 5, "\"\\n\\r\\t\\b\\f\""));
    CHECK(escapes_to("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\x7f\""));
    CHECK(escapes_to("nul\0x", 5, "\"nul\\u0000x\""));
    /* valid UTF-8 passes as it is: 2, 3 and 4 bytes */
    CHECK(escapes_to("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9,
                     "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""));
    /* invalid: a lone continuation, a truncated sequence, an overlong '/', a surrogate,
     * past U+10FFFF, 0xff */
    CHECK(escapes_to("\x80", 1, "\"\\u0080\""));
    CHECK(escapes_to("\xe2\x82", 2, "\"\\u00e2\\u0082\""));
    CHECK(escapes_to("\xc0\xaf", 2, "\"\\u00c0\\u00af\""));
    CHECK(escapes_to("\xed\xa0\x80", 3, "\"\\u00ed\\u00a0\\u0080\""));
    CHECK(escapes_to("\xf4\x90\x80\x80", 4, "\"\\u00f4\\u0090\\u0080\\u0080\""));
    CHECK(escapes_to("a\xffz", 3, "\"a\\u00ffz\""));
}

/* corral_json_add_bytes: the same escapes, but an invalid byte goes as itself */
static void test_bytes(void)
{
    struct corral_textbuf b = {0};
    corral_json_add_bytes(&b, "a\xff\xe2\x82\"\n\xc3\xa9", 8);
    CHECK(!b.failed && strcmp(b.data, "\"a\xff\xe2\x82\\\"\\n\xc3\xa9\"") == 0);
    corral_textbuf_free(&b);
}

/* Every byte 0-255 once and a few hostile mixes: what is written reads back as one
 * valid string whose member is found. */
static void test_round_trip(void)
{
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    struct corral_textbuf doc = {0};
    corral_textbuf_addstr(&doc, "{\"k\":");
    corral_json_add_string(&doc, all, sizeof all);
    corral_textbuf_addstr(&doc, ",\"after\":1}");
    struct corral_json_value v;
    CHECK(corral_json_member(doc.data, doc.len, "after", &v) == 1);
    CHECK(corral_json_member(doc.data, doc.len, "k", &v) == 1);
    char *s = NULL;
    CHECK(corral_json_string(&v, &s) == 0);
    /* ASCII comes back byte for byte; \u0000 as U+FFFD keeps the string whole */
    CHECK(s != NULL && memcmp(s, "\xef\xbf\xbd\x01\x02", 5) == 0);
    CHECK(s != NULL && memchr(s, '"', strlen(s)) != NULL && strchr(s, '\\') != NULL);
    free(s);
    corral_textbuf_free(&doc);

    const char *text = "quote\" back\\ nl\n tab\t \xc3\xa9";
    struct corral_textbuf b = {0};
    corral_textbuf_addstr(&b, "{\"x\":");
    corral_json_add_string(&b, text, strlen(text));
    corral_textbuf_addstr(&b, "}");
    CHECK(corral_json_member(b.data, b.len, "x", &v) == 1);
    CHECK(corral_json_string(&v, &s) == 0);
    CHECK(s != NULL && strcmp(s, text) == 0);
    free(s);
    corral_textbuf_free(&b);
}

static void test_members(void)
{
    const char *doc =
        " { \"a\" : [1, {\"b\": null}, \"}\"], \"ok\":true, \"n\":-12 ,\"e\":\"x\" } \n";
    struct corral_json_value v;
    long long n;
    CHECK(corral_json_member(doc, strlen(doc), "ok", &v) == 1 && corral_json_bool(&v) == 1);
    CHECK(corral_json_member(doc, strlen(doc), "n", &v) == 1);
    CHECK(corral_json_integer(&v, &n) == 0 && n == -12);
    CHECK(corral_json_member(doc, strlen(doc), "a", &v) == 1 && v.type == CORRAL_JSON_ARRAY);
    /* "b" is nested, not a member of the outer object */
    CHECK(corral_json_member(doc, strlen(doc), "b", &v) == 0);
    CHECK(corral_json_member("{}", 2, "ok", &v) == 0);
    /* a key written with escapes is the same key */
    CHECK(corral_json_member("{\"\\u006fk\":false}", 17, "ok", &v) == 1 &&
          corral_json_bool(&v) == 0);
    /* a number with a fraction or exponent, or past long long, is no integer */
    const char *f = "{\"x\":1.5,\"y\":1e3,\"z\":99999999999999999999}";
    CHECK(corral_json_member(f, strlen(f), "x", &v) == 1 && corral_json_integer(&v, &n) < 0);
    CHECK(corral_json_member(f, strlen(f), "y", &v) == 1 && corral_json_integer(&v, &n) < 0);
    CHECK(corral_json_member(f, strlen(f), "z", &v) == 1 && corral_json_integer(&v, &n) < 0);
}

static void test_malformed(void)
{
    static const char *const bad[] = {
        "",
        "[]",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1}x",
        "{a:1}",
        "{\"a\":tru}",
        "{\"a\":01}",
        "{\"a\":\"\x01\"}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"open}",
        "{\"a\":[1,2}",
        "{\"a\":-}",
        "{\"a\":1.}",
        "{\"a\" 1}",
    };
    struct corral_json_value v;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int r = corral_json_member(bad[i], strlen(bad[i]), "a", &v);
        if (r != -EINVAL) fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(r == -EINVAL);
    }
    /* nesting deeper than the limit is refused, a shallow one read */
    char deep[200];
    memset(deep, '[', sizeof deep);
    memcpy(deep, "{\"a\":", 5);
    CHECK(corral_json_member(deep, sizeof deep, "a", &v) == -EINVAL);
    CHECK(corral_json_member("{\"a\":[[[]]]}", 12, "a", &v) == 1);
}

static void test_unescape(void)
{
    const char *doc = "{\"s\":\"a\\/b\\u00e9\\ud83d\\ude00\\ud800x\\u0000\"}";
    struct corral_json_value v;
    char *s = NULL;
    CHECK(corral_json_member(doc, strlen(doc), "s", &v) == 1);
    CHECK(corral_json_string(&v, &s) == 0);
    /* a/b, é, 😀 (a pair), a lone surrogate and NUL as U+FFFD */
    CHECK(s && strcmp(s, "a/b\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbdx\xef\xbf\xbd") == 0);
    free(s);
    CHECK(corral_json_member("{\"s\":1}", 7, "s", &v) == 1 &&
          corral_json_string(&v, &s) == -EINVAL);
}

int main(void)
{
    test_escape();
    test_bytes();
    test_round_trip();
    test_members();
    test_malformed();
    test_unescape();
    return DONE();
}
