/*
 * The stand-in rules of a terminated connection (see standin.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "standin.h"

int corral_buf_add(struct corral_buf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

void corral_buf_clear(struct corral_buf *b)
{
    b->n = 0;
    if (b->p) b->p[0] = '\0';
}

void corral_buf_free(struct corral_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static bool bound_to(const struct corral_intercept_secret *s, const char *name)
{
    for (size_t i = 0; i < s->n_hosts; i++)
        if (strcasecmp(s->hosts[i], name) == 0) return true;
    return false;
}

static bool holds(const char *p, size_t n, const char *needle)
{
    return p && memmem(p, n, needle, strlen(needle)) != NULL;
}

/* Replaces every occurrence of from in b by to. */
static int replace_all(struct corral_buf *b, const char *from, const char *to)
{
    struct corral_buf o = {0};
    size_t fl = strlen(from), tl = strlen(to);
    const char *s = b->p, *end = b->p + b->n, *hit;
    while ((hit = memmem(s, (size_t)(end - s), from, fl))) {
        if (corral_buf_add(&o, s, (size_t)(hit - s)) < 0 || corral_buf_add(&o, to, tl) < 0)
            goto oom;
        s = hit + fl;
    }
    if (corral_buf_add(&o, s, (size_t)(end - s)) < 0) goto oom;
    corral_buf_free(b);
    *b = o;
    return 0;
oom:
    corral_buf_free(&o);
    return -ENOMEM;
}

/* Basic credentials (user:password, base64): decoded into out, or -1 when value is not
 * "Basic <base64>". */
static int basic_decode(const struct corral_buf *value, struct corral_buf *out)
{
    if (value->n < 7 || strncasecmp(value->p, "Basic ", 6) != 0) return -1;
    const char *b64 = value->p + 6;
    while (*b64 == ' ')
        b64++;
    size_t n = strlen(b64);
    while (n && (b64[n - 1] == ' ' || b64[n - 1] == '\t'))
        n--;
    if (n == 0 || n % 4) return -1;
    unsigned char *raw = malloc(n);
    if (!raw) return -1;
    int len = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)n);
    if (len < 0) {
        free(raw);
        return -1;
    }
    len -= (b64[n - 1] == '=') + (b64[n - 2] == '='); /* DecodeBlock counts the padding */
    int r = corral_buf_add(out, raw, (size_t)len);
    free(raw);
    return r;
}

static int basic_encode(struct corral_buf *value, const struct corral_buf *plain)
{
    size_t n = 4 * ((plain->n + 2) / 3) + 1;
    unsigned char *b64 = malloc(n);
    if (!b64) return -ENOMEM;
    EVP_EncodeBlock(b64, (const unsigned char *)plain->p, (int)plain->n);
    corral_buf_clear(value);
    int r = corral_buf_add(value, "Basic ", 6);
    if (r == 0) r = corral_buf_add(value, b64, strlen((char *)b64));
    free(b64);
    return r;
}

int corral_standin_header(const struct corral_conn_conf *c, const char *field,
                          struct corral_buf *value, bool *used, char *why, size_t why_size)
{
    if (corral_standin_in(c, field, strlen(field))) {
        /* a name is never rewritten, so a stand-in there would leave as it is */
        snprintf(why, why_size,
                 "a secret's stand-in in a header's name toward %s: a secret is put only in a "
                 "header's value",
                 c->name);
        return 1;
    }
    struct corral_buf plain = {0};
    bool basic = strcasecmp(field, "authorization") == 0 && basic_decode(value, &plain) == 0;
    int r = 0;
    for (size_t i = 0; i < c->n_secrets && r == 0; i++) {
        const struct corral_intercept_secret *s = &c->secrets[i];
        bool in_value = holds(value->p, value->n, s->stand_in);
        bool in_basic = basic && holds(plain.p, plain.n, s->stand_in);
        if (!in_value && !in_basic) continue;
        if (!bound_to(s, c->name)) {
            snprintf(why, why_size,
                     "a secret's stand-in in header %s toward %s, a host that secret is not "
                     "bound to (--secret NAME@%s would admit it)",
                     field, c->name, c->name);
            r = 1;
            break;
        }
        *used = true;
        if (in_value) r = replace_all(value, s->stand_in, s->value);
        if (r == 0 && in_basic) {
            r = replace_all(&plain, s->stand_in, s->value);
            if (r == 0) r = basic_encode(value, &plain);
        }
    }
    corral_buf_free(&plain);
    return r;
}

const struct corral_intercept_secret *corral_standin_in(const struct corral_conn_conf *c,
                                                        const char *p, size_t n)
{
    for (size_t i = 0; i < c->n_secrets; i++)
        if (holds(p, n, c->secrets[i].stand_in)) return &c->secrets[i];
    return NULL;
}

bool corral_standin_host_matches(const struct corral_conn_conf *c, const char *v)
{
    size_t nl = strlen(c->name);
    if (strncasecmp(v, c->name, nl) != 0) return false;
    if (v[nl] == '\0' || (v[nl] == '.' && v[nl + 1] == '\0')) return true;
    char port[16];
    snprintf(port, sizeof port, ":%d", c->port);
    return strcmp(v + nl, port) == 0;
}

int corral_standin_ask(const struct corral_conn_conf *c, const char *method, const char *target,
                       const char *names, char *why, size_t why_size)
{
    if (!c->ask) return 1;
    struct corral_intercept_event ev = {.kind = CORRAL_INTERCEPT_ASK, .port = c->port};
    size_t n = strcspn(target, "?#");
    snprintf(ev.method, sizeof ev.method, "%s", method);
    snprintf(ev.host, sizeof ev.host, "%s", c->name);
    snprintf(ev.path, sizeof ev.path, "%.*s", (int)(n < sizeof ev.path ? n : sizeof ev.path - 1),
             target);
    snprintf(ev.names, sizeof ev.names, "%s", names);
    for (char *p = ev.names; *p; p++)
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    if (c->ask(c->ask_arg, &ev)) return 1;
    snprintf(why, why_size, "%s", ev.reason);
    return 0;
}
