/*
 * getaddrinfo for permitted connections (see lookup.h), on the caller's thread or on one
 * of a pool's. Results are de-duplicated and kept in the resolver's order; the caller
 * checks each against the forbidden ranges.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lookup.h"

int corral_lookup_host(const char *name, char (*out)[46], size_t max)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int r = getaddrinfo(name, NULL, &hints, &res);
    if (r != 0) {
        if (r == EAI_NONAME || r == EAI_NODATA) return -ENOENT;
        if (r == EAI_AGAIN) return -EAGAIN;
        if (r == EAI_SYSTEM) return -errno;
        return -EIO;
    }
    size_t n = 0;
    for (struct addrinfo *ai = res; ai && n < max; ai = ai->ai_next) {
        char text[46];
        const void *a = ai->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        if (!inet_ntop(ai->ai_family, a, text, sizeof text)) continue;
        int dup = 0;
        for (size_t i = 0; i < n; i++)
            dup |= strcmp(out[i], text) == 0;
        if (!dup) memcpy(out[n++], text, sizeof text);
    }
    freeaddrinfo(res);
    return (int)n;
}

/* The pool: one lock guards everything below it; refs counts the owner and every
 * thread under way, and the last to drop its ref frees it. */
struct corral_lookup_pool {
    pthread_mutex_t lock;
    int efd;
    int refs;
    int closed;
    size_t running;
    uint64_t next_id;
    struct job *done, *done_tail;
};

struct job {
    struct job *next;
    struct corral_lookup_pool *pool;
    char name[254];
    struct corral_lookup_result res;
};

static atomic_int threads_running;

static void pool_destroy(struct corral_lookup_pool *p)
{
    while (p->done) {
        struct job *j = p->done;
        p->done = j->next;
        free(j);
    }
    if (p->efd >= 0) close(p->efd);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Drops one ref with the lock held; unlocks, and frees the pool when it was the last. */
static void pool_unref_unlock(struct corral_lookup_pool *p)
{
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->lock);
    if (last) pool_destroy(p);
}

static void *lookup_thread(void *arg)
{
    struct job *j = arg;
    struct corral_lookup_pool *p = j->pool;
    j->res.n = corral_lookup_host(j->name, j->res.addrs, CORRAL_LOOKUP_ADDRS);
    pthread_mutex_lock(&p->lock);
    p->running--;
    atomic_fetch_sub(&threads_running, 1);
    if (p->closed) {
        free(j);
    } else {
        j->next = NULL;
        if (p->done_tail)
            p->done_tail->next = j;
        else
            p->done = j;
        p->done_tail = j;
        uint64_t one = 1;
        /* EAGAIN only when the counter is full, which leaves it readable anyway */
        if (write(p->efd, &one, sizeof one) < 0) (void)0;
    }
    pool_unref_unlock(p);
    return NULL;
}

int corral_lookup_pool_new(struct corral_lookup_pool **out)
{
    struct corral_lookup_pool *p = calloc(1, sizeof *p);
    if (!p) return -ENOMEM;
    p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->efd < 0) {
        int err = -errno;
        free(p);
        return err;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->refs = 1;
    *out = p;
    return 0;
}

int corral_lookup_pool_fd(const struct corral_lookup_pool *p)
{
    return p ? p->efd : -1;
}

/* Makes j's thread detached, with every signal blocked (the loop's thread takes them). */
static int start_thread(struct job *j)
{
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int r = pthread_create(&t, &attr, lookup_thread, j);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return -r;
}

int corral_lookup_submit(struct corral_lookup_pool *p, const char *name, size_t max, uint64_t *id)
{
    size_t len = strlen(name);
    if (len >= sizeof((struct job *)0)->name) return -ENAMETOOLONG;
    struct job *j = calloc(1, sizeof *j);
    if (!j) return -ENOMEM;
    memcpy(j->name, name, len + 1);
    j->pool = p;
    pthread_mutex_lock(&p->lock);
    int full = p->running >= max;
    if (!full && atomic_fetch_add(&threads_running, 1) >= CORRAL_LOOKUP_THREADS_MAX) {
        atomic_fetch_sub(&threads_running, 1);
        full = 1;
    }
    if (full) {
        pthread_mutex_unlock(&p->lock);
        free(j);
        return -EAGAIN;
    }
    j->res.id = ++p->next_id;
    p->running++;
    p->refs++;
    int r = start_thread(j);
    if (r < 0) {
        p->running--;
        p->refs--;
        atomic_fetch_sub(&threads_running, 1);
        pthread_mutex_unlock(&p->lock);
        free(j);
        return r;
    }
    *id = j->res.id;
    pthread_mutex_unlock(&p->lock);
    return 0;
}

int corral_lookup_collect(struct corral_lookup_pool *p, struct corral_lookup_result *out)
{
    uint64_t count;
    pthread_mutex_lock(&p->lock);
    /* cleared first: a result queued after this read writes the counter again */
    if (read(p->efd, &count, sizeof count) < 0) (void)0;
    struct job *j = p->done;
    if (j) {
        p->done = j->next;
        if (!p->done) p->done_tail = NULL;
        /* more waiting: the fd stays readable for the next poll */
        uint64_t one = 1;
        if (p->done && write(p->efd, &one, sizeof one) < 0) (void)0;
    }
    pthread_mutex_unlock(&p->lock);
    if (!j) return 0;
    *out = j->res;
    free(j);
    return 1;
}

size_t corral_lookup_running(const struct corral_lookup_pool *p)
{
    return p ? p->running : 0;
}

void corral_lookup_pool_free(struct corral_lookup_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->closed = 1;
    /* the fd goes now, not when the last lookup ends: the pool's owner is gone */
    close(p->efd);
    p->efd = -1;
    while (p->done) {
        struct job *j = p->done;
        p->done = j->next;
        free(j);
    }
    p->done_tail = NULL;
    pool_unref_unlock(p);
}
