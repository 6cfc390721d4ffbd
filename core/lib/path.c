/*
 * Path resolution, written out component by component instead of calling realpath(3):
 * the walk is the rule corral grants and executes by, so it lives in one place that
 * tests can hold against the kernel (tests/c/test_path.c cross-checks every successful
 * case with realpath(3), and the ELOOP boundary with the kernel's own open(2)).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "path.h"
#include "util.h"

/* Linux MAXSYMLINKS (include/linux/namei.h) and glibc's __eloop_threshold: a chain of 40
 * links resolves, 41 is ELOOP (test_path.c checks both against open(2)). */
#define CORRAL_MAX_SYMLINKS 40

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* The path still to walk. Splicing a link target in front of it can grow it past
 * PATH_MAX (the kernel keeps a stack of link bodies, not one string), so it is on the
 * heap and sized as it goes. */
struct pending {
    char *buf;
    size_t len;
};

/* rest_off sits at the end of the link's name, so the rest is empty or starts with '/':
 * no separator is added, and a link that ends the path adds no trailing slash. */
static int pending_splice(struct pending *p, const char *target, size_t tlen, size_t rest_off)
{
    size_t rest = p->len - rest_off;
    char *nb = malloc(tlen + rest + 1);
    if (!nb) return -ENOMEM;
    memcpy(nb, target, tlen);
    memcpy(nb + tlen, p->buf + rest_off, rest);
    nb[tlen + rest] = '\0';
    free(p->buf);
    p->buf = nb;
    p->len = tlen + rest;
    return 0;
}

/* True when anything but slashes follows offset off: the component just taken has to
 * be a directory. A trailing slash counts too ("file/" is ENOTDIR for the kernel). */
static bool more_follows(const char *s, size_t off, size_t len)
{
    return off < len && s[off] == '/';
}

static void pop_component(char *res, size_t *rlen)
{
    while (*rlen > 1 && res[*rlen - 1] != '/')
        (*rlen)--;
    if (*rlen > 1) (*rlen)--; /* the separator, except the root's own slash */
    res[*rlen] = '\0';
}

/* res holds the resolved prefix: always absolute, never a trailing slash except "/",
 * and every component in it an existing directory that is not a symlink. So `..` is a
 * string pop, and it is the same step the kernel takes (no symlink left to undo). */
static int resolve(const char *path, char **out, struct stat *final)
{
    size_t plen = strlen(path);
    if (plen == 0) return -ENOENT; /* the kernel's answer for "" */
    if (plen >= PATH_MAX) return -ENAMETOOLONG;

    _cleanup_free_ char *res = malloc(PATH_MAX);
    if (!res) return -ENOMEM;
    size_t rlen;
    if (path[0] == '/') {
        strcpy(res, "/");
        rlen = 1;
    } else {
        if (!getcwd(res, PATH_MAX)) return -errno;
        /* getcwd is physical already. glibc >= 2.27 turns the kernel's "(unreachable)"
         * answer (cwd outside our root) into ENOENT; the check covers older ones. */
        if (res[0] != '/') return -ENOENT;
        rlen = strlen(res);
    }

    struct pending p = {.buf = strdup(path), .len = plen};
    if (!p.buf) return -ENOMEM;

    int links = 0, err = 0;
    struct stat st;
    size_t off = 0;
    char target[PATH_MAX];

    while (off < p.len) {
        while (off < p.len && p.buf[off] == '/')
            off++;
        if (off >= p.len) break;
        size_t start = off;
        while (off < p.len && p.buf[off] != '/')
            off++;
        size_t clen = off - start;
        const char *c = p.buf + start;

        /* `.` and `..` still need the prefix to be a directory; it always is here,
         * because a non-directory with more to follow was refused when it was taken. */
        if (clen == 1 && c[0] == '.') continue;
        if (clen == 2 && c[0] == '.' && c[1] == '.') {
            pop_component(res, &rlen);
            continue;
        }
        if (clen > NAME_MAX) {
            err = -ENAMETOOLONG;
            goto out;
        }
        size_t add = (rlen > 1 ? 1 : 0) + clen;
        if (rlen + add >= PATH_MAX) {
            err = -ENAMETOOLONG;
            goto out;
        }
        size_t saved = rlen;
        if (rlen > 1) res[rlen++] = '/';
        memcpy(res + rlen, c, clen);
        rlen += clen;
        res[rlen] = '\0';

        if (lstat(res, &st) < 0) {
            err = -errno;
            goto out;
        }
        if (S_ISLNK(st.st_mode)) {
            if (++links > CORRAL_MAX_SYMLINKS) {
                err = -ELOOP;
                goto out;
            }
            ssize_t n = readlink(res, target, sizeof target);
            if (n < 0) {
                err = -errno;
                goto out;
            }
            if ((size_t)n >= sizeof target) {
                err = -ENAMETOOLONG;
                goto out;
            }
            if (n == 0) { /* Linux refuses an empty link body with ENOENT */
                err = -ENOENT;
                goto out;
            }
            /* A relative target is read against the link's directory: drop the
             * link's own name. An absolute one restarts from the root. */
            rlen = saved;
            res[rlen] = '\0';
            if (target[0] == '/') {
                strcpy(res, "/");
                rlen = 1;
            }
            err = pending_splice(&p, target, (size_t)n, off);
            if (err) goto out;
            off = 0;
            continue;
        }
        if (!S_ISDIR(st.st_mode) && more_follows(p.buf, off, p.len)) {
            err = -ENOTDIR;
            goto out;
        }
    }

    *out = strdup(res);
    if (!*out) {
        err = -ENOMEM;
        goto out;
    }
    if (final) {
        /* The walk's last lstat saw the final object unless the path ended in `.`/`..`
         * or was the root: stat what we return so the caller tests the right thing. */
        if (stat(*out, final) < 0) {
            err = -errno;
            free(*out);
            *out = NULL;
        }
    }
out:
    free(p.buf);
    return err;
}

