/*
 * A new root built from nothing: an empty read-only tmpfs holding only the binds a plan
 * names, a fresh /proc, a minimal /dev, then pivot_root into it with the old root
 * detached. Files outside the plan are not hidden, they are absent, so no chmod, chown,
 * utime, unix-socket connect or device open can reach them by path.
 *
 * Used by the control-plane wrapper (core/host/confine.c) and by tenant spawns. The caller has
 * already unshared a mount namespace (and a pid namespace, when proc is asked for, and
 * is that namespace's member).
 */
#ifndef CORRAL_MOUNT_H
#define CORRAL_MOUNT_H

#include <stddef.h>

enum {
    CORRAL_BIND_RW = 1 << 0,       /* read-write; default read-only */
    CORRAL_BIND_OPTIONAL = 1 << 1, /* a missing source is skipped */
    CORRAL_BIND_DEVICES = 1 << 2,  /* keep device nodes usable (no nodev) */
    CORRAL_BIND_FROM_FD = 1 << 3,  /* src must still be the directory src_fd holds */
    CORRAL_BIND_TREE = 1 << 4,     /* src_fd is a detached mount: moved into place as it is */
};

struct corral_bind {
    const char *src;  /* host path, resolved */
    const char *dest; /* absolute path inside the new root */
    unsigned flags;
    int src_fd; /* with CORRAL_BIND_FROM_FD: an O_PATH fd on the source, taken when it was
                   checked; the clone of src must be that same directory (device and inode)
                   or the build fails, so a swap in its path cannot redirect the bind.
                   With CORRAL_BIND_TREE: a detached mount (open_tree or fsmount) the
                   caller made before the namespaces were, with every attribute it needs
                   (nosuid, nodev, an idmap): the build moves it in and sets nothing, and
                   src only names it in errors. A tenant spawn inherits it across clone3:
                   the privileged parent made it, so the tenant needs no access to src. */
};

/* A private tmpfs at path ("key=value,..." options: mode, size, nr_inodes). */
struct corral_tmpfs {
    const char *path;
    const char *options;
};

struct corral_symlink {
    const char *target;   /* link contents */
    const char *linkpath; /* absolute path inside the new root */
};

struct corral_root_plan {
    const struct corral_bind *binds;
    size_t n_binds;
    const struct corral_symlink *symlinks;
    size_t n_symlinks;
    int proc;              /* mount a fresh procfs at /proc */
    int dev;               /* minimal /dev: null zero full random urandom tty, fd links */
    unsigned long tmp_mib; /* when non-zero: a tmpfs /tmp capped at this size */
    /* private tmpfs instances, attached before the binds: a bind beneath one shows on
     * top of it */
    const struct corral_tmpfs *tmpfs;
    size_t n_tmpfs;
    const char *const *masks; /* absolute paths inside the new root to cover, when they
                                 exist: a directory with an empty read-only tmpfs, a file
                                 with an empty mode-0000 file (EACCES without
                                 CAP_DAC_OVERRIDE). Symlinks are left alone. */
    size_t n_masks;
};

/* Builds the root described by plan and pivots into it. Returns 0, or -errno with
 * *step naming what failed ("open_tree /usr", "pivot_root", …). */
int corral_root_build(const struct corral_root_plan *plan, const char **step);

#endif
