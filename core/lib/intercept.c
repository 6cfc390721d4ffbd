/*
 * TLS termination for bound hosts (see intercept.h): the shared state, one thread per
 * connection, and each connection's two TLS legs over non-blocking sockets.
 *
 * Non-blocking, because a blocking read could wait for application data while the other
 * leg has bytes to move: a TLS 1.3 server sends its session tickets before any answer,
 * and a read that consumed only those would then block before the request was sent.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "h2.h"
#include "http1.h"
#include "intercept.h"
#include "tls_ca.h"

#define EVENTS_MAX 4096
#define HANDSHAKE_MS 10000
#define WRITE_MS 60000
#define STACK_BYTES (512 * 1024)
#define CONNS_MAX 4096
#define FREE_WAIT_S 5 /* how long free waits for the connections' threads */

struct corral_intercept {
    pthread_mutex_t lock;
    int refs; /* the owner's, and one per live thread */
    bool closing;
    int evfd;
    SSL_CTX *server, *client;
    struct corral_tls_ca *ca;
    struct corral_intercept_secret *secrets;
    size_t n_secrets;
    struct corral_intercept_event *q;
    size_t qlen;
    uint64_t next_conn;
    bool ask;
    pthread_cond_t answered; /* on the monotonic clock */
    struct ask *asks;        /* the requests waiting for an answer */
    uint64_t next_ticket;
    /* each connection's slot: its legs' fds (shut down at free; -1 once ended) and its
     * thread, joined once ended (at the next start, or at free: no thread may run this
     * module's code once its owner is done with it) */
    int live[CONNS_MAX], live_up[CONNS_MAX];
    pthread_t tid[CONNS_MAX];
    unsigned char state[CONNS_MAX]; /* SLOT_FREE, SLOT_RUNNING, SLOT_ENDED, SLOT_JOINING */
};

enum { SLOT_FREE, SLOT_RUNNING, SLOT_ENDED, SLOT_JOINING };

struct ask {
    struct ask *next;
    uint64_t ticket;
    int state; /* 0 waiting, 1 allowed, 2 refused (why) */
    char why[CORRAL_INTERCEPT_TEXT * 3];
};

