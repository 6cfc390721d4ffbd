/*
 * One terminated connection's HTTP/1.1 (see http1.h).
 *
 * A request is rebuilt from what http-parser reports, never forwarded as raw bytes: its
 * head from the method, target and headers (each header after the checks and the
 * substitution), its body from the decoded body (re-chunked when it came chunked;
 * trailers are dropped). What the server receives is thus exactly what was checked.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>

#include "http1.h"

#define PENDING_MAX 64
#define HEAD_MAX (64 * 1024)

struct pending {
    char method[24];
    char path[CORRAL_INTERCEPT_TEXT];
    int secret_used;
    uint64_t bytes_up;
};

struct corral_http1 {
    const struct corral_conn_conf *conf;
    http_parser req, resp;
    /* the request being read */
    struct corral_buf url, field, value, head, body, names;
    bool in_value, host_seen, expect, secret_used, headed, current;
    uint64_t bytes_up;
    char why[CORRAL_INTERCEPT_TEXT * 3];
    int status, leak;
    struct corral_buf *out;
    /* requests sent, waiting for their responses (a ring) */
    struct pending q[PENDING_MAX];
    size_t qhead, qlen;
    /* the response being read */
    bool resp_broken;
    uint64_t bytes_down;
    struct corral_intercept_event *done;
    size_t ndone, maxdone;
};

static struct corral_http1 *of(http_parser *p)
{
    return p->data;
}

/* Refuses the request being read: status and why (printf-style), the parser stopped. */
__attribute__((format(printf, 3, 4))) static int refuse(struct corral_http1 *h, int leak,
                                                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->why, sizeof h->why, fmt, ap);
    va_end(ap);
    h->status = 403;
    h->leak = leak;
    return -1;
}

static int end_header(struct corral_http1 *h)
{
    if (!h->in_value) return 0;
    h->in_value = false;
    const char *f = h->field.p ? h->field.p : "";
    if (strcasecmp(f, "host") == 0) {
        if (h->host_seen)
            return refuse(h, 0, "two Host headers on a connection to %s", h->conf->name);
        h->host_seen = true;
        if (!corral_standin_host_matches(h->conf, h->value.p ? h->value.p : ""))
            return refuse(h, 0,
                          "Host %.200s on a connection to %s (each request on it must name %s)",
                          h->value.p ? h->value.p : "", h->conf->name, h->conf->name);
    }
    if (strcasecmp(f, "expect") == 0) h->expect = true;
    if (corral_buf_add(&h->names, f, strlen(f)) < 0 || corral_buf_add(&h->names, "\n", 1) < 0)
        return -1;
    if (!h->value.p) corral_buf_add(&h->value, "", 0);
    bool used = false;
    int r = corral_standin_header(h->conf, f, &h->value, &used, h->why, sizeof h->why);
    h->secret_used |= used;
    if (r == 1) {
        h->status = 403;
        h->leak = 1;
    }
    if (r != 0) return -1;
    if (corral_buf_add(&h->head, h->field.p, h->field.n) < 0 ||
        corral_buf_add(&h->head, ": ", 2) < 0 ||
        corral_buf_add(&h->head, h->value.p, h->value.n) < 0 ||
        corral_buf_add(&h->head, "\r\n", 2) < 0)
        return -1;
    corral_buf_clear(&h->field);
    corral_buf_clear(&h->value);
    return h->head.n > HEAD_MAX ? refuse(h, 0, "request head over %d bytes", HEAD_MAX) : 0;
}

static int on_message_begin(http_parser *p)
{
    struct corral_http1 *h = of(p);
    corral_buf_clear(&h->url);
    corral_buf_clear(&h->head);
    corral_buf_clear(&h->body);
    corral_buf_clear(&h->names);
    h->in_value = h->host_seen = h->expect = h->secret_used = h->headed = h->current = false;
    h->bytes_up = 0;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    return corral_buf_add(&of(p)->url, at, n);
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct corral_http1 *h = of(p);
    if (end_header(h) != 0) return -1;
    return corral_buf_add(&h->field, at, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct corral_http1 *h = of(p);
    h->in_value = true;
    return corral_buf_add(&h->value, at, n);
}

/* What a pending entry logs: the target without its query. */
static void path_of(const struct corral_buf *url, char *out, size_t size)
{
    size_t n = strcspn(url->p ? url->p : "", "?#");
    snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), url->p ? url->p : "");
}

