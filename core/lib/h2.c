/*
 * One terminated connection's HTTP/2 (see h2.h).
 *
 * Both sessions share one set of callbacks; which session called tells the side. A
 * stream is one struct for both sides, each session's stream user data pointing to it,
 * freed once both sides are closed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <nghttp2/nghttp2.h>

#include "h2.h"

#define WINDOW (1024 * 1024)   /* each stream's, each way */
#define CONN_WINDOW (16 << 20) /* the connection's, from the server */
#define STREAMS_MAX 100        /* the tenant's concurrent streams */
#define SEAM 128               /* a body's tail kept to find a stand-in split across reads */
#define HEADERS_MAX (64 * 1024)
#define HELD_MAX                                                                                   \
    (4 * CORRAL_HOLD_MAX) /* what all of a connection's streams may hold */ /* one header block's  \
                                                                               bytes */

struct headers {
    struct corral_buf *name, *value;
    size_t n, cap, bytes;
};

struct stream {
    struct stream *prev, *next;
    int32_t down, up;         /* the tenant's stream id; the server's (0: none yet) */
    struct headers req, resp; /* the header block being read each way */
    char method[24], path[CORRAL_INTERCEPT_TEXT];
    int status;
    bool headed, expect, used, submitted, req_eof, resp_started, resp_eof, refused;
    bool down_closed, up_closed, logged;
    struct headers trailers; /* the response's, sent after its body */
    bool has_trailers;
    struct corral_buf body_up, body_down; /* not yet passed on, from their offsets */
    size_t off_up, off_down;
    char seam[SEAM];
    size_t nseam;
    uint64_t bytes_up, bytes_down;
    int64_t length; /* the response's content-length; -1: none */
};

struct corral_h2 {
    const struct corral_conn_conf *conf;
    nghttp2_session *down, *up; /* the tenant's (server), the real server's (client) */
    struct stream *streams;
    struct corral_intercept_event *ev;
    size_t nev, cap;
    size_t held; /* request body bytes held, not yet submitted, over every stream */
    bool broken;
};

/* --- header lists ------------------------------------------------------------------ */

static int headers_add(struct headers *hd, const uint8_t *n, size_t nl, const uint8_t *v, size_t vl)
{
    if (hd->n == hd->cap) {
        size_t cap = hd->cap ? hd->cap * 2 : 16;
        struct corral_buf *a = realloc(hd->name, cap * sizeof *a);
        if (a) hd->name = a;
        struct corral_buf *b = a ? realloc(hd->value, cap * sizeof *b) : NULL;
        if (!b) return -ENOMEM;
        hd->value = b;
        hd->cap = cap;
    }
    hd->name[hd->n] = (struct corral_buf){0};
    hd->value[hd->n] = (struct corral_buf){0};
    hd->n++;
    hd->bytes += nl + vl;
    if (corral_buf_add(&hd->name[hd->n - 1], n, nl) < 0 ||
        corral_buf_add(&hd->value[hd->n - 1], v, vl) < 0)
        return -ENOMEM;
    return 0;
}

static void headers_clear(struct headers *hd)
{
    for (size_t i = 0; i < hd->n; i++) {
        corral_buf_free(&hd->name[i]);
        corral_buf_free(&hd->value[i]);
    }
    hd->n = hd->bytes = 0;
}

static void headers_free(struct headers *hd)
{
    headers_clear(hd);
    free(hd->name);
    free(hd->value);
    *hd = (struct headers){0};
}

static const char *header(const struct headers *hd, const char *name)
{
    for (size_t i = 0; i < hd->n; i++)
        if (strcasecmp(hd->name[i].p, name) == 0) return hd->value[i].p;
    return NULL;
}

/* The list as nghttp2 takes it (it copies the pairs); NULL without memory. */
static nghttp2_nv *nv_of(const struct headers *hd)
{
    nghttp2_nv *nv = calloc(hd->n ? hd->n : 1, sizeof *nv);
    for (size_t i = 0; nv && i < hd->n; i++)
        nv[i] = (nghttp2_nv){(uint8_t *)hd->name[i].p, (uint8_t *)hd->value[i].p, hd->name[i].n,
                             hd->value[i].n, NGHTTP2_NV_FLAG_NONE};
    return nv;
}

