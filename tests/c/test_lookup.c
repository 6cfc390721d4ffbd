/*
 * core/lib/lookup.c: lookups on a pool's threads. A lookup is refused past the pool's
 * bound and for a name longer than a DNS name, each next to a control that is answered;
 * the answer arrives through the pool's fd; a pool dropped with a lookup under way
 * leaves no fd behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lookup.h"

/* Waits for the pool's fd and collects one result (0 when none came within 10 s). */
static int wait_result(struct corral_lookup_pool *p, struct corral_lookup_result *res)
{
    for (int i = 0; i < 100; i++) {
        struct pollfd pfd = {.fd = corral_lookup_pool_fd(p), .events = POLLIN};
        poll(&pfd, 1, 100);
        if (corral_lookup_collect(p, res) == 1) return 1;
    }
    return 0;
}

static int has(const struct corral_lookup_result *res, const char *addr)
{
    for (int i = 0; i < res->n; i++)
        if (strcmp(res->addrs[i], addr) == 0) return 1;
    return 0;
}

/* How many of this process's fds are eventfds (the pool's is the only one it makes). */
static int eventfds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], target[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len < 0) continue;
        target[len] = '\0';
        if (strcmp(target, "anon_inode:[eventfd]") == 0) n++;
    }
    closedir(d);
    return n;
}

static void test_pool(void)
{
    int fds = count_fds();
    struct corral_lookup_pool *p = NULL;
    CHECK(corral_lookup_pool_new(&p) == 0);
    int fd = corral_lookup_pool_fd(p);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    uint64_t id = 0, id2 = 0;
    /* attempts: no room (a bound of 0), a name past 253 characters */
    CHECK(corral_lookup_submit(p, "localhost", 0, &id) == -EAGAIN);
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK(corral_lookup_submit(p, longname, 4, &id) == -ENAMETOOLONG);
    /* control: localhost (the host's files) is answered through the fd, by its id */
    CHECK(corral_lookup_submit(p, "localhost", 1, &id) == 0 && id > 0);
    struct corral_lookup_result res;
    CHECK(wait_result(p, &res) == 1);
    CHECK(res.id == id && res.n >= 1 && (has(&res, "127.0.0.1") || has(&res, "::1")));
    CHECK(corral_lookup_running(p) == 0);
    CHECK(corral_lookup_collect(p, &res) == 0);
    /* a pool dropped with a lookup under way: its eventfd goes at once (the lookup's
     * thread may still hold the resolver's files open), and once that thread ends no fd
     * is left */
    CHECK(eventfds() == 1);
    CHECK(corral_lookup_submit(p, "localhost", 1, &id2) == 0 && id2 != id);
    corral_lookup_pool_free(p);
    CHECK(eventfds() == 0);
    for (int i = 0; i < 500 && count_fds() != fds; i++)
        usleep(10000);
    CHECK(count_fds() == fds);
    corral_lookup_pool_free(NULL);
}

int main(void)
{
    test_pool();
    return DONE();
}