struct conn {
    struct corral_intercept *ic;
    int client, up; /* the tenant's socket; this side of the socketpair */
    uint64_t id;
    int port;
    int slot;
    char name[256];
    SSL *cs, *us;
    int up_state; /* the server's handshake: 0 not yet, 1 done, -1 failed (up_why) */
    bool h2;      /* both legs speak HTTP/2 */
    char up_why[CORRAL_INTERCEPT_TEXT * 2];
    struct corral_http1 *http;
    struct corral_conn_conf conf;
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void release(struct corral_intercept *ic)
{
    pthread_mutex_lock(&ic->lock);
    bool last = --ic->refs == 0;
    pthread_mutex_unlock(&ic->lock);
    if (!last) return;
    SSL_CTX_free(ic->server);
    SSL_CTX_free(ic->client);
    corral_tls_ca_free(ic->ca);
    for (size_t i = 0; i < ic->n_secrets; i++) {
        free((char *)ic->secrets[i].stand_in);
        if (ic->secrets[i].value)
            OPENSSL_clear_free((char *)ic->secrets[i].value, strlen(ic->secrets[i].value));
        for (size_t j = 0; j < ic->secrets[i].n_hosts; j++)
            free((char *)ic->secrets[i].hosts[j]);
        free((void *)ic->secrets[i].hosts);
    }
    free(ic->secrets);
    free(ic->q);
    close(ic->evfd);
    pthread_cond_destroy(&ic->answered);
    pthread_mutex_destroy(&ic->lock);
    free(ic);
}

static void emit(struct corral_intercept *ic, const struct corral_intercept_event *ev,
                 uint64_t conn)
{
    pthread_mutex_lock(&ic->lock);
    if (ic->qlen < EVENTS_MAX) {
        ic->q[ic->qlen] = *ev;
        ic->q[ic->qlen++].conn = conn;
        uint64_t one = 1;
        (void)!write(ic->evfd, &one, sizeof one);
    }
    pthread_mutex_unlock(&ic->lock);
}

/* The request in ev asked of the caller (corral_intercept_answer), this connection waiting
 * up to CORRAL_INTERCEPT_ASK_MS; see corral_conn_conf.ask. */
static int ask_caller(void *arg, struct corral_intercept_event *ev)
{
    struct conn *c = arg;
    struct corral_intercept *ic = c->ic;
    struct ask a = {0};
    pthread_mutex_lock(&ic->lock);
    a.ticket = ev->ticket = ++ic->next_ticket;
    a.next = ic->asks;
    ic->asks = &a;
    pthread_mutex_unlock(&ic->lock);
    emit(ic, ev, c->id);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += CORRAL_INTERCEPT_ASK_MS / 1000;
    pthread_mutex_lock(&ic->lock);
    int r = 0;
    while (!a.state && !ic->closing && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&ic->answered, &ic->lock, &until);
    for (struct ask **p = &ic->asks; *p; p = &(*p)->next)
        if (*p == &a) {
            *p = a.next;
            break;
        }
    pthread_mutex_unlock(&ic->lock);
    if (a.state == 1) return 1;
    snprintf(ev->reason, sizeof ev->reason, "%s",
             a.state == 2 ? a.why : "the request rules gave no answer within 10 s");
    return 0;
}

void corral_intercept_answer(struct corral_intercept *ic, uint64_t ticket, int allow,
                             const char *why)
{
    pthread_mutex_lock(&ic->lock);
    for (struct ask *a = ic->asks; a; a = a->next)
        if (a->ticket == ticket && !a->state) {
            a->state = allow ? 1 : 2;
            snprintf(a->why, sizeof a->why, "%s", why ? why : "refused by the request rules");
        }
    pthread_cond_broadcast(&ic->answered);
    pthread_mutex_unlock(&ic->lock);
}

static void emit_failure(struct conn *c, const char *why)
{
    struct corral_intercept_event ev = {.kind = CORRAL_INTERCEPT_FAILED};
    snprintf(ev.host, sizeof ev.host, "%s", c->name);
    snprintf(ev.reason, sizeof ev.reason, "%s", why);
    emit(c->ic, &ev, c->id);
}

/* Waits until fd is ready for what the last TLS call wanted, up to the deadline.
 * Returns 0, or -1 (timed out, or the call failed for another reason). */
static int wait_for(SSL *s, int fd, int r, int64_t deadline)
{
    int e = SSL_get_error(s, r);
    short want = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    if (!want) return -1;
    int64_t left = deadline - now_ms();
    if (left <= 0) return -1;
    struct pollfd p = {fd, want, 0};
    return poll(&p, 1, (int)left) == 1 ? 0 : -1;
}

static int handshake(SSL *s, int fd, bool server)
{
    int64_t deadline = now_ms() + HANDSHAKE_MS;
    for (;;) {
        int r = server ? SSL_accept(s) : SSL_connect(s);
        if (r == 1) return 0;
        if (wait_for(s, fd, r, deadline) < 0) return -1;
    }
}

static int write_all(SSL *s, int fd, const char *p, size_t n)
{
    int64_t deadline = now_ms() + WRITE_MS;
    while (n) {
        int r = SSL_write(s, p, (int)(n > 1 << 20 ? 1 << 20 : n));
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            deadline = now_ms() + WRITE_MS;
        } else if (wait_for(s, fd, r, deadline) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The answer corral itself gives the tenant: status, and why in words a client's user
 * (or an agent reading its output) can act on; the connection ends after it. */
static void answer(struct conn *c, int status, const char *prefix, const char *why)
{
    const char *text = status == 400 ? "Bad Request" : status == 502 ? "Bad Gateway" : "Forbidden";
    char body[CORRAL_INTERCEPT_TEXT * 4], msg[sizeof body + 256];
    snprintf(body, sizeof body, "corral: %s%s\n", prefix, why);
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, text, strlen(body), body);
    write_all(c->cs, c->client, msg, (size_t)n);
}

static const unsigned char ALPN_H2[] = "\x02h2\x08http/1.1", ALPN_H1[] = "\x08http/1.1";

/* The server's handshake, offering HTTP/2 when the tenant did; its name verified. */
static void connect_upstream(struct conn *c, bool h2)
{
    unsigned char bin[16];
    bool ip = inet_pton(AF_INET, c->name, bin) == 1 || inet_pton(AF_INET6, c->name, bin) == 1;
    if (ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->us), c->name);
    } else {
        SSL_set_tlsext_host_name(c->us, c->name);
        SSL_set1_host(c->us, c->name);
    }
    if (h2) SSL_set_alpn_protos(c->us, ALPN_H2, sizeof ALPN_H2 - 1);
    c->up_state = 1;
    if (handshake(c->us, c->up, false) == 0) {
        const unsigned char *sel;
        unsigned len;
        SSL_get0_alpn_selected(c->us, &sel, &len);
        c->h2 = len == 2 && memcmp(sel, "h2", 2) == 0;
        return;
    }
    c->up_state = -1;
    long v = SSL_get_verify_result(c->us);
    if (v != X509_V_OK)
        snprintf(c->up_why, sizeof c->up_why, "the certificate of %s does not verify: %s%s",
                 c->name, X509_verify_cert_error_string(v),
                 v == X509_V_ERR_HOSTNAME_MISMATCH ? " (it names another host)"
                                                   : " (--ca-file adds a CA to trust)");
    else
        snprintf(c->up_why, sizeof c->up_why, "TLS to %s upstream failed: %s", c->name,
                 ERR_reason_error_string(ERR_peek_last_error())
                     ?: "the server ended the connection");
    ERR_clear_error();
}