/* --- streams and events ------------------------------------------------------------ */

static struct stream *stream_new(struct corral_h2 *h, int32_t id)
{
    struct stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->down = id;
    s->length = -1;
    s->next = h->streams;
    if (h->streams) h->streams->prev = s;
    h->streams = s;
    return s;
}

static void stream_free(struct corral_h2 *h, struct stream *s)
{
    if (!s->submitted) h->held -= s->body_up.n;
    if (s->prev)
        s->prev->next = s->next;
    else
        h->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    headers_free(&s->req);
    headers_free(&s->resp);
    headers_free(&s->trailers);
    corral_buf_free(&s->body_up);
    corral_buf_free(&s->body_down);
    free(s);
}

/* Frees s once neither side can still speak of it. */
static void stream_settle(struct corral_h2 *h, struct stream *s)
{
    if (s->down_closed && (!s->up || s->up_closed)) stream_free(h, s);
}

static struct corral_intercept_event *event(struct corral_h2 *h, int kind, struct stream *s)
{
    if (h->nev == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        struct corral_intercept_event *e = realloc(h->ev, cap * sizeof *e);
        if (!e) return NULL;
        h->ev = e;
        h->cap = cap;
    }
    struct corral_intercept_event *e = &h->ev[h->nev++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    snprintf(e->method, sizeof e->method, "%s", s->method);
    snprintf(e->host, sizeof e->host, "%s", h->conf->name);
    snprintf(e->path, sizeof e->path, "%s", s->path);
    e->status = s->status;
    e->bytes_up = s->bytes_up;
    e->bytes_down = s->bytes_down;
    e->secret_used = s->used;
    return e;
}

/* Logs s's request once, before the tenant can have all of its response: when its
 * content-length is in, or its last frame is made (nghttp2 closes a stream only at a
 * later send, and a client holding content-length bytes need not wait for the end), or
 * else when it closes. */
static int log_request(struct corral_h2 *h, struct stream *s)
{
    if (s->logged || !s->headed || s->refused) return 0;
    s->logged = true;
    return event(h, CORRAL_INTERCEPT_REQUEST, s) ? 0 : -1;
}

/* --- the bodies, each way ---------------------------------------------------------- */

/* Drops what was passed on from the front of b once it is most of it. */
static void compact(struct corral_buf *b, size_t *off)
{
    if (*off == b->n) {
        corral_buf_clear(b);
        *off = 0;
    } else if (*off > 65536 && *off > b->n / 2) {
        memmove(b->p, b->p + *off, b->n - *off);
        b->n -= *off;
        *off = 0;
    }
}

static ssize_t read_body(struct corral_h2 *h, struct stream *s, bool to_up, uint8_t *buf,
                         size_t len, uint32_t *flags)
{
    struct corral_buf *b = to_up ? &s->body_up : &s->body_down;
    size_t *off = to_up ? &s->off_up : &s->off_down;
    bool eof = to_up ? s->req_eof : s->resp_eof;
    size_t n = b->n - *off < len ? b->n - *off : len;
    if (n == 0 && !eof) return NGHTTP2_ERR_DEFERRED;
    memcpy(buf, b->p + *off, n);
    *off += n;
    /* the sender's window opens as its bytes leave, not as they arrive */
    if (to_up)
        nghttp2_session_consume(h->down, s->down, n);
    else if (s->up && !s->refused)
        nghttp2_session_consume(h->up, s->up, n);
    compact(b, off);
    if (eof && *off == 0 && b->n == 0) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        if (!to_up) log_request(h, s);
        if (!to_up && s->has_trailers) {
            nghttp2_nv *nv = nv_of(&s->trailers);
            if (nv && nghttp2_submit_trailer(h->down, s->down, nv, s->trailers.n) == 0)
                *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
            free(nv);
        }
    }
    return (ssize_t)n;
}