/* Moves what is held (head, body) to out: the request starts to leave. */
static int flush(struct corral_http1 *h)
{
    if (corral_buf_add(h->out, h->head.p, h->head.n) < 0 ||
        corral_buf_add(h->out, h->body.p, h->body.n) < 0)
        return -1;
    corral_buf_clear(&h->head);
    corral_buf_clear(&h->body);
    h->headed = true;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct corral_http1 *h = of(p);
    if (end_header(h) != 0) return -1;
    const char *url = h->url.p ? h->url.p : "";
    const char *method = http_method_str(p->method);
    if (!h->host_seen)
        return refuse(h, 0, "a request without Host on a connection to %s", h->conf->name);
    if (p->method == HTTP_CONNECT || p->upgrade)
        return refuse(h, 0,
                      "%s on a terminated connection to %s: only plain HTTP requests are relayed",
                      p->upgrade ? "Upgrade" : "CONNECT", h->conf->name);
    if (url[0] != '/' && !(p->method == HTTP_OPTIONS && strcmp(url, "*") == 0))
        return refuse(h, 0, "target %.100s is not a path on %s", url, h->conf->name);
    if (corral_standin_in(h->conf, h->url.p, h->url.n))
        return refuse(h, 1,
                      "a secret's stand-in in the URL toward %s: a secret is put only in request "
                      "headers, never in a URL (it would reach logs and referrers)",
                      h->conf->name);
    if (h->qlen == PENDING_MAX) return refuse(h, 0, "more than %d requests pipelined", PENDING_MAX);
    if (!corral_standin_ask(h->conf, method, url, h->names.p ? h->names.p : "", h->why,
                            sizeof h->why)) {
        h->status = 403;
        h->leak = 0;
        return -1;
    }
    char line[64 + 8];
    struct corral_buf head = {0};
    snprintf(line, sizeof line, "%s ", method);
    int r = corral_buf_add(&head, line, strlen(line));
    if (r == 0) r = corral_buf_add(&head, h->url.p, h->url.n);
    snprintf(line, sizeof line, " HTTP/%d.%d\r\n", p->http_major, p->http_minor);
    if (r == 0) r = corral_buf_add(&head, line, strlen(line));
    if (r == 0) r = corral_buf_add(&head, h->head.p, h->head.n);
    if (r == 0) r = corral_buf_add(&head, "\r\n", 2);
    corral_buf_free(&h->head);
    h->head = head;
    if (r != 0) return -1;
    struct pending *q = &h->q[(h->qhead + h->qlen++) % PENDING_MAX];
    snprintf(q->method, sizeof q->method, "%s", method);
    path_of(&h->url, q->path, sizeof q->path);
    q->secret_used = h->secret_used;
    q->bytes_up = 0;
    h->current = true;
    /* a client waiting for 100 Continue sends its body only once the head is through */
    return h->expect ? flush(h) : 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct corral_http1 *h = of(p);
    /* a stand-in split between two reads is found in the held tail plus the new bytes */
    size_t tail = h->body.n < 128 ? h->body.n : 128;
    struct corral_buf seam = {0};
    if (corral_buf_add(&seam, h->body.p ? h->body.p + h->body.n - tail : "", tail) < 0 ||
        corral_buf_add(&seam, at, n < 128 ? n : 128) < 0)
        return -1;
    bool found = corral_standin_in(h->conf, at, n) || corral_standin_in(h->conf, seam.p, seam.n);
    corral_buf_free(&seam);
    if (found)
        return refuse(h, 1,
                      "a secret's stand-in in a request body toward %s: a secret is put only "
                      "in request headers",
                      h->conf->name);
    h->bytes_up += n;
    h->q[(h->qhead + h->qlen - 1) % PENDING_MAX].bytes_up = h->bytes_up;
    char frame[24];
    if (p->flags & F_CHUNKED) {
        snprintf(frame, sizeof frame, "%zx\r\n", n);
        if (corral_buf_add(&h->body, frame, strlen(frame)) < 0) return -1;
    }
    if (corral_buf_add(&h->body, at, n) < 0) return -1;
    if ((p->flags & F_CHUNKED) && corral_buf_add(&h->body, "\r\n", 2) < 0) return -1;
    return h->head.n + h->body.n > CORRAL_HOLD_MAX ? flush(h) : 0;
}

static int on_message_complete(http_parser *p)
{
    struct corral_http1 *h = of(p);
    if ((p->flags & F_CHUNKED) && corral_buf_add(&h->body, "0\r\n\r\n", 5) < 0) return -1;
    h->current = false;
    return flush(h);
}