/* The tenant's ALPN, chosen once the server has chosen its own: HTTP/2 to the tenant only
 * over HTTP/2 to the server, so each leg's requests map one to one. */
static int alpn_select(SSL *s, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned inlen, void *arg)
{
    (void)arg;
    struct conn *c = SSL_get_app_data(s);
    unsigned char *sel;
    unsigned char len;
    bool offers_h2 =
        SSL_select_next_proto(&sel, &len, ALPN_H2, 3, in, inlen) == OPENSSL_NPN_NEGOTIATED;
    if (c->up_state == 0) connect_upstream(c, offers_h2);
    const unsigned char *want = c->h2 ? ALPN_H2 : ALPN_H1;
    unsigned wlen = c->h2 ? 3 : sizeof ALPN_H1 - 1;
    if (SSL_select_next_proto(&sel, outlen, want, wlen, in, inlen) != OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

/* Both handshakes: the tenant's under a leaf for the name, the server's (verified) from
 * inside it once the tenant's offer is known. Returns 0, or -1 with the failure logged
 * (and, past the tenant's, answered). */
static int open_legs(struct conn *c)
{
    struct corral_intercept *ic = c->ic;
    X509 *cert;
    EVP_PKEY *key;
    pthread_mutex_lock(&ic->lock);
    int r = corral_tls_ca_leaf(ic->ca, c->name, &cert, &key);
    pthread_mutex_unlock(&ic->lock);
    c->cs = r == 0 ? SSL_new(ic->server) : NULL;
    c->us = c->cs ? SSL_new(ic->client) : NULL;
    if (!c->us || SSL_use_certificate(c->cs, cert) != 1 || SSL_use_PrivateKey(c->cs, key) != 1 ||
        SSL_set_fd(c->cs, c->client) != 1 || SSL_set_fd(c->us, c->up) != 1) {
        emit_failure(c, "TLS could not be set up (out of memory, or too many names)");
        return -1;
    }
    SSL_set_app_data(c->cs, c);
    if (handshake(c->cs, c->client, true) < 0) {
        char why[CORRAL_INTERCEPT_TEXT * 2];
        snprintf(why, sizeof why, "the tenant's TLS handshake for %s failed: %s", c->name,
                 ERR_reason_error_string(ERR_peek_last_error()) ?: "no answer within 10 s");
        emit_failure(c, why);
        return -1;
    }
    if (c->up_state == 0) connect_upstream(c, false);
    if (c->up_state < 0) {
        emit_failure(c, c->up_why);
        answer(c, 502, "", c->up_why);
        return -1;
    }
    return 0;
}

/* Reads what leg s has (0: nothing yet, -1: it ended or failed, else the count). */
static int read_leg(SSL *s, char *buf, size_t max)
{
    int r = SSL_read(s, buf, (int)max);
    if (r > 0) return r;
    int e = SSL_get_error(s, r);
    return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0 : -1;
}

static void deliver(struct conn *c, const char *p, size_t n)
{
    struct corral_intercept_event ev[8];
    size_t k = corral_http1_response(c->http, p, n, ev, 8);
    for (size_t i = 0; i < k; i++)
        emit(c->ic, &ev[i], c->id);
}

/* Client bytes through the request check: sent on, or the request refused. Returns 0 to
 * go on, -1 to end the connection. */
static int forward_request(struct conn *c, const char *p, size_t n)
{
    struct corral_buf out = {0};
    struct corral_intercept_event ev;
    int r = corral_http1_request(c->http, p, n, &out, &ev);
    int sent = out.n ? write_all(c->us, c->up, out.p, out.n) : 0;
    corral_buf_free(&out);
    if (r == 0) return sent;
    if (r == -ENOMEM) return -1;
    emit(c->ic, &ev, c->id);
    if (!corral_http1_awaiting(c->http)) answer(c, ev.status, "request refused: ", ev.reason);
    return -1;
}

static void relay_legs(struct conn *c)
{
    char buf[16384];
    bool client_open = true;
    for (;;) {
        struct pollfd p[2] = {{c->client, client_open ? POLLIN : 0, 0}, {c->up, POLLIN, 0}};
        bool pending = (client_open && SSL_pending(c->cs)) || SSL_pending(c->us);
        if (poll(p, 2, pending ? 0 : -1) < 0 && errno != EINTR) return;
        if (client_open && (p[0].revents || SSL_pending(c->cs))) {
            int n = read_leg(c->cs, buf, sizeof buf);
            if (n < 0) {
                client_open = false;
                if (forward_request(c, NULL, 0) < 0) return;
                SSL_shutdown(c->us);
            } else if (n > 0 && forward_request(c, buf, (size_t)n) < 0) {
                return;
            }
        }
        if (p[1].revents || SSL_pending(c->us)) {
            int n = read_leg(c->us, buf, sizeof buf);
            if (n < 0) {
                deliver(c, NULL, 0);
                SSL_shutdown(c->cs);
                return;
            }
            if (n > 0) {
                deliver(c, buf, (size_t)n);
                if (write_all(c->cs, c->client, buf, (size_t)n) < 0) return;
            }
        }
        if (c->ic->closing) return;
    }
}

static void emit_h2(struct conn *c, struct corral_h2 *h)
{
    struct corral_intercept_event ev[8];
    size_t k;
    while ((k = corral_h2_take(h, ev, 8)))
        for (size_t i = 0; i < k; i++)
            emit(c->ic, &ev[i], c->id);
}

/* Both legs' HTTP/2 sessions: what each sends fed to h, what h has for each written. */
static void relay_h2(struct conn *c)
{
    struct corral_h2 *h = corral_h2_new(&c->conf);
    struct corral_buf to_tenant = {0}, to_up = {0};
    char buf[16384];
    bool up_open = true;
    while (h && corral_h2_output(h, &to_tenant, &to_up) == 0) {
        emit_h2(c, h); /* before the answers leave: logged by the time the tenant has them */
        if (up_open && to_up.n && write_all(c->us, c->up, to_up.p, to_up.n) < 0) {
            up_open = false;
            corral_h2_upstream_ended(h);
        }
        if (to_tenant.n && write_all(c->cs, c->client, to_tenant.p, to_tenant.n) < 0) break;
        corral_buf_clear(&to_tenant);
        corral_buf_clear(&to_up);
        if (corral_h2_done(h) || c->ic->closing) break;
        struct pollfd p[2] = {{c->client, POLLIN, 0}, {c->up, up_open ? POLLIN : 0, 0}};
        bool pending = SSL_pending(c->cs) || (up_open && SSL_pending(c->us));
        if (poll(p, 2, pending ? 0 : -1) < 0 && errno != EINTR) break;
        if (p[0].revents || SSL_pending(c->cs)) {
            int n = read_leg(c->cs, buf, sizeof buf);
            if (n < 0) break;
            if (n > 0) corral_h2_from_tenant(h, buf, (size_t)n);
        }
        if (up_open && (p[1].revents || SSL_pending(c->us))) {
            int n = read_leg(c->us, buf, sizeof buf);
            if (n < 0 || (n > 0 && corral_h2_from_upstream(h, buf, (size_t)n) < 0)) {
                up_open = false;
                corral_h2_upstream_ended(h);
            }
        }
    }
    if (h) emit_h2(c, h);
    corral_h2_free(h);
    corral_buf_free(&to_tenant);
    corral_buf_free(&to_up);
}

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    struct corral_intercept *ic = c->ic;
    /* OpenSSL writes without MSG_NOSIGNAL: a write to a leg whose peer has gone must fail
     * with EPIPE on this thread, not end the host (whose other threads leave it default) */
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, NULL);
    c->conf = (struct corral_conn_conf){
        c->name, c->port, ic->secrets, ic->n_secrets, ic->ask ? ask_caller : NULL, c};
    c->http = corral_http1_new(&c->conf);
    if (c->http && open_legs(c) == 0) {
        if (c->h2)
            relay_h2(c);
        else
            relay_legs(c);
    }
    corral_http1_free(c->http);
    SSL_free(c->cs);
    SSL_free(c->us);
    ERR_clear_error();
    int slot = c->slot;
    pthread_mutex_lock(&ic->lock);
    ic->live[slot] = ic->live_up[slot] = -1; /* before the close: free shuts down no reused fd */
    pthread_mutex_unlock(&ic->lock);
    close(c->client);
    close(c->up);
    free(c);
    pthread_mutex_lock(&ic->lock);
    if (ic->state[slot] == SLOT_RUNNING) ic->state[slot] = SLOT_ENDED; /* else being joined */
    pthread_mutex_unlock(&ic->lock);
    release(ic);
    return NULL;
}

