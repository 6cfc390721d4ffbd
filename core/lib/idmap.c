/* Idmapped mounts (see idmap.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sched.h>
#include <linux/types.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "idmap.h"
#include "mountapi.h"
#include "ns.h"
#include "path.h"
#include "util.h"

int corral_idmap_userns(uid_t disk_uid, uid_t shown_uid, gid_t disk_gid, gid_t shown_gid)
{
    int hold[2];
    if (pipe2(hold, O_CLOEXEC) < 0) return -errno;
    /* clone3 with the namespace at birth: the child only waits on the pipe (the caller
     * may be multi-threaded, so it does nothing but system calls) until the maps are
     * written and the namespace is held by an fd. */
    struct clone_args ca = {.flags = CLONE_NEWUSER, .exit_signal = SIGCHLD};
    pid_t pid = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) {
        char c;
        close(hold[1]);
        while (read(hold[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    int err = pid < 0 ? -errno : 0;
    close(hold[0]);
    int ns = -1;
    if (!err) {
        struct corral_id_map u = {disk_uid, shown_uid, 1}, g = {disk_gid, shown_gid, 1};
        err = corral_ns_write_maps(pid, &u, 1, &g, 1);
        if (!err && (ns = corral_ns_open(pid, "user")) < 0) err = ns;
    }
    close(hold[1]); /* the child reads end-of-file and exits */
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    return err ? err : ns;
}

int corral_idmap_tree(int fd, int userns_fd, unsigned flags)
{
    int recursive = (flags & CORRAL_TREE_RECURSIVE) ? AT_RECURSIVE : 0;
    if (recursive && userns_fd >= 0) return -EINVAL;
    _cleanup_close_ int t =
        sys_open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | recursive);
    if (t < 0) return -errno;
    __u64 attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (flags & CORRAL_TREE_RDONLY) attrs |= MOUNT_ATTR_RDONLY;
    if (userns_fd >= 0) attrs |= MOUNT_ATTR_IDMAP;
    if (sys_mount_setattr_ns(t, "", AT_EMPTY_PATH | recursive, attrs, userns_fd) < 0) return -errno;
    return corral_take_fd(&t);
}

/* A file seen while walking: identity, links, and its first path (for the report). */
struct seen_file {
    dev_t dev;
    ino_t ino;
    nlink_t nlink;
    char *path;
};

struct walk {
    char **dirs; /* queue of directories still to read, relative to the root */
    size_t n_dirs, next_dir, cap_dirs;
    struct seen_file *files;
    size_t n_files, cap_files;
    uid_t uid;
    gid_t gid;
    const char *mark;  /* a directory carrying it is another sandbox's storage; NULL: none */
    int no_getxattrat; /* a kernel before 6.13 */
    struct corral_idmap_findings *out;
};

static int push_dir(struct walk *w, const char *parent, const char *name)
{
    if (w->n_dirs == w->cap_dirs) {
        size_t cap = w->cap_dirs ? w->cap_dirs * 2 : 64;
        char **grown = realloc(w->dirs, cap * sizeof *grown);
        if (!grown) return -ENOMEM;
        w->dirs = grown;
        w->cap_dirs = cap;
    }
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", parent, *parent ? "/" : "", name) < 0) return -ENOMEM;
    w->dirs[w->n_dirs++] = p;
    return 0;
}

static int note_file(struct walk *w, const struct stat *st, const char *parent, const char *name)
{
    if (w->n_files == w->cap_files) {
        size_t cap = w->cap_files ? w->cap_files * 2 : 16;
        struct seen_file *grown = realloc(w->files, cap * sizeof *grown);
        if (!grown) return -ENOMEM;
        w->files = grown;
        w->cap_files = cap;
    }
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", parent, *parent ? "/" : "", name) < 0) return -ENOMEM;
    w->files[w->n_files++] = (struct seen_file){st->st_dev, st->st_ino, st->st_nlink, p};
    return 0;
}

static int by_identity(const void *a, const void *b)
{
    const struct seen_file *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return 0;
}

/* Opens dir (relative to root, which may be an O_PATH fd such as open_tree's) for reading,
 * without following a symlink or leaving root's mount: -errno (-EXDEV at a mount point). */
static int open_beneath(int root, const char *dir)
{
    return corral_open_no_symlinks(root, *dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
                                   CORRAL_OPEN_BENEATH);
}

/* Whether the tenant could change the contents of this file through the idmap: its
 * owner (it may chmod u+w), a writer through the group, or anyone. */
static int tenant_writable(const struct walk *w, const struct stat *st)
{
    return st->st_uid == w->uid || (st->st_gid == w->gid && (st->st_mode & S_IWGRP)) ||
           (st->st_mode & S_IWOTH);
}

#ifndef SYS_getxattrat
#define SYS_getxattrat 464 /* Linux 6.13, the same number on every architecture */
#endif

struct xattr_args_compat {
    __u64 value;
    __u32 size;
    __u32 flags;
};

/* 1 when the file runs with privileges on the host: setuid, setgid and group-executable,
 * or a file capability; 0 when not; -errno. The capability is asked of the entry beside
 * the directory's fd (the tree has no host path): getxattrat, or before Linux 6.13 the
 * same through /proc/self/fd, which costs about as much again as the walk. */
static int runs_privileged(struct walk *w, int dir_fd, const char *name, const struct stat *st)
{
    if ((st->st_mode & S_ISUID) || (st->st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
        return 1;
    long r = -1;
    if (!w->no_getxattrat) {
        struct xattr_args_compat args = {0};
        r = syscall(SYS_getxattrat, dir_fd, name, AT_SYMLINK_NOFOLLOW, "security.capability", &args,
                    sizeof args);
        if (r < 0 && errno == ENOSYS) w->no_getxattrat = 1;
    }
    if (w->no_getxattrat) {
        char path[64 + NAME_MAX];
        snprintf(path, sizeof path, "/proc/self/fd/%d/%s", dir_fd, name);
        r = lgetxattr(path, "security.capability", NULL, 0);
    }
    if (r >= 0) return 1;
    return errno == ENODATA || errno == ENOTSUP ? 0 : -errno;
}

static void note_first(char *first, const char *parent, const char *name)
{
    if (!*first) snprintf(first, CORRAL_IDMAP_PATH_MAX, "%s%s%s", parent, *parent ? "/" : "", name);
}

static int read_dir(struct walk *w, int root, const char *dir)
{
    int fd = open_beneath(root, dir);
    if (fd < 0) return fd == -EXDEV ? 0 : fd; /* a mount point: not in the tree */
    if (*dir && w->mark && fgetxattr(fd, w->mark, NULL, 0) >= 0) {
        if (w->out->storages++ == 0) snprintf(w->out->storage, sizeof w->out->storage, "%s", dir);
        close(fd);
        return 0; /* what is in it is that sandbox's: not walked */
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        int err = -errno;
        close(fd);
        return err;
    }
    int r = 0;
    struct dirent *e;
    for (;;) {
        errno = 0;
        if (r != 0 || !(e = readdir(d))) break;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (e->d_type == DT_DIR) {
            r = push_dir(w, dir, e->d_name);
            continue;
        }
        if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT) r = -errno;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            r = push_dir(w, dir, e->d_name);
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        if (st.st_nlink > 1 && (st.st_uid == w->uid || st.st_gid == w->gid))
            r = note_file(w, &st, dir, e->d_name);
        if (r == 0 && tenant_writable(w, &st)) {
            int p = runs_privileged(w, dirfd(d), e->d_name, &st);
            if (p < 0) r = p;
            if (p > 0 && w->out->privileged++ == 0)
                note_first(w->out->privileged_path, dir, e->d_name);
        }
    }
    if (r == 0 && errno) r = -errno; /* readdir's own failure, not the end */
    closedir(d);
    return r;
}

int corral_idmap_scan(int fd, uid_t owner_uid, gid_t owner_gid, const char *mark,
                      struct corral_idmap_findings *out)
{
    memset(out, 0, sizeof *out);
    struct walk w = {.uid = owner_uid, .gid = owner_gid, .mark = mark, .out = out};
    int r = push_dir(&w, "", "");
    while (r == 0 && w.next_dir < w.n_dirs) {
        char *dir = w.dirs[w.next_dir];
        r = read_dir(&w, fd, dir);
        free(dir);
        w.dirs[w.next_dir++] = NULL;
    }
    if (r == 0 && w.n_files) {
        /* Links of one file sit next to each other once sorted. */
        qsort(w.files, w.n_files, sizeof *w.files, by_identity);
        size_t i = 0;
        while (i < w.n_files) {
            size_t j = i + 1;
            while (j < w.n_files && by_identity(&w.files[i], &w.files[j]) == 0)
                j++;
            if ((nlink_t)(j - i) < w.files[i].nlink && out->links++ == 0)
                snprintf(out->link, sizeof out->link, "%s", w.files[i].path);
            i = j;
        }
    }
    for (size_t i = w.next_dir; i < w.n_dirs; i++)
        free(w.dirs[i]);
    free(w.dirs);
    for (size_t i = 0; i < w.n_files; i++)
        free(w.files[i].path);
    free(w.files);
    return r < 0 ? r : 0;
}