int corral_resolve_file(const char *path, char **out)
{
    if (!path || !out) return -EINVAL;
    *out = NULL;
    return resolve(path, out, NULL);
}

int corral_resolve_dir(const char *path, char **out)
{
    if (!path || !out) return -EINVAL;
    *out = NULL;
    struct stat st;
    char *r = NULL;
    int err = resolve(path, &r, &st);
    if (err) return err;
    if (!S_ISDIR(st.st_mode)) {
        free(r);
        return -ENOTDIR;
    }
    *out = r;
    return 0;
}

static int copy_unchanged(const char *cmd, char **out)
{
    *out = strdup(cmd);
    return *out ? 0 : -ENOMEM;
}

/* execvp's test for a PATH hit: a regular file we may execute. execvp itself moves on
 * past EACCES, so a non-executable file earlier on PATH does not shadow a later one. */
static bool is_executable_file(const char *candidate)
{
    struct stat st;
    if (stat(candidate, &st) < 0 || !S_ISREG(st.st_mode)) return false;
    return access(candidate, X_OK) == 0;
}

int corral_resolve_executable(const char *cmd, const char *path_env, char **out)
{
    if (!cmd || !out) return -EINVAL;
    *out = NULL;
    if (cmd[0] == '\0') return -EINVAL;

    if (strchr(cmd, '/')) {
        int err = resolve(cmd, out, NULL);
        if (err == -ENOENT || err == -ENOTDIR) return copy_unchanged(cmd, out);
        return err;
    }

    size_t clen = strlen(cmd);
    if (clen > NAME_MAX) return copy_unchanged(cmd, out);
    const char *dirs = path_env ? path_env : DEFAULT_PATH;
    _cleanup_free_ char *candidate = malloc(PATH_MAX);
    if (!candidate) return -ENOMEM;

    for (const char *d = dirs;; d++) {
        const char *end = strchrnul(d, ':');
        size_t dlen = (size_t)(end - d);
        /* An empty entry is the working directory (POSIX, and what execvp does). */
        const char *dir = dlen ? d : ".";
        if (!dlen) dlen = 1;
        if (dlen + 1 + clen < PATH_MAX) {
            memcpy(candidate, dir, dlen);
            candidate[dlen] = '/';
            memcpy(candidate + dlen + 1, cmd, clen + 1);
            if (is_executable_file(candidate)) return resolve(candidate, out, NULL);
        }
        if (*end == '\0') break;
        d = end;
    }
    return copy_unchanged(cmd, out);
}

/* The opener without openat2: from "/", component by component with O_NOFOLLOW, so a
 * symlink opens as itself and is refused. An O_PATH fd or -errno (-ELOOP: a symlink). */
static int open_nofollow_walk(const char *path, int want_dir)
{
    char buf[PATH_MAX];
    if (path[0] != '/' || snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -EINVAL;
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    char *save = NULL;
    for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        int next = openat(fd, c, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(fd);
        if (next < 0) return -err;
        struct stat st;
        if (fstat(next, &st) < 0 || S_ISLNK(st.st_mode)) {
            close(next);
            return -ELOOP;
        }
        fd = next;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || (want_dir && !S_ISDIR(st.st_mode))) {
        close(fd);
        return -ENOTDIR;
    }
    return fd;
}

int corral_open_no_symlinks(int at, const char *path, int oflags, int how)
{
    struct open_how oh = {.flags = (unsigned)(oflags | O_CLOEXEC),
                          .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    if (how & CORRAL_OPEN_BENEATH) oh.resolve |= RESOLVE_BENEATH | RESOLVE_NO_XDEV;
    int fd = (int)syscall(SYS_openat2, at, path, &oh, sizeof oh);
    if (fd >= 0) return fd;
    if (errno == ENOSYS && (how & CORRAL_OPEN_WALK) && (oflags & O_PATH) &&
        !(how & CORRAL_OPEN_BENEATH))
        return open_nofollow_walk(path, oflags & O_DIRECTORY);
    return -errno;
}
