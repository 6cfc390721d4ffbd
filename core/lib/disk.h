/*
 * A sandbox's own disk: a sparse image file formatted once (by the caller) and mounted
 * through a loop device as a detached tree, so a tenant's storage is a filesystem of its
 * own size and a write past it fails with ENOSPC instead of filling the host's disk.
 *
 * Nothing outlives its last user: the loop device is configured with LO_FLAGS_AUTOCLEAR,
 * so it detaches itself once the filesystem's last mount (the detached tree, its clones,
 * the tenant's mount namespace) is gone. No path on the host ever names the mount.
 */
#ifndef CORRAL_DISK_H
#define CORRAL_DISK_H

#include <stdint.h>

/*
 * Opens the image at path read-write without following a symlink. With create_bytes >
 * 0, creates it first (O_EXCL, mode 0600) as a sparse file of that size; otherwise it
 * must exist. Either way it must be a regular file owned by the caller's effective uid
 * that no other user may write: the kernel will parse it as a filesystem. Returns the
 * O_CLOEXEC fd with its size in *bytes, or -errno (-EPERM for a file failing those
 * checks).
 */
int corral_disk_open(const char *path, uint64_t create_bytes, uint64_t *bytes);

/*
 * Attaches the image open at image_fd to a free loop device (LOOP_CONFIGURE with
 * LO_FLAGS_AUTOCLEAR, retried when another process takes the same device first) and
 * mounts the filesystem of type fstype on it as a detached mount, nosuid and nodev.
 * Needs CAP_SYS_ADMIN. Returns the O_CLOEXEC mount fd with the loop device's number in
 * *loop (when not NULL), or -errno; on failure the loop device is already released.
 */
int corral_disk_attach(int image_fd, const char *fstype, int *loop);

#endif
