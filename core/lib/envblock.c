/*
 * This process's environment and its original block (see envblock.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envblock.h"
#include "util.h"

/* The original block's bounds, fields 50 and 51 of /proc/self/stat (proc(5)). The
 * command name (field 2) may hold spaces and parentheses: fields are counted after the
 * last ')'. */
static int block_bounds(uintptr_t *start, uintptr_t *end)
{
    _cleanup_close_ int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    char buf[4096];
    ssize_t len = read(fd, buf, sizeof buf - 1);
    if (len < 0) return -errno;
    buf[len] = '\0';
    char *p = strrchr(buf, ')');
    if (!p) return -EIO;
    unsigned long long v[2] = {0, 0};
    /* after ')' comes field 3; fields 50 and 51 are the 48th and 49th from there */
    int field = 2;
    for (char *save = NULL, *t = strtok_r(p + 1, " \n", &save); t;
         t = strtok_r(NULL, " \n", &save)) {
        field++;
        if (field == 50 || field == 51) v[field - 50] = strtoull(t, NULL, 10);
        if (field == 51) break;
    }
    if (field < 51 || v[0] == 0 || v[1] < v[0]) return -EIO;
    *start = (uintptr_t)v[0];
    *end = (uintptr_t)v[1];
    return 0;
}

int corral_environ_replace(const char *const *keep, size_t n)
{
    extern char **environ;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(keep[i], '=');
        if (!eq || eq == keep[i]) return -EINVAL;
    }
    uintptr_t start, end;
    int r = block_bounds(&start, &end);
    if (r < 0) return r;
    /* Where each kept string sits in the block, when it is still the one the process
     * started with: it stays there, so that a pointer some library took to it with
     * getenv keeps reading the same bytes (and one to anything else reads zeros). */
    _cleanup_free_ size_t *at = calloc(n ? n : 1, sizeof *at);
    _cleanup_free_ char **copy = calloc(n ? n : 1, sizeof *copy);
    if (!at || !copy) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        at[i] = SIZE_MAX;
        for (char **e = environ; e && *e; e++) {
            uintptr_t p = (uintptr_t)*e;
            if (p >= start && p < end && strcmp(*e, keep[i]) == 0) at[i] = p - start;
        }
    }
    /* the kept strings, copied off: keep[i] may itself point into environ */
    for (size_t i = 0; i < n; i++) {
        copy[i] = strdup(keep[i]);
        if (!copy[i]) {
            r = -ENOMEM;
            goto out;
        }
    }
    if (clearenv() != 0) {
        r = -ENOMEM;
        goto out;
    }
    memset((char *)start, 0, end - start);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(copy[i]) + 1;
        if (at[i] != SIZE_MAX && at[i] + len <= end - start)
            memcpy((char *)start + at[i], copy[i], len);
        char *eq = strchr(copy[i], '=');
        *eq = '\0';
        if (setenv(copy[i], eq + 1, 1) != 0 && r == 0) r = -errno;
    }
out:
    for (size_t i = 0; i < n; i++)
        free(copy[i]);
    return r;
}
