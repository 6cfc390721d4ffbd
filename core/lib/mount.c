/*
 * Root building with the new mount API (open_tree, fsopen, fsmount, move_mount,
 * mount_setattr; Linux 5.12+), because it takes what it needs as fds first: every bind
 * source is cloned as a detached tree before anything is mounted, so no mount of ours
 * can shadow a source, and mount_setattr makes a whole tree read-only in one call where
 * a classic remount walks submounts one by one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mount.h"
#include "mountapi.h"

/* A new filesystem instance as a detached mount fd. */
static int new_fs(const char *type, const char *options, unsigned attrs)
{
    int fs = sys_fsopen(type, FSOPEN_CLOEXEC);
    if (fs < 0) return -errno;
    int r = 0;
    for (const char *o = options; o && *o && r == 0;) {
        /* options: "key=value,flag,key=value" */
        char kv[64];
        size_t n = strcspn(o, ",");
        if (n >= sizeof kv) {
            r = -EINVAL;
            break;
        }
        memcpy(kv, o, n);
        kv[n] = '\0';
        char *eq = strchr(kv, '=');
        if (eq) *eq++ = '\0';
        if (sys_fsconfig(fs, eq ? FSCONFIG_SET_STRING : FSCONFIG_SET_FLAG, kv, eq, 0) < 0)
            r = -errno;
        o += n + (o[n] == ',');
    }
    if (r == 0 && sys_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) r = -errno;
    int m = r == 0 ? sys_fsmount(fs, FSMOUNT_CLOEXEC, attrs) : -1;
    if (r == 0 && m < 0) r = -errno;
    close(fs);
    return r < 0 ? r : m;
}

/* mkdir -p of a path relative to dirfd; an existing directory is fine. */
static int mkdirs_at(int dirfd, const char *rel)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf) return -ENAMETOOLONG;
    for (char *p = buf; *p; p++) {
        if (*p != '/' || p == buf) continue;
        *p = '\0';
        if (mkdirat(dirfd, buf, 0755) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdirat(dirfd, buf, 0755) < 0 && errno != EEXIST) return -errno;
    return 0;
}

