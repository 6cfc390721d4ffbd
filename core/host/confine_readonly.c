/*
 * exec-confined's read-only paths (see confine_readonly.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/stat.h>

#include "confine_readonly.h"
#include "path.h"
#include "util.h"

/* The longest root paths[i] is strictly beneath, or NULL. */
static const char *root_of(const char *const *roots, size_t n_roots, const char *path)
{
    const char *best = NULL;
    for (size_t i = 0; i < n_roots; i++)
        if (strcmp(path, roots[i]) != 0 && corral_is_beneath(path, roots[i]) &&
            (!best || strlen(roots[i]) > strlen(best)))
            best = roots[i];
    return best;
}

static int find(const struct corral_ro_bind *b, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(b[i].path, path) == 0) return (int)i;
    return -1;
}

/* Whether path is at or beneath a read-only path of the plan: a directory there is
 * pinned by that read-only mount already, and a read-write bind would reopen it. */
static int under_read_only(char *const *paths, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (corral_is_beneath(path, paths[i])) return 1;
    return 0;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const struct corral_ro_bind *)a)->path,
                  ((const struct corral_ro_bind *)b)->path);
}

/* Adds each directory strictly between root and path, read-write, unless planned. */
static int add_way(const char *root, const char *path, char *const *paths, size_t n_paths,
                   struct corral_ro_bind *out, size_t *n, const char **bad)
{
    size_t len = strlen(root);
    for (const char *s = strchr(path + len + 1, '/'); s; s = strchr(s + 1, '/')) {
        char *dir = strndup(path, (size_t)(s - path));
        if (!dir) return -ENOMEM;
        if (find(out, *n, dir) >= 0 || under_read_only(paths, n_paths, dir)) {
            free(dir);
            continue;
        }
        if (*n == CORRAL_RO_MAX) {
            free(dir);
            *bad = path;
            return -E2BIG;
        }
        int fd = corral_open_no_symlinks(AT_FDCWD, dir, O_PATH | O_DIRECTORY, CORRAL_OPEN_WALK);
        if (fd < 0) {
            *bad = path;
            free(dir);
            return fd;
        }
        out[(*n)++] = (struct corral_ro_bind){dir, fd, 1, 1};
    }
    return 0;
}

int corral_ro_plan(const char *const *roots, size_t n_roots, char *const *paths, const int *fds,
                   size_t n_paths, struct corral_ro_bind *out, const char **bad)
{
    size_t n = 0;
    for (size_t i = 0; i < n_paths; i++) {
        const char *root = root_of(roots, n_roots, paths[i]);
        if (!root) {
            *bad = paths[i];
            corral_ro_release(out, n);
            return -EINVAL;
        }
        int r = add_way(root, paths[i], paths, n_paths, out, &n, bad);
        if (r == 0 && find(out, n, paths[i]) < 0 && n == CORRAL_RO_MAX) {
            *bad = paths[i];
            r = -E2BIG;
        }
        if (r < 0) {
            corral_ro_release(out, n);
            return r;
        }
        if (find(out, n, paths[i]) < 0) out[n++] = (struct corral_ro_bind){paths[i], fds[i], 0, 0};
    }
    qsort(out, n, sizeof *out, by_path);
    return (int)n;
}

int corral_ro_check(const struct corral_ro_bind *b, size_t n, const char **bad)
{
    for (size_t i = 0; i < n; i++) {
        *bad = b[i].path;
        struct statx stx;
        if (syscall(SYS_statx, AT_FDCWD, b[i].path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &stx) <
            0)
            return -errno;
        if ((stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
            !(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
            return -ENOTBLK;
        struct statvfs vfs;
        if (statvfs(b[i].path, &vfs) < 0) return -errno;
        if (!b[i].rw && !(vfs.f_flag & ST_RDONLY)) return -EPERM;
    }
    *bad = NULL;
    return 0;
}

void corral_ro_release(struct corral_ro_bind *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!b[i].owned) continue;
        if (b[i].fd >= 0) close(b[i].fd);
        free((char *)b[i].path);
        b[i].owned = 0;
    }
}