static const http_parser_settings REQ = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static int resp_headers(http_parser *p)
{
    struct corral_http1 *h = of(p);
    h->bytes_down = 0;
    /* a response to HEAD has no body whatever its Content-Length says */
    return h->qlen && strcmp(h->q[h->qhead].method, "HEAD") == 0 ? 1 : 0;
}

static int resp_body(http_parser *p, const char *at, size_t n)
{
    (void)at;
    of(p)->bytes_down += n;
    return 0;
}

static int resp_complete(http_parser *p)
{
    struct corral_http1 *h = of(p);
    if (p->status_code < 200 && p->status_code != 101) return 0; /* 100 Continue: more to come */
    if (!h->qlen) return -1;                                     /* an answer nobody asked */
    struct pending *q = &h->q[h->qhead];
    h->qhead = (h->qhead + 1) % PENDING_MAX;
    h->qlen--;
    if (h->ndone == h->maxdone) return 0;
    struct corral_intercept_event *e = &h->done[h->ndone++];
    memset(e, 0, sizeof *e);
    e->kind = CORRAL_INTERCEPT_REQUEST;
    snprintf(e->method, sizeof e->method, "%s", q->method);
    snprintf(e->host, sizeof e->host, "%s", h->conf->name);
    snprintf(e->path, sizeof e->path, "%s", q->path);
    e->status = (int)p->status_code;
    e->bytes_up = q->bytes_up;
    e->bytes_down = h->bytes_down;
    e->secret_used = q->secret_used;
    return 0;
}

static const http_parser_settings RESP = {
    .on_headers_complete = resp_headers,
    .on_body = resp_body,
    .on_message_complete = resp_complete,
};

struct corral_http1 *corral_http1_new(const struct corral_conn_conf *conf)
{
    struct corral_http1 *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->conf = conf;
    http_parser_init(&h->req, HTTP_REQUEST);
    http_parser_init(&h->resp, HTTP_RESPONSE);
    h->req.data = h->resp.data = h;
    return h;
}

void corral_http1_free(struct corral_http1 *h)
{
    if (!h) return;
    struct corral_buf *b[] = {&h->url, &h->field, &h->value, &h->head, &h->body, &h->names};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        corral_buf_free(b[i]);
    free(h);
}

static void refusal_event(struct corral_http1 *h, struct corral_intercept_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = CORRAL_INTERCEPT_REFUSED;
    snprintf(ev->method, sizeof ev->method, "%s", http_method_str(h->req.method));
    snprintf(ev->host, sizeof ev->host, "%s", h->conf->name);
    path_of(&h->url, ev->path, sizeof ev->path);
    ev->status = h->status;
    ev->leak = h->leak;
    snprintf(ev->reason, sizeof ev->reason, "%s", h->why);
}

int corral_http1_request(struct corral_http1 *h, const char *p, size_t n, struct corral_buf *out,
                         struct corral_intercept_event *ev)
{
    h->out = out;
    h->status = 0;
    size_t used = http_parser_execute(&h->req, &REQ, p, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&h->req);
    if (e == HPE_OK && used == n) return 0;
    if (h->status) {
        refusal_event(h, ev);
        return 1;
    }
    if (e == HPE_CB_url || e == HPE_CB_header_field || e == HPE_CB_header_value ||
        e == HPE_CB_headers_complete || e == HPE_CB_body || e == HPE_CB_message_complete)
        return -ENOMEM; /* a callback failed without refusing: out of memory */
    snprintf(h->why, sizeof h->why, "not an HTTP/1.1 request on a connection to %s: %s",
             h->conf->name, http_errno_description(e));
    h->status = 400;
    refusal_event(h, ev);
    return -EPROTO;
}

size_t corral_http1_response(struct corral_http1 *h, const char *p, size_t n,
                             struct corral_intercept_event *ev, size_t max)
{
    if (h->resp_broken) return 0;
    h->done = ev;
    h->ndone = 0;
    h->maxdone = max;
    size_t used = http_parser_execute(&h->resp, &RESP, p, n);
    if (HTTP_PARSER_ERRNO(&h->resp) != HPE_OK || used != n) h->resp_broken = true;
    return h->ndone;
}

int corral_http1_awaiting(const struct corral_http1 *h)
{
    return h->qlen > (size_t)h->current || h->headed;
}
