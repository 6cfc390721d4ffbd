#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* One directory of the walk below: the subdirectories still to visit (gathered in one
 * pass, so a directory of 20,000 siblings is read once, not once per sibling), its name
 * in its parent and the parent's identity, checked when the walk climbs back via "..". */
struct level {
    char **subs;
    size_t n, next;
    char *name;
    dev_t parent_dev;
    ino_t parent_ino;
};

static void level_free(struct level *l)
{
    for (size_t i = l->next; i < l->n; i++)
        free(l->subs[i]);
    free(l->subs);
    free(l->name);
}

/* Unlinks every non-directory entry of the directory open at dfd and lists its
 * subdirectories into l. *err keeps the first error. */
static void read_level(int dfd, struct level *l, int *err)
{
    int scan = dup(dfd);
    DIR *d = scan >= 0 ? fdopendir(scan) : NULL;
    if (!d) {
        if (!*err) *err = -errno;
        if (scan >= 0) close(scan);
        return;
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dfd, e->d_name, 0) == 0 || errno == ENOENT) continue;
        if (errno != EISDIR && errno != EPERM) {
            if (!*err) *err = -errno;
            continue;
        }
        if (l->n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **grown = realloc(l->subs, ncap * sizeof *grown);
            if (!grown) {
                if (!*err) *err = -ENOMEM;
                break;
            }
            l->subs = grown;
            cap = ncap;
        }
        if (!(l->subs[l->n] = strdup(e->d_name))) {
            if (!*err) *err = -ENOMEM;
            break;
        }
        l->n++;
    }
    closedir(d);
}

int corral_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode)) return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    /* Depth first with one fd and a stack of levels: a tree as deep as a tenant likes
     * must not run out of fds, as a recursion holding one per level would. */
    struct level *stack = calloc(16, sizeof *stack);
    size_t depth = 0, cap = 16;
    int err = stack ? 0 : -ENOMEM;
    if (stack) read_level(fd, &stack[depth++], &err);
    while (depth > 0) {
        struct level *top = &stack[depth - 1];
        if (top->next < top->n) {
            char *name = top->subs[top->next++];
            int child = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct stat pst;
            if (child < 0 || fstat(fd, &pst) < 0) {
                if (!err) err = -errno;
                if (child >= 0) close(child);
                free(name); /* not removable: its parent's rmdir reports it */
                continue;
            }
            if (depth == cap) {
                struct level *grown = realloc(stack, cap * 2 * sizeof *grown);
                if (!grown) {
                    close(child);
                    free(name);
                    if (!err) err = -ENOMEM;
                    break;
                }
                stack = grown;
                cap *= 2;
            }
            close(fd);
            fd = child;
            stack[depth] =
                (struct level){.name = name, .parent_dev = pst.st_dev, .parent_ino = pst.st_ino};
            read_level(fd, &stack[depth], &err);
            depth++;
            continue;
        }
        if (depth == 1) break; /* the root itself: rmdir(path) below */
        struct level done = *top;
        depth--;
        int parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat pst;
        if (parent < 0 || fstat(parent, &pst) < 0 || pst.st_dev != done.parent_dev ||
            pst.st_ino != done.parent_ino) {
            if (!err) err = parent < 0 ? -errno : -ESTALE;
            if (parent >= 0) close(parent);
            level_free(&done);
            break;
        }
        close(fd);
        fd = parent;
        if (unlinkat(fd, done.name, AT_REMOVEDIR) < 0 && errno != ENOENT && !err) err = -errno;
        level_free(&done);
    }
    close(fd);
    for (size_t i = 0; i < depth; i++)
        level_free(&stack[i]);
    free(stack);
    if (rmdir(path) < 0 && errno != ENOENT && !err) err = -errno;
    return err;
}

int corral_access_as(const char *path, uid_t uid, gid_t gid, int mode)
{
    pid_t pid = fork();
    if (pid < 0) return -errno;
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 && getuid() == 0) _exit(3);
        /* Raw syscalls: glibc's wrappers would broadcast to threads the child lacks. */
        if (syscall(SYS_setresgid, gid, gid, gid) < 0) _exit(3);
        if (syscall(SYS_setresuid, uid, uid, uid) < 0) _exit(3);
        _exit(faccessat(AT_FDCWD, path, mode, 0) == 0 ? 0 : 1);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return -errno;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) > 1) return -EPERM;
    return WEXITSTATUS(status) == 0;
}

int corral_mark_dir(int fd, const char *name)
{
    if (fsetxattr(fd, name, "1", 1, 0) == 0) return 0;
    return errno == ENOTSUP ? -EOPNOTSUPP : -errno;
}

int corral_dir_marked(const char *path, const char *name)
{
    if (lgetxattr(path, name, NULL, 0) >= 0) return 1;
    return errno == ENODATA || errno == ENOTSUP ? 0 : -errno;
}

int corral_open_private(const char *path, int truncate, struct stat *st)
{
    struct stat local;
    if (!st) st = &local;
    int fd = open(
        path, O_WRONLY | (truncate ? 0 : O_APPEND) | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
        0600);
    if (fd < 0) return -errno;
    int err = 0;
    if (fstat(fd, st) < 0)
        err = -errno;
    else if (!S_ISREG(st->st_mode))
        err = -EINVAL;
    else if (st->st_uid != geteuid())
        err = -EPERM;
    else if ((st->st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0)
        err = -errno;
    else if (truncate && ftruncate(fd, 0) < 0)
        err = -errno;
    else {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) err = -errno;
    }
    if (err) {
        close(fd);
        return err;
    }
    return fd;
}

/* The magic numbers of linux/magic.h, spelled out: not every libc's headers carry all. */
static const struct {
    unsigned long magic;
    const char *name;
} kernel_fs[] = {
    {0x9fa0, "proc"},         {0x62656572, "sysfs"},       {0x1cd1, "devpts"},
    {0x64626720, "debugfs"},  {0x74726163, "tracefs"},     {0x73636673, "securityfs"},
    {0x27e0eb, "cgroup"},     {0x63677270, "cgroup2"},     {0xcafe4a11, "bpf"},
    {0x62656570, "configfs"}, {0xde5e81e4, "efivarfs"},    {0x6165676c, "pstore"},
    {0x65735543, "fusectl"},  {0x42494e4d, "binfmt_misc"}, {0x19800202, "mqueue"},
    {0x6e736673, "nsfs"},     {0xf97cff8c, "selinuxfs"},   {0x43415d53, "smackfs"},
};

int corral_kernel_fs(const char *path, const char **name)
{
    struct statfs sf;
    *name = NULL;
    if (statfs(path, &sf) < 0) return -errno;
    for (size_t i = 0; i < sizeof kernel_fs / sizeof kernel_fs[0]; i++)
        if ((unsigned long)sf.f_type == kernel_fs[i].magic) *name = kernel_fs[i].name;
    return 0;
}
