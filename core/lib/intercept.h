/*
 * TLS terminated for the hosts a secret is bound to (`corral run --secret`), and every
 * HTTP/1.1 request on such a connection checked and rewritten.
 *
 * The tenant's TLS ends here, under a leaf certificate of the run's CA (tls_ca.h); a new
 * TLS session to the real server starts here, its chain and name verified against the
 * host's trust store (plus an operator's CA file). Between them each request is parsed
 * by Debian's http-parser, never by hand: its Host must be the connection's name; a
 * stand-in in a header is replaced by the secret's value only when the secret is bound
 * to that name (inside `Authorization: Basic` credentials too); a stand-in anywhere else
 * (the target, the body, a secret bound elsewhere), an absolute or CONNECT target, or an
 * Upgrade is refused: the client gets a 403 saying why, nothing of that request is sent,
 * and the connection ends. A request's body is held (up to HOLD_MAX bytes) until it is
 * complete, so a refused one never leaves; past that it streams, and a stand-in found
 * later resets the upstream before the request ends.
 *
 * Each connection runs on a thread of its own (blocking only itself, SIGPIPE blocked:
 * a write to a leg whose peer has gone fails there); the upstream TLS
 * is spoken over one end of a socketpair whose other end the caller hands to the splice
 * relay (core/lib/relay.h), which connects, counts, times out and cuts it as any other.
 * Nothing calls back: what happens is queued as events, and an eventfd is readable while
 * some wait.
 *
 * Thread-safety: every function is called from one thread (the caller's loop); the
 * connection threads touch only the shared state under its lock.
 */
#ifndef CORRAL_INTERCEPT_H
#define CORRAL_INTERCEPT_H

#include <stddef.h>
#include <stdint.h>

struct corral_intercept;

struct corral_intercept_secret {
    const char *stand_in; /* what the tenant holds */
    const char *value;    /* what the bound hosts get */
    const char *const *hosts;
    size_t n_hosts;
};

struct corral_intercept_opts {
    const char *ca_file; /* PEM trusted besides the host's store; NULL: none */
    const struct corral_intercept_secret *secrets;
    size_t n_secrets;
    /* every request that passes the rules above is also asked of the caller (an ASK event,
     * answered by corral_intercept_answer; no answer within ASK_MS is a refusal) */
    int ask;
};

#define CORRAL_INTERCEPT_ASK_MS 10000

enum corral_intercept_kind {
    CORRAL_INTERCEPT_REQUEST = 1, /* a request answered (status, bytes) */
    CORRAL_INTERCEPT_REFUSED,     /* a request refused (reason; leak set for a stand-in) */
    CORRAL_INTERCEPT_FAILED,      /* a connection ended before any request (reason) */
    CORRAL_INTERCEPT_ASK,         /* may this request go? (ticket, method, host, port, path,
                                     names); its connection waits for the answer */
};

#define CORRAL_INTERCEPT_TEXT 256

struct corral_intercept_event {
    int kind;
    uint64_t conn; /* the connection's number, from 1 */
    char method[24];
    char host[CORRAL_INTERCEPT_TEXT];
    char path[CORRAL_INTERCEPT_TEXT]; /* the target without its query */
    int status;                       /* the response's; 403 for a refusal; 0 none */
    uint64_t bytes_up, bytes_down;    /* the request's and the response's bodies */
    int secret_used, leak;
    char reason[CORRAL_INTERCEPT_TEXT * 3];
    uint64_t ticket; /* an ASK's, for its answer */
    int port;
    char names[CORRAL_INTERCEPT_TEXT * 2]; /* an ASK's header names, lower-case, one a line */
};

/* A new interceptor with its own CA; the secrets are copied. Returns 0 or -errno
 * (-EINVAL: the CA file cannot be read as PEM). */
int corral_intercept_new(const struct corral_intercept_opts *opts, struct corral_intercept **out);

/* Ends every live connection (both legs shut down) and waits for their threads, up to
 * 5 s, so that none runs this module's code once the caller is done (a thread that
 * outlives the wait keeps the memory, which goes with the last thread). NULL is a no-op. */
void corral_intercept_free(struct corral_intercept *ic);

/* An eventfd, readable while events wait for corral_intercept_take. */
int corral_intercept_fd(const struct corral_intercept *ic);

/* The run CA's certificate (PEM), for the tenant's trust. */
const char *corral_intercept_ca_pem(const struct corral_intercept *ic);

/* Terminates client_fd (a connected TCP socket; taken whatever this returns) for name
 * and port on a thread of its own. *up_fd receives the socket to relay to the real
 * upstream (its bytes are the upstream TLS session). Returns 0 or -errno. */
int corral_intercept_start(struct corral_intercept *ic, int client_fd, const char *name, int port,
                           int *up_fd);

/* Answers the ASK with this ticket: allow, or a refusal for why (the 403's words). An
 * unknown ticket (answered late, its connection gone) is ignored. */
void corral_intercept_answer(struct corral_intercept *ic, uint64_t ticket, int allow,
                             const char *why);

/* Copies up to max queued events into ev and clears the eventfd once none is left.
 * Returns how many. */
size_t corral_intercept_take(struct corral_intercept *ic, struct corral_intercept_event *ev,
                             size_t max);

#endif