/* Creates the mount point for a bind: a directory, or an empty file for a file. */
static int make_mountpoint(int rootfd, const char *rel, int is_dir)
{
    if (is_dir) return mkdirs_at(rootfd, rel);
    const char *slash = strrchr(rel, '/');
    if (slash) {
        char parent[PATH_MAX];
        size_t n = (size_t)(slash - rel);
        if (n >= sizeof parent) return -ENAMETOOLONG;
        memcpy(parent, rel, n);
        parent[n] = '\0';
        int r = mkdirs_at(rootfd, parent);
        if (r < 0) return r;
    }
    /* A file bound over one a read-only bind already shows (/etc/resolv.conf in /etc):
     * opening it for writing would fail, and it is a mount point as it is. */
    struct stat st;
    if (fstatat(rootfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) return 0;
    int fd = openat(rootfd, rel, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST) return -errno;
    if (fd >= 0) close(fd);
    return 0;
}

static const char *relative(const char *abs)
{
    while (*abs == '/')
        abs++;
    return abs;
}

static int attach_fs(int rootfd, const char *rel, const char *type, const char *opts,
                     unsigned attrs)
{
    int r = mkdirs_at(rootfd, rel);
    if (r < 0) return r;
    int m = new_fs(type, opts, attrs);
    if (m < 0) return m;
    r = sys_move_mount(m, "", rootfd, rel, MOVE_MOUNT_F_EMPTY_PATH) < 0 ? -errno : 0;
    close(m);
    return r;
}

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
#define N_DEV (sizeof dev_nodes / sizeof dev_nodes[0])

static int build_dev(int rootfd, const int *dev_trees)
{
    int r = mkdirs_at(rootfd, "dev");
    for (size_t i = 0; r == 0 && i < N_DEV; i++) {
        if (dev_trees[i] < 0) continue;
        char rel[32];
        snprintf(rel, sizeof rel, "dev/%s", dev_nodes[i]);
        r = make_mountpoint(rootfd, rel, 0);
        if (r == 0 && sys_move_mount(dev_trees[i], "", rootfd, rel, MOVE_MOUNT_F_EMPTY_PATH) < 0)
            r = -errno;
    }
    static const char *const links[][2] = {{"/proc/self/fd", "dev/fd"},
                                           {"/proc/self/fd/0", "dev/stdin"},
                                           {"/proc/self/fd/1", "dev/stdout"},
                                           {"/proc/self/fd/2", "dev/stderr"}};
    for (size_t i = 0; r == 0 && i < sizeof links / sizeof links[0]; i++)
        if (symlinkat(links[i][0], rootfd, links[i][1]) < 0 && errno != EEXIST) r = -errno;
    /* A terminal of the tenant's own: a devpts instance no other namespace sees (its
     * ptys numbered from 0, none of the host's listed), and /dev/ptmx its multiplexer,
     * so that a shell has job control and openpty works. No gid= option: the host's
     * tty group is not mapped in the tenant's user namespace. */
    if (r == 0)
        r = attach_fs(rootfd, "dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620",
                      MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC);
    if (r == 0 && symlinkat("pts/ptmx", rootfd, "dev/ptmx") < 0 && errno != EEXIST) r = -errno;
    return r;
}

static int pivot_into(int rootfd)
{
    /* pivot_root(".", ".") stacks the old root under the new one at the same place;
     * the detaching umount then removes it from this namespace entirely. */
    if (fchdir(rootfd) < 0) return -errno;
    if (syscall(SYS_pivot_root, ".", ".") < 0) return -errno;
    if (umount2(".", MNT_DETACH) < 0) return -errno;
    if (chdir("/") < 0) return -errno;
    return 0;
}

/* Makes (once) the empty mode-0000 file or directory masks are cloned from, in the root
 * tmpfs, which is still writable here. */
static int make_blank(int rootfd, const char *name, int dir)
{
    if (dir) {
        if (mkdirat(rootfd, name, 0) < 0 && errno != EEXIST) return -errno;
        return fchmodat(rootfd, name, 0, 0) < 0 ? -errno : 0;
    }
    int fd = openat(rootfd, name, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) return -errno;
    int r = fchmod(fd, 0) < 0 ? -errno : 0;
    close(fd);
    return r;
}

/* Covers each existing mask path (see corral_root_plan.masks) with a read-only clone of
 * an empty mode-0000 file or directory: one tmpfs entry cloned, cheaper than a tmpfs
 * instance per directory. */
static int cover_masks(int rootfd, const struct corral_root_plan *plan)
{
    static const char *const blank[2] = {".corral-masked-file", ".corral-masked-dir"};
    int made[2] = {0, 0}, r = 0;
    for (size_t i = 0; r == 0 && i < plan->n_masks; i++) {
        const char *rel = relative(plan->masks[i]);
        struct stat st;
        if (!*rel || fstatat(rootfd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;
        int dir = S_ISDIR(st.st_mode) ? 1 : 0;
        if (!made[dir] && (r = make_blank(rootfd, blank[dir], dir)) < 0) break;
        made[dir] = 1;
        int m = sys_open_tree(rootfd, blank[dir], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (m < 0) {
            r = -errno;
            break;
        }
        if (sys_mount_setattr(m, "", AT_EMPTY_PATH,
                              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                  MOUNT_ATTR_NOEXEC) < 0 ||
            sys_move_mount(m, "", rootfd, rel, MOVE_MOUNT_F_EMPTY_PATH) < 0)
            r = -errno;
        close(m);
    }
    return r;
}

/* The kernel's knobs under the fresh /proc, read-only: a process that is uid 0 keeps
 * owner access to them without any capability, and core_pattern alone is a way to run
 * a program as host root. */
static int protect_proc(int rootfd)
{
    static const char *const knobs[] = {"proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        int t = sys_open_tree(rootfd, knobs[i], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
        if (t < 0) {
            if (errno == ENOENT) continue;
            return -errno;
        }
        int r = 0;
        if (sys_mount_setattr(t, "", AT_EMPTY_PATH | AT_RECURSIVE,
                              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                  MOUNT_ATTR_NOEXEC) < 0 ||
            sys_move_mount(t, "", rootfd, knobs[i], MOVE_MOUNT_F_EMPTY_PATH) < 0)
            r = -errno;
        close(t);
        if (r < 0) return r;
    }
    return 0;
}

struct build_state {
    int *trees;
    int dev_trees[N_DEV];
    int rootfd;
    size_t n;
};

static void release(struct build_state *s)
{
    for (size_t i = 0; s->trees && i < s->n; i++)
        if (s->trees[i] >= 0) close(s->trees[i]);
    for (size_t i = 0; i < N_DEV; i++)
        if (s->dev_trees[i] >= 0) close(s->dev_trees[i]);
    if (s->rootfd >= 0) close(s->rootfd);
    free(s->trees);
}

#define FAIL(what, err)                                                                            \
    do {                                                                                           \
        *step = (what);                                                                            \
        r = (err);                                                                                 \
        goto out;                                                                                  \
    } while (0)

int corral_root_build(const struct corral_root_plan *plan, const char **step)
{
    static char step_buf[PATH_MAX + 32];
    struct build_state s = {.trees = NULL, .rootfd = -1, .n = plan->n_binds};
    int r = 0;
    for (size_t i = 0; i < N_DEV; i++)
        s.dev_trees[i] = -1;
    *step = "";

    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) FAIL("make / private", -errno);

    s.trees = calloc(plan->n_binds ? plan->n_binds : 1, sizeof *s.trees);
    if (!s.trees) FAIL("alloc", -ENOMEM);
    for (size_t i = 0; i < plan->n_binds; i++)
        s.trees[i] = -1;

    for (size_t i = 0; i < plan->n_binds; i++) {
        const struct corral_bind *b = &plan->binds[i];
        if (b->flags & CORRAL_BIND_TREE) {
            /* Our own copy: release() closes it, and the caller's fd stays the caller's. */
            s.trees[i] = fcntl(b->src_fd, F_DUPFD_CLOEXEC, 3);
            if (s.trees[i] < 0) {
                snprintf(step_buf, sizeof step_buf, "detached tree %s", b->src);
                FAIL(step_buf, -errno);
            }
            continue;
        }
        int t = sys_open_tree(AT_FDCWD, b->src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
        if (t < 0) {
            int err = errno;
            if ((b->flags & CORRAL_BIND_OPTIONAL) && (err == ENOENT || err == ENOTDIR)) continue;
            snprintf(step_buf, sizeof step_buf, "open_tree %s", b->src);
            FAIL(step_buf, -err);
        }
        /* A tree cannot be cloned from an fd taken in the namespace we have left
         * (EINVAL): clone the path, then require the very directory the fd holds. */
        if (b->flags & CORRAL_BIND_FROM_FD) {
            struct stat want, got;
            if (fstat(b->src_fd, &want) < 0 || fstat(t, &got) < 0 || want.st_dev != got.st_dev ||
                want.st_ino != got.st_ino) {
                close(t);
                snprintf(step_buf, sizeof step_buf, "open_tree %s (changed since it was checked)",
                         b->src);
                FAIL(step_buf, -ESTALE);
            }
        }
        s.trees[i] = t;
        __u64 attrs = MOUNT_ATTR_NOSUID;
        if (!(b->flags & CORRAL_BIND_RW)) attrs |= MOUNT_ATTR_RDONLY;
        if (!(b->flags & CORRAL_BIND_DEVICES)) attrs |= MOUNT_ATTR_NODEV;
        if (sys_mount_setattr(t, "", AT_EMPTY_PATH | AT_RECURSIVE, attrs) < 0) {
            snprintf(step_buf, sizeof step_buf, "mount_setattr %s", b->src);
            FAIL(step_buf, -errno);
        }
    }
    if (plan->dev) {
        for (size_t i = 0; i < N_DEV; i++) {
            char src[32];
            snprintf(src, sizeof src, "/dev/%s", dev_nodes[i]);
            s.dev_trees[i] = sys_open_tree(AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
            if (s.dev_trees[i] < 0 && errno != ENOENT && errno != ENXIO)
                FAIL("open_tree /dev", -errno);
        }
    }

    /* The new root: an empty tmpfs, attached over /tmp of this private namespace only
     * long enough to be populated and pivoted into. */
    s.rootfd = new_fs("tmpfs", "mode=0755,size=1m", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (s.rootfd < 0) FAIL("fsopen tmpfs", s.rootfd);
    {
        const char *stage = access("/tmp", F_OK) == 0 ? "/tmp" : "/mnt";
        if (sys_move_mount(s.rootfd, "", AT_FDCWD, stage, MOVE_MOUNT_F_EMPTY_PATH) < 0)
            FAIL("attach new root", -errno);
    }

    for (size_t i = 0; i < plan->n_tmpfs; i++) {
        snprintf(step_buf, sizeof step_buf, "tmpfs %s", plan->tmpfs[i].path);
        if ((r = attach_fs(s.rootfd, relative(plan->tmpfs[i].path), "tmpfs", plan->tmpfs[i].options,
                           MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0)
            FAIL(step_buf, r);
    }
    for (size_t i = 0; i < plan->n_binds; i++) {
        if (s.trees[i] < 0) continue;
        const char *rel = relative(plan->binds[i].dest);
        struct stat st;
        if (fstat(s.trees[i], &st) < 0) FAIL("fstat bind", -errno);
        snprintf(step_buf, sizeof step_buf, "bind %s", plan->binds[i].dest);
        if (*rel) {
            r = make_mountpoint(s.rootfd, rel, S_ISDIR(st.st_mode));
            if (r < 0) FAIL(step_buf, r);
        }
        if (sys_move_mount(s.trees[i], "", s.rootfd, *rel ? rel : ".", MOVE_MOUNT_F_EMPTY_PATH) < 0)
            FAIL(step_buf, -errno);
    }
    for (size_t i = 0; i < plan->n_symlinks; i++) {
        const char *rel = relative(plan->symlinks[i].linkpath);
        if (symlinkat(plan->symlinks[i].target, s.rootfd, rel) < 0 && errno != EEXIST) {
            snprintf(step_buf, sizeof step_buf, "symlink %s", plan->symlinks[i].linkpath);
            FAIL(step_buf, -errno);
        }
    }
    if (plan->dev && (r = build_dev(s.rootfd, s.dev_trees)) < 0) FAIL("minimal /dev", r);
    if (plan->proc && (r = attach_fs(s.rootfd, "proc", "proc", NULL,
                                     MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)) < 0)
        FAIL("mount /proc", r);
    if (plan->proc && (r = protect_proc(s.rootfd)) < 0) FAIL("read-only /proc/sys", r);
    if (plan->tmp_mib) {
        char opts[80];
        /* Inodes capped too: empty files take no blocks, so under a size cap alone each
         * still grows the host's slab (about 1 KiB apiece when no memory limit applies).
         * 256 per MiB. */

        snprintf(opts, sizeof opts, "mode=1777,size=%lum,nr_inodes=%lu", plan->tmp_mib,
                 plan->tmp_mib * 256);
        if ((r = attach_fs(s.rootfd, "tmp", "tmpfs", opts, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) <
            0)
            FAIL("mount /tmp", r);
    }
    if (plan->n_masks && (r = cover_masks(s.rootfd, plan)) < 0) FAIL("cover masked paths", r);
    /* The skeleton itself is read-only: nothing new can be created beside the binds. */
    if (sys_mount_setattr(s.rootfd, "", AT_EMPTY_PATH, MOUNT_ATTR_RDONLY) < 0)
        FAIL("read-only root", -errno);
    if ((r = pivot_into(s.rootfd)) < 0) FAIL("pivot_root", r);
out:
    release(&s);
    return r;
}
