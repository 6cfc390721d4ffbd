/*
 * Host-name lookup for the egress acceptor (path resolution is path.h): only for a
 * connection already permitted, never for a tenant's query (those are answered locally
 * and never forwarded).
 */
#ifndef CORRAL_LOOKUP_H
#define CORRAL_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

/* Looks name up with the host's resolver (getaddrinfo, numeric results only) into up to
 * max text addresses of size 46 each; returns the count or -errno (-ENOENT: no such
 * name, -EAGAIN: temporary failure). */
int corral_lookup_host(const char *name, char (*out)[46], size_t max);

/*
 * Lookups off the caller's thread: getaddrinfo blocks for as long as the host's resolver
 * takes (seconds, for a slow or dead server), and the egress loop that serves every
 * sandbox must not wait with it. Each lookup runs on a detached thread of its own (all
 * signals blocked); its result is queued in its pool, whose eventfd turns readable, and
 * the caller collects it when it polls: nothing calls back. A lookup cannot be
 * interrupted: one the caller stops waiting for runs to its end and is dropped, and
 * its thread counts against the bounds until then.
 */
#define CORRAL_LOOKUP_ADDRS 16
/* Lookup threads of the whole process at most: a lookup past it is refused (-EAGAIN). */
#define CORRAL_LOOKUP_THREADS_MAX 64

struct corral_lookup_pool;

struct corral_lookup_result {
    uint64_t id; /* as corral_lookup_submit returned it */
    int n;       /* the count of addrs, or -errno as corral_lookup_host returns it */
    char addrs[CORRAL_LOOKUP_ADDRS][46];
};

/* A pool with its eventfd (CLOEXEC, non-blocking). Returns 0 or -errno. */
int corral_lookup_pool_new(struct corral_lookup_pool **out);

/* The fd that is readable while a result waits to be collected (-1 once freed). */
int corral_lookup_pool_fd(const struct corral_lookup_pool *p);

/* Starts looking name up; *id names its result. Returns 0, -EAGAIN when max lookups of
 * this pool (or CORRAL_LOOKUP_THREADS_MAX of the process) are under way, -ENAMETOOLONG
 * for a name longer than a DNS name, or -errno when no thread could be made. */
int corral_lookup_submit(struct corral_lookup_pool *p, const char *name, size_t max, uint64_t *id);

/* Moves one finished lookup into out: returns 1, or 0 when none is waiting. */
int corral_lookup_collect(struct corral_lookup_pool *p, struct corral_lookup_result *out);

/* Lookups of this pool under way (submitted, not finished). */
size_t corral_lookup_running(const struct corral_lookup_pool *p);

/* Drops the pool: results not collected are freed, lookups under way end on their
 * threads, the last of which frees what is left. NULL is accepted. */
void corral_lookup_pool_free(struct corral_lookup_pool *p);

#endif
