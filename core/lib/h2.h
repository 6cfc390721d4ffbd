/*
 * One terminated connection's HTTP/2, both ways, through Debian's nghttp2 (never framed
 * by hand): a server session toward the tenant and a client session toward the real
 * server, each tenant stream relayed as one upstream stream. Every request's headers are
 * checked as on HTTP/1.1 (standin.h): its :authority (and Host) must name the
 * connection's host, a stand-in becomes the value in a header bound here and is refused
 * anywhere else (the path, the body, a secret bound elsewhere); CONNECT (extended too) is
 * refused. A refused stream gets a 403 saying why, nothing of it goes upstream, and the
 * connection's other streams go on. A request's body is held (up to CORRAL_HOLD_MAX)
 * until it ends, as on HTTP/1.1; past that it streams, and a stand-in found later resets
 * the upstream stream. Flow control is end to end: a side's window opens only as what
 * it sent is passed on. Request trailers are dropped; response trailers pass.
 *
 * No I/O: bytes in, bytes out and events. Built into corral/tls.so with intercept.c.
 */
#ifndef CORRAL_H2_H
#define CORRAL_H2_H

#include <stdbool.h>
#include <stddef.h>

#include "standin.h"

struct corral_h2;

/* A session pair for one connection (conf is kept, not copied), both SETTINGS queued;
 * NULL without memory. */
struct corral_h2 *corral_h2_new(const struct corral_conn_conf *conf);
void corral_h2_free(struct corral_h2 *h);

/* Feeds n bytes the tenant (or the server) sent. Returns 0, or -1 when the connection
 * must end (a protocol error: a GOAWAY is queued for the tenant). */
int corral_h2_from_tenant(struct corral_h2 *h, const char *p, size_t n);
int corral_h2_from_upstream(struct corral_h2 *h, const char *p, size_t n);

/* The server's leg ended: the tenant is told (GOAWAY) and its open streams reset. */
void corral_h2_upstream_ended(struct corral_h2 *h);

/* Appends what is due to each side. Returns 0 or -1 (out of memory). */
int corral_h2_output(struct corral_h2 *h, struct corral_buf *to_tenant, struct corral_buf *to_up);

/* Whether the tenant's session is over (nothing more to read or send). */
bool corral_h2_done(const struct corral_h2 *h);

/* Moves up to max events (requests answered, streams refused) into ev; how many. */
size_t corral_h2_take(struct corral_h2 *h, struct corral_intercept_event *ev, size_t max);

#endif