static int make_contexts(struct corral_intercept *ic, const char *ca_file)
{
    ic->server = SSL_CTX_new(TLS_server_method());
    ic->client = SSL_CTX_new(TLS_client_method());
    if (!ic->server || !ic->client) return -ENOMEM;
    SSL_CTX_set_min_proto_version(ic->server, TLS1_2_VERSION);
    SSL_CTX_set_min_proto_version(ic->client, TLS1_2_VERSION);
    SSL_CTX_set_alpn_select_cb(ic->server, alpn_select, NULL);
    SSL_CTX_set_verify(ic->client, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_set_default_verify_paths(ic->client) != 1) return -EINVAL;
    if (ca_file && SSL_CTX_load_verify_locations(ic->client, ca_file, NULL) != 1) return -EINVAL;
    if (SSL_CTX_set_alpn_protos(ic->client, ALPN_H1, sizeof ALPN_H1 - 1) != 0) return -ENOMEM;
    SSL_CTX_set_mode(ic->server, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_mode(ic->client, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return 0;
}

static int copy_secrets(struct corral_intercept *ic, const struct corral_intercept_opts *o)
{
    ic->secrets = calloc(o->n_secrets ? o->n_secrets : 1, sizeof *ic->secrets);
    if (!ic->secrets) return -ENOMEM;
    for (size_t i = 0; i < o->n_secrets; i++, ic->n_secrets++) {
        const struct corral_intercept_secret *s = &o->secrets[i];
        struct corral_intercept_secret *d = &ic->secrets[i];
        const char **hosts = calloc(s->n_hosts ? s->n_hosts : 1, sizeof *hosts);
        d->hosts = hosts;
        d->stand_in = strdup(s->stand_in);
        d->value = strdup(s->value);
        if (!hosts || !d->stand_in || !d->value) return -ENOMEM;
        for (size_t j = 0; j < s->n_hosts; j++, d->n_hosts++)
            if (!(hosts[j] = strdup(s->hosts[j]))) return -ENOMEM;
    }
    return 0;
}

int corral_intercept_new(const struct corral_intercept_opts *opts, struct corral_intercept **out)
{
    struct corral_intercept *ic = calloc(1, sizeof *ic);
    if (!ic) return -ENOMEM;
    pthread_mutex_init(&ic->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ic->answered, &ca);
    pthread_condattr_destroy(&ca);
    ic->refs = 1;
    ic->ask = opts->ask;
    for (size_t i = 0; i < CONNS_MAX; i++)
        ic->live[i] = ic->live_up[i] = -1;
    ic->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ic->q = malloc(EVENTS_MAX * sizeof *ic->q);
    int r = ic->evfd < 0 ? -errno : !ic->q ? -ENOMEM : corral_tls_ca_new(&ic->ca);
    if (r == 0) r = make_contexts(ic, opts->ca_file);
    if (r == 0) r = copy_secrets(ic, opts);
    if (r < 0) {
        if (ic->evfd < 0) ic->evfd = eventfd(0, EFD_CLOEXEC);
        release(ic);
        return r;
    }
    *out = ic;
    return 0;
}

/* Joins the threads of the slots in state `from` (all not free when from is SLOT_FREE),
 * each until `until` (CLOCK_REALTIME; NULL: no limit); one that outlives it keeps its
 * slot and its hold on ic. Called by the owner only, never under the lock. */
static void join_slots(struct corral_intercept *ic, int from, const struct timespec *until)
{
    for (int i = 0; i < CONNS_MAX; i++) {
        pthread_mutex_lock(&ic->lock);
        int st = ic->state[i];
        bool take = from == SLOT_FREE ? st == SLOT_RUNNING || st == SLOT_ENDED : st == from;
        pthread_t t = ic->tid[i];
        if (take) ic->state[i] = SLOT_JOINING;
        pthread_mutex_unlock(&ic->lock);
        if (!take) continue;
        int r = until ? pthread_timedjoin_np(t, NULL, until) : pthread_join(t, NULL);
        pthread_mutex_lock(&ic->lock);
        ic->state[i] = r == 0 ? SLOT_FREE : SLOT_RUNNING; /* a thread that outlived until */
        pthread_mutex_unlock(&ic->lock);
    }
}

void corral_intercept_free(struct corral_intercept *ic)
{
    if (!ic) return;
    pthread_mutex_lock(&ic->lock);
    ic->closing = true;
    for (size_t i = 0; i < CONNS_MAX; i++) {
        if (ic->live[i] >= 0) shutdown(ic->live[i], SHUT_RDWR);
        if (ic->live_up[i] >= 0) shutdown(ic->live_up[i], SHUT_RDWR);
    }
    pthread_cond_broadcast(&ic->answered);
    pthread_mutex_unlock(&ic->lock);
    /* every leg is shut: each thread ends at its next poll */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FREE_WAIT_S;
    join_slots(ic, SLOT_FREE, &until);
    release(ic);
}

int corral_intercept_fd(const struct corral_intercept *ic)
{
    return ic->evfd;
}

const char *corral_intercept_ca_pem(const struct corral_intercept *ic)
{
    return corral_tls_ca_pem(ic->ca);
}

static void reset_close(int fd)
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

int corral_intercept_start(struct corral_intercept *ic, int client_fd, const char *name, int port,
                           int *up_fd)
{
    int sv[2] = {-1, -1};
    struct conn *c = calloc(1, sizeof *c);
    int r = !c ? -ENOMEM : strlen(name) >= sizeof c->name ? -ENAMETOOLONG : 0;
    if (r == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) r = -errno;
    /* each TLS record is written whole: no reason to wait for the peer's ACK (Nagle) */
    int one = 1;
    setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (r == 0 && (fcntl(client_fd, F_SETFL, fcntl(client_fd, F_GETFL) | O_NONBLOCK) < 0 ||
                   fcntl(sv[0], F_SETFL, O_NONBLOCK) < 0))
        r = -errno;
    join_slots(ic, SLOT_ENDED, NULL); /* ended: each returns at once */
    pthread_mutex_lock(&ic->lock);
    int slot = -1;
    for (int i = 0; r == 0 && i < CONNS_MAX && slot < 0; i++)
        if (ic->state[i] == SLOT_FREE) slot = i;
    if (r == 0 && slot < 0) r = -EUSERS;
    if (r == 0) {
        ic->live[slot] = client_fd;
        ic->live_up[slot] = sv[0];
        ic->state[slot] = SLOT_RUNNING;
        ic->refs++;
        c->id = ++ic->next_conn;
    }
    pthread_mutex_unlock(&ic->lock);
    if (r < 0) goto fail;
    c->ic = ic;
    c->client = client_fd;
    c->up = sv[0];
    c->port = port;
    c->slot = slot;
    snprintf(c->name, sizeof c->name, "%s", name);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    /* the slot's tid is written under the lock before the thread can end and be joined */
    pthread_mutex_lock(&ic->lock);
    r = -pthread_create(&ic->tid[slot], &attr, conn_main, c);
    if (r < 0) {
        ic->live[slot] = ic->live_up[slot] = -1;
        ic->state[slot] = SLOT_FREE;
        ic->refs--;
    }
    pthread_mutex_unlock(&ic->lock);
    pthread_attr_destroy(&attr);
    if (r == 0) {
        *up_fd = sv[1];
        return 0;
    }
fail:
    free(c);
    reset_close(client_fd);
    if (sv[0] >= 0) close(sv[0]);
    if (sv[1] >= 0) close(sv[1]);
    return r;
}

size_t corral_intercept_take(struct corral_intercept *ic, struct corral_intercept_event *ev,
                             size_t max)
{
    pthread_mutex_lock(&ic->lock);
    size_t n = ic->qlen < max ? ic->qlen : max;
    memcpy(ev, ic->q, n * sizeof *ev);
    memmove(ic->q, ic->q + n, (ic->qlen - n) * sizeof *ev);
    ic->qlen -= n;
    uint64_t v;
    if (ic->qlen == 0) (void)!read(ic->evfd, &v, sizeof v);
    pthread_mutex_unlock(&ic->lock);
    return n;
}
