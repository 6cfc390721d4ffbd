/*
 * File-system steps the host takes around a sandbox (its storage directory, temporary
 * trees), done with system calls: a chain of shelled-out utilities cost `corral run`
 * about 8 ms of its start.
 */
#ifndef CORRAL_FS_H
#define CORRAL_FS_H

#include <sys/stat.h>
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
 * A mark on a directory that only the host's root can set, read or remove: an extended
 * attribute in the trusted namespace (CAP_SYS_ADMIN in the initial user namespace), so no
 * tenant — root only of its own user namespace — can forge or strip it. corral marks each
 * storage it hands to a tenant, so that none is made inside another (whose tenant could
 * then reach it). name must begin "trusted.".
 *
 * corral_mark_dir sets it on the directory open at fd: 0, -EOPNOTSUPP where the
 * filesystem keeps no such attribute, or -errno. corral_dir_marked asks it of the
 * directory at path (a symlink there is not followed: it carries none): 1, 0 (absent, or
 * no such attributes there), or -errno.
 */
int corral_mark_dir(int fd, const char *name);
int corral_dir_marked(const char *path, const char *name);

/*
 * Opens path for writing as a file private to this process's effective uid, checked on
 * the fd it returns, so nothing can be swapped in between a check and the open:
 *  - never through a symbolic link in the last component (O_NOFOLLOW: -ELOOP);
 *  - never blocking on a FIFO (O_NONBLOCK: one without a reader is -ENXIO);
 *  - created mode 0600 when absent (O_CREAT; the umask can only narrow it);
 *  - then fstat: anything but a regular file is -EINVAL (a FIFO with a reader, a
 *    device), a file another uid owns -EPERM; and the mode is set to 0600 (fchmod);
 *  - with truncate, emptied (ftruncate) only once all of that holds; else O_APPEND.
 * Returns the fd (O_CLOEXEC, blocking again) or -errno; *st (may be NULL) receives the
 * fstat whenever the open itself succeeded, so a caller can say what was refused.
 */
int corral_open_private(const char *path, int truncate, struct stat *st);

/*
 * The kernel interface filesystem path lies on (statfs f_type, the symlink in the last
 * component followed): "proc", "sysfs", "cgroup2" … for one of the pseudo-filesystems
 * through which the kernel shows or takes the host's state, NULL for anything else (a
 * disk, tmpfs, overlay). devtmpfs shares tmpfs's magic and is not told apart here.
 * Returns 0 with *name set, or -errno.
 */
int corral_kernel_fs(const char *path, const char **name);

#endif
