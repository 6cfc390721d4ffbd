/*
 * Path resolution: one implementation for every grant and every invocation (resolve
 * before grant, docs/architecture.md invariant 3). Binding a symlink's target while
 * invoking the symlink fails outright, and SBPL matches resolved paths, so a grant
 * written against a symlink silently never matches: the grant and the invocation use the
 * same resolved string.
 */
#ifndef CORRAL_PATH_H
#define CORRAL_PATH_H

/* Physically resolves an existing path component by component as the kernel does:
 * relative link targets against the link's directory, `..` applied after a symlink to
 * its target, ELOOP after 40 links. Relative paths are taken against the working
 * directory. Returns 0 and a malloc'd absolute path in *out, or -errno. */
int corral_resolve_file(const char *path, char **out);

/* corral_resolve_file, and the result must be a directory (-ENOTDIR otherwise). */
int corral_resolve_dir(const char *path, char **out);

/* A bare name through path_env (PATH; NULL means the default search path), then the
 * symlink chain. A name not found on PATH, or a path that does not exist, is returned
 * unchanged (as a malloc'd copy) so the exec earns the OS's own error. Returns 0 or
 * -errno (ELOOP for a loop, ENOMEM). */
int corral_resolve_executable(const char *cmd, const char *path_env, char **out);

/* Ways of corral_open_no_symlinks. */
enum {
    /* stay beneath `at` and on its mount (RESOLVE_BENEATH | RESOLVE_NO_XDEV: -EXDEV at a
     * mount point) */
    CORRAL_OPEN_BENEATH = 1,
    /* without openat2 (ENOSYS: a kernel before 5.6, or corral's own filter inside a
     * confinement), walk an absolute path from "/" component by component with
     * O_NOFOLLOW; for O_PATH opens only, never with CORRAL_OPEN_BENEATH */
    CORRAL_OPEN_WALK = 2,
};

/* The one opener of a resolved path: no symlink may appear anywhere on it, so one swapped
 * in after resolution, by whoever can write a parent, is refused (-ELOOP) instead of
 * followed; grants are then made from the fd, not the path. `at` is a directory fd or
 * AT_FDCWD, `oflags` open(2)'s flags (O_CLOEXEC is always added), `how` CORRAL_OPEN_*.
 * Returns the fd or -errno. */
int corral_open_no_symlinks(int at, const char *path, int oflags, int how);

#endif
