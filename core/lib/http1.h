/*
 * One terminated connection's HTTP/1.1, both ways, through Debian's http-parser
 * (libhttp-parser; never parsed by hand): the client's requests checked and rewritten
 * (see intercept.h for the rules), the server's responses followed to log each
 * request's status and sizes. No I/O: bytes in, bytes out and events.
 *
 * Built into corral/tls.so with intercept.c.
 */
#ifndef CORRAL_HTTP1_H
#define CORRAL_HTTP1_H

#include <stddef.h>

#include "standin.h"

struct corral_http1;

/* A parser pair for one connection (conf is kept, not copied); NULL without memory. */
struct corral_http1 *corral_http1_new(const struct corral_conn_conf *conf);
void corral_http1_free(struct corral_http1 *h);

/*
 * Feeds n bytes the client sent (n == 0: it ended). What goes upstream is appended to
 * out. Returns 0; 1 when a request is refused (*ev filled: kind REFUSED, its status and
 * reason; the connection must end, nothing more of that request sent); -EPROTO when the
 * bytes are not HTTP/1.1 (*ev filled too: a 400); -ENOMEM.
 */
int corral_http1_request(struct corral_http1 *h, const char *p, size_t n, struct corral_buf *out,
                         struct corral_intercept_event *ev);

/* Feeds n bytes the server sent (n == 0: it ended); fills up to max events of requests
 * answered (kind REQUEST). Returns how many. Never fails: responses it cannot follow are
 * passed on unlogged. */
size_t corral_http1_response(struct corral_http1 *h, const char *p, size_t n,
                             struct corral_intercept_event *ev, size_t max);

/* Whether a request is waiting for its response (a refusal then ends the connection
 * without a 403, which would answer the earlier request). */
int corral_http1_awaiting(const struct corral_http1 *h);

#endif