static ssize_t read_cb(nghttp2_session *ss, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                       nghttp2_data_source *src, void *ud)
{
    (void)id;
    struct corral_h2 *h = ud;
    return read_body(h, src->ptr, ss == h->up, buf, len, flags);
}

/* --- the tenant's requests ---------------------------------------------------------- */

/* Answers stream s with corral's 403 (why in its body); nothing of it goes upstream. */
__attribute__((format(printf, 4, 5))) static int refuse(struct corral_h2 *h, struct stream *s,
                                                        int leak, const char *fmt, ...)
{
    struct corral_intercept_event *e = NULL;
    s->status = 403;
    s->refused = true;
    if (s->up && !s->up_closed) nghttp2_submit_rst_stream(h->up, 0, s->up, NGHTTP2_CANCEL);
    if ((e = event(h, CORRAL_INTERCEPT_REFUSED, s))) {
        e->leak = leak;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->reason, sizeof e->reason, fmt, ap);
        va_end(ap);
    }
    if (s->up) nghttp2_session_consume(h->up, s->up, s->body_down.n - s->off_down);
    if (s->resp_started) return nghttp2_submit_rst_stream(h->down, 0, s->down, NGHTTP2_CANCEL);
    s->resp_started = s->resp_eof = true;
    corral_buf_clear(&s->body_down);
    s->off_down = 0;
    if (corral_buf_add(&s->body_down, "corral: request refused: ", 25) < 0 ||
        corral_buf_add(&s->body_down, e ? e->reason : "", e ? strlen(e->reason) : 0) < 0 ||
        corral_buf_add(&s->body_down, "\n", 1) < 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    char len[24];
    snprintf(len, sizeof len, "%zu", s->body_down.n);
    const nghttp2_nv nv[] = {
        {(uint8_t *)":status", (uint8_t *)"403", 7, 3, 0},
        {(uint8_t *)"content-type", (uint8_t *)"text/plain; charset=utf-8", 12, 25, 0},
        {(uint8_t *)"content-length", (uint8_t *)len, 14, strlen(len), 0},
    };
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = read_cb};
    return nghttp2_submit_response(h->down, s->down, nv, 3, &dp) == 0
               ? 0
               : NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* The request's headers checked and rewritten in place. Returns 0, or what refuse
 * returns. */
