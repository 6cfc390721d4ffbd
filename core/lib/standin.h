/*
 * The rules a terminated connection applies to a request, whatever its HTTP version
 * (http1.h, h2.h): where a stand-in may be and what it becomes, and whether a Host or
 * :authority names the connection's host. No I/O, no parsing of the protocol.
 *
 * Built into corral/tls.so with intercept.c.
 */
#ifndef CORRAL_STANDIN_H
#define CORRAL_STANDIN_H

#include <stdbool.h>
#include <stddef.h>

#include "intercept.h"

/* A growable byte buffer, always NUL-terminated past its n bytes. */
struct corral_buf {
    char *p;
    size_t n, cap;
};

int corral_buf_add(struct corral_buf *b, const void *p, size_t n);
void corral_buf_clear(struct corral_buf *b);
void corral_buf_free(struct corral_buf *b);

/* One terminated connection: its host, port and the run's secrets (kept, not copied). */
struct corral_conn_conf {
    const char *name; /* every Host/:authority must name it */
    int port;
    const struct corral_intercept_secret *secrets;
    size_t n_secrets;
    /* asks whether a request may go (ev: kind ASK, its method, host, port, path and names
     * filled); 1 yes, 0 no with ev->reason filled. NULL: every request may. */
    int (*ask)(void *arg, struct corral_intercept_event *ev);
    void *ask_arg;
};

/* Most a request's head and held body may buffer before its bytes start to leave. */
#define CORRAL_HOLD_MAX (1024 * 1024)

/*
 * The secrets in one request header's value (field: its name, any case): each stand-in
 * replaced by its value where the secret is bound to the connection's name (inside
 * `Authorization: Basic` credentials too; *used set), refused where it is not, and refused
 * in the field name itself (a name is never rewritten).
 * Returns 0; 1 refused (why filled; always a leak); -ENOMEM.
 */
int corral_standin_header(const struct corral_conn_conf *c, const char *field,
                          struct corral_buf *value, bool *used, char *why, size_t why_size);

/* The secret whose stand-in is in p[0..n) — a target, a body — where none may be; NULL. */
const struct corral_intercept_secret *corral_standin_in(const struct corral_conn_conf *c,
                                                        const char *p, size_t n);

/* Whether a Host (or :authority) value names the connection's host, and its port when it
 * gives one. */
bool corral_standin_host_matches(const struct corral_conn_conf *c, const char *v);

/* The conf's ask, for a request that passed the stand-in rules: target is cut at its
 * query, names are its header names one a line. Returns 1 when it may go (or nothing is
 * asked), 0 with why filled when not. */
int corral_standin_ask(const struct corral_conn_conf *c, const char *method, const char *target,
                       const char *names, char *why, size_t why_size);

#endif
