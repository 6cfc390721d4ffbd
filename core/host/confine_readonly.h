/*
 * exec-confined's read-only paths inside the boundary (`--read-only PATH`): files and
 * directories that run code later on the operator's behalf (git hooks and config,
 * .envrc, editor tasks; the list is lua/corral/confinement/protected.lua's). Each is
 * bound read-only over itself, which a layer with a mount namespace can do and Landlock
 * alone cannot (it never takes a path out of a tree it grants).
 *
 * A read-only bind alone would not hold: the directory holding it could be renamed away
 * and another put in its place. So each directory between the boundary directory and
 * the path is bound over itself too, read-write: a mount point cannot be renamed or
 * removed (EBUSY), nor can the read-only path itself.
 */
#ifndef CORRAL_CONFINE_READONLY_H
#define CORRAL_CONFINE_READONLY_H

#include <stddef.h>

/* At most this many binds (read-only paths and the directories on their way). */
#define CORRAL_RO_MAX 512

/* One bind of the plan: a path inside the boundary, bound over itself. */
struct corral_ro_bind {
    const char *path; /* resolved; owned by the caller (a read-only path) or the plan */
    int fd;           /* O_PATH on it, opened with no symlink on the way */
    int rw;           /* 1: a directory on the way, bound read-write to pin it; 0: read-only */
    int owned;        /* path and fd are the plan's (corral_ro_release) */
};

/* Plans the binds for paths[i] (resolved, each strictly beneath one of roots, opened as
 * fds[i]): for each, every directory strictly between its root and it (read-write),
 * then itself (read-only); a parent before anything beneath it, none twice, a path asked
 * read-only never bound read-write. Fills out (CORRAL_RO_MAX entries) and returns how
 * many, or -errno with *bad naming the path that failed (-E2BIG: too many). The fds of
 * the directories on the way are the plan's: corral_ro_release closes them. */
int corral_ro_plan(const char *const *roots, size_t n_roots, char *const *paths, const int *fds,
                   size_t n, struct corral_ro_bind *out, const char **bad);

/* Reads the plan back from inside the built root: each path is a mount root, and each
 * read-only one is on a read-only mount. Returns 0, or -errno with *bad naming the path
 * (-EROFS turned around: -EPERM where a read-only path is writable, -ENOTBLK where a
 * path is not a mount point). */
int corral_ro_check(const struct corral_ro_bind *b, size_t n, const char **bad);

/* Closes the fds and frees the paths the plan made (not the caller's read-only ones). */
void corral_ro_release(struct corral_ro_bind *b, size_t n);

#endif