static int check_request(struct corral_h2 *h, struct stream *s)
{
    const struct corral_conn_conf *c = h->conf;
    const char *method = header(&s->req, ":method"), *path = header(&s->req, ":path");
    const char *authority = header(&s->req, ":authority"), *host = header(&s->req, "host");
    snprintf(s->method, sizeof s->method, "%s", method ? method : "");
    size_t pl = path ? strcspn(path, "?#") : 0;
    snprintf(s->path, sizeof s->path, "%.*s", (int)(pl < sizeof s->path ? pl : sizeof s->path - 1),
             path ? path : "");
    if (method && strcmp(method, "CONNECT") == 0)
        return refuse(h, s, 0,
                      "CONNECT on a terminated connection to %s: only plain HTTP "
                      "requests are relayed",
                      c->name);
    if (!authority && !host)
        return refuse(h, s, 0, "a request without :authority on a connection to %s", c->name);
    const char *bad = authority && !corral_standin_host_matches(c, authority) ? authority
                      : host && !corral_standin_host_matches(c, host)         ? host
                                                                              : NULL;
    if (bad)
        return refuse(h, s, corral_standin_in(c, bad, strlen(bad)) != NULL,
                      ":authority %.200s on a connection to %s (each request on it must name %s)",
                      bad, c->name, c->name);
    if (!path || (path[0] != '/' && strcmp(path, "*") != 0))
        return refuse(h, s, 0, "target %.100s is not a path on %s", path ? path : "", c->name);
    if (corral_standin_in(c, path, strlen(path)))
        return refuse(h, s, 1,
                      "a secret's stand-in in the URL toward %s: a secret is put only in request "
                      "headers, never in a URL (it would reach logs and referrers)",
                      c->name);
    struct corral_buf names = {0};
    for (size_t i = 0; i < s->req.n; i++) {
        char why[CORRAL_INTERCEPT_TEXT * 3];
        if (s->req.name[i].p[0] == ':') continue;
        if (corral_buf_add(&names, s->req.name[i].p, s->req.name[i].n) < 0 ||
            corral_buf_add(&names, "\n", 1) < 0) {
            corral_buf_free(&names);
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        }
        if (strcasecmp(s->req.name[i].p, "expect") == 0) s->expect = true;
        int r =
            corral_standin_header(c, s->req.name[i].p, &s->req.value[i], &s->used, why, sizeof why);
        if (r != 0) corral_buf_free(&names);
        if (r == 1) return refuse(h, s, 1, "%s", why);
        if (r < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    char why[CORRAL_INTERCEPT_TEXT * 3];
    int ok = corral_standin_ask(c, method, path, names.p ? names.p : "", why, sizeof why);
    corral_buf_free(&names);
    return ok ? 0 : refuse(h, s, 0, "%s", why);
}

/* The request leaves: its headers, and its body as it comes. */
static int submit_up(struct corral_h2 *h, struct stream *s)
{
    nghttp2_nv *nv = nv_of(&s->req);
    if (!nv) return NGHTTP2_ERR_CALLBACK_FAILURE;
    h->held -= s->body_up.n;
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = read_cb};
    bool body = !s->req_eof || s->body_up.n;
    int32_t id = nghttp2_submit_request(h->up, NULL, nv, s->req.n, body ? &dp : NULL, s);
    free(nv);
    headers_clear(&s->req);
    s->submitted = true;
    if (id < 0) {
        return refuse(h, s, 0, "the server's HTTP/2 session took no more streams");
    }
    s->up = id;
    return 0;
}

static int request_body(struct corral_h2 *h, struct stream *s, const uint8_t *p, size_t n)
{
    if (s->refused) {
        nghttp2_session_consume(h->down, s->down, n);
        return 0;
    }
    /* a stand-in split between two reads is found in the kept tail plus the new bytes */
    char seam[2 * SEAM];
    size_t k = n < SEAM ? n : SEAM;
    memcpy(seam, s->seam, s->nseam);
    memcpy(seam + s->nseam, p, k);
    if (corral_standin_in(h->conf, (const char *)p, n) ||
        corral_standin_in(h->conf, seam, s->nseam + k))
        return refuse(h, s, 1,
                      "a secret's stand-in in a request body toward %s: a secret is put only in "
                      "request headers",
                      h->conf->name);
    size_t keep = n < SEAM ? n : SEAM;
    if (s->nseam + keep > SEAM) {
        size_t drop = s->nseam + keep - SEAM;
        memmove(s->seam, s->seam + drop, s->nseam - drop);
        s->nseam -= drop;
    }
    memcpy(s->seam + s->nseam, p + n - keep, keep);
    s->nseam += keep;
    s->bytes_up += n;
    if (corral_buf_add(&s->body_up, p, n) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (s->submitted) return nghttp2_session_resume_data(h->up, s->up), 0;
    /* held: the window opens at once, so the holding is bounded here, per stream and in all */
    nghttp2_session_consume(h->down, s->down, n);
    h->held += n;
    return s->body_up.n > CORRAL_HOLD_MAX || h->held > HELD_MAX ? submit_up(h, s) : 0;
}

/* A frame of the tenant's, whole: a request's headers, its trailers, or its body's end. */
static int tenant_frame(struct corral_h2 *h, const nghttp2_frame *f)
{
    struct stream *s = nghttp2_session_get_stream_user_data(h->down, f->hd.stream_id);
    if (!s || (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA)) return 0;
    bool end = f->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (end) s->req_eof = true;
    if (f->hd.type == NGHTTP2_HEADERS && !s->headed) {
        s->headed = true;
        int r = check_request(h, s);
        if (r || s->refused) return r;
        return end || s->expect ? submit_up(h, s) : 0;
    }
    if (s->refused || !end) return 0;
    if (!s->submitted) return submit_up(h, s);
    nghttp2_session_resume_data(h->up, s->up);
    return 0;
}

/* --- the server's responses --------------------------------------------------------- */

static int upstream_headers(struct corral_h2 *h, struct stream *s, bool end)
{
    const char *status = header(&s->resp, ":status");
    int code = status ? atoi(status) : 0;
    if (end) s->resp_eof = true;
    if (s->refused || s->down_closed) {
        headers_clear(&s->resp);
        return 0;
    }
    nghttp2_nv *nv = nv_of(&s->resp);
    int r = nv ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE;
    if (nv && !s->resp_started && code >= 100 && code < 200) {
        r = nghttp2_submit_headers(h->down, 0, s->down, NULL, nv, s->resp.n, NULL);
    } else if (nv && !s->resp_started) {
        s->status = code;
        s->resp_started = true;
        const char *cl = header(&s->resp, "content-length");
        s->length = cl ? strtoll(cl, NULL, 10) : -1;
        nghttp2_data_provider dp = {.source.ptr = s, .read_callback = read_cb};
        r = nghttp2_submit_response(h->down, s->down, nv, s->resp.n, end ? NULL : &dp);
        if (end && r == 0) r = log_request(h, s);
    } else if (nv) {
        /* trailers: sent once the body has gone */
        headers_free(&s->trailers);
        s->trailers = s->resp;
        s->resp = (struct headers){0};
        s->has_trailers = true;
        nghttp2_session_resume_data(h->down, s->down);
    }
    free(nv);
    headers_clear(&s->resp);
    return r ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
}

/* --- the callbacks ------------------------------------------------------------------ */

static int on_begin_headers(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    struct corral_h2 *h = ud;
    if (ss != h->down || f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct stream *s = stream_new(h, f->hd.stream_id);
    if (!s) return NGHTTP2_ERR_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(ss, f->hd.stream_id, s);
    return 0;
}

static int on_header(nghttp2_session *ss, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                     const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    (void)flags;
    struct corral_h2 *h = ud;
    struct stream *s = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
    if (!s) return 0;
    struct headers *hd = ss == h->down ? &s->req : &s->resp;
    if (ss == h->down && s->headed) return 0; /* request trailers: dropped */
    if (hd->bytes + nl + vl > HEADERS_MAX) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return headers_add(hd, name, nl, value, vl) ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
}

static int on_frame_recv(nghttp2_session *ss, const nghttp2_frame *f, void *ud)
{
    struct corral_h2 *h = ud;
    if (ss == h->down) return tenant_frame(h, f);
    struct stream *s = nghttp2_session_get_stream_user_data(ss, f->hd.stream_id);
    if (!s) return 0;
    bool end = f->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (f->hd.type == NGHTTP2_HEADERS) return upstream_headers(h, s, end);
    if (f->hd.type == NGHTTP2_DATA && end) {
        s->resp_eof = true;
        if (!s->refused && !s->down_closed) nghttp2_session_resume_data(h->down, s->down);
    }
    return 0;
}

static int on_data(nghttp2_session *ss, uint8_t flags, int32_t id, const uint8_t *p, size_t n,
                   void *ud)
{
    (void)flags;
    struct corral_h2 *h = ud;
    struct stream *s = nghttp2_session_get_stream_user_data(ss, id);
    if (!s) {
        nghttp2_session_consume(ss, id, n);
        return 0;
    }
    if (ss == h->down) return request_body(h, s, p, n);
    s->bytes_down += n;
    if (s->refused || s->down_closed) {
        nghttp2_session_consume(ss, id, n);
        return 0;
    }
    if (corral_buf_add(&s->body_down, p, n) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    nghttp2_session_resume_data(h->down, s->down);
    if (s->length >= 0 && s->bytes_down >= (uint64_t)s->length && log_request(h, s) < 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return 0;
}

static int on_close(nghttp2_session *ss, int32_t id, uint32_t code, void *ud)
{
    struct corral_h2 *h = ud;
    struct stream *s = nghttp2_session_get_stream_user_data(ss, id);
    if (!s) return 0;
    nghttp2_session_set_stream_user_data(ss, id, NULL);
    if (ss == h->down) {
        s->down_closed = true;
        if (s->up && !s->up_closed) nghttp2_submit_rst_stream(h->up, 0, s->up, NGHTTP2_CANCEL);
        if (log_request(h, s) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    } else {
        s->up_closed = true;
        s->resp_eof = true;
        if (!s->down_closed && !s->refused) {
            if (code != NGHTTP2_NO_ERROR || !s->resp_started)
                nghttp2_submit_rst_stream(h->down, 0, s->down,
                                          code != NGHTTP2_NO_ERROR ? code : NGHTTP2_INTERNAL_ERROR);
            else
                nghttp2_session_resume_data(h->down, s->down);
        }
    }
    stream_settle(h, s);
    return 0;
}

/* --- the session pair --------------------------------------------------------------- */

static int open_sessions(struct corral_h2 *h)
{
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    if (nghttp2_session_callbacks_new(&cb) != 0) return -1;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return -1;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    int r = nghttp2_session_server_new2(&h->down, cb, h, opt);
    if (r == 0) r = nghttp2_session_client_new2(&h->up, cb, h, opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (r != 0) return -1;
    const nghttp2_settings_entry down[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, STREAMS_MAX},
                                           {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW}};
    const nghttp2_settings_entry up[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                         {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW}};
    if (nghttp2_submit_settings(h->down, 0, down, 2) != 0 ||
        nghttp2_submit_settings(h->up, 0, up, 2) != 0 ||
        nghttp2_session_set_local_window_size(h->up, 0, 0, CONN_WINDOW) != 0 ||
        nghttp2_session_set_local_window_size(h->down, 0, 0, CONN_WINDOW) != 0)
        return -1;
    return 0;
}

struct corral_h2 *corral_h2_new(const struct corral_conn_conf *conf)
{
    struct corral_h2 *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->conf = conf;
    if (open_sessions(h) < 0) {
        corral_h2_free(h);
        return NULL;
    }
    return h;
}

void corral_h2_free(struct corral_h2 *h)
{
    if (!h) return;
    nghttp2_session_del(h->down);
    nghttp2_session_del(h->up);
    while (h->streams)
        stream_free(h, h->streams);
    free(h->ev);
    free(h);
}

static int feed(struct corral_h2 *h, nghttp2_session *s, const char *p, size_t n)
{
    ssize_t r = nghttp2_session_mem_recv(s, (const uint8_t *)p, n);
    if (r >= 0) return 0;
    h->broken = true;
    nghttp2_session_terminate_session(h->down, NGHTTP2_PROTOCOL_ERROR);
    return -1;
}

int corral_h2_from_tenant(struct corral_h2 *h, const char *p, size_t n)
{
    return feed(h, h->down, p, n);
}

int corral_h2_from_upstream(struct corral_h2 *h, const char *p, size_t n)
{
    return feed(h, h->up, p, n);
}

void corral_h2_upstream_ended(struct corral_h2 *h)
{
    h->broken = true;
    nghttp2_session_terminate_session(h->down, NGHTTP2_NO_ERROR);
}

static int drain(nghttp2_session *s, struct corral_buf *out)
{
    const uint8_t *p;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(s, &p)) > 0)
        if (corral_buf_add(out, p, (size_t)n) < 0) return -1;
    return n < 0 ? -1 : 0;
}

int corral_h2_output(struct corral_h2 *h, struct corral_buf *to_tenant, struct corral_buf *to_up)
{
    /* the server's leg first: what it is sent may open the tenant's windows */
    if (!h->broken && drain(h->up, to_up) < 0) return -1;
    return drain(h->down, to_tenant);
}

bool corral_h2_done(const struct corral_h2 *h)
{
    return !nghttp2_session_want_read(h->down) && !nghttp2_session_want_write(h->down);
}

size_t corral_h2_take(struct corral_h2 *h, struct corral_intercept_event *ev, size_t max)
{
    size_t n = h->nev < max ? h->nev : max;
    if (n == 0) return 0; /* h->ev may be NULL yet: memcpy from NULL is undefined */
    memcpy(ev, h->ev, n * sizeof *ev);
    memmove(h->ev, h->ev + n, (h->nev - n) * sizeof *ev);
    h->nev -= n;
    return n;
}
