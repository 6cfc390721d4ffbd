/*
 * File-system steps the host takes around a sandbox (its storage directory, temporary
 * trees), done with system calls: a chain of shelled-out utilities cost `corral run`
 * about 8 ms of its start.
 */
#ifndef CORRAL_FS_H
#define CORRAL_FS_H

#include <sys/types.h>

/*
 * Removes path and everything beneath it without following a symlink anywhere: each
 * directory is opened O_NOFOLLOW relative to its parent's fd, so a link a tenant planted
 * (to /etc, say) is unlinked, never descended into. A missing path is success.
 * Returns 0 or -errno (the first failure; removal goes on past it).
 */
int corral_remove_tree(const char *path);

/*
 * Asks whether uid:gid (no supplementary groups) may access path with mode (R_OK, W_OK,
 * X_OK), by asking the kernel as that identity in a short-lived child — so ACLs, every
 * directory above and mount flags all count, as they will for the tenant.
 * Returns 1 (yes), 0 (no) or -errno when the child could not be run.
 */
int corral_access_as(const char *path, uid_t uid, gid_t gid, int mode);

/*
 * Opens the directory at the absolute path for reading without following a symlink in
 * any component (openat2 RESOLVE_NO_SYMLINKS): the fd holds the directory the path names
 * as it is, never one a link swapped in would lead to. Returns the O_CLOEXEC fd or
 * -errno (-ELOOP: a symlink on the way).
 */
int corral_open_dir(const char *path);

#endif
