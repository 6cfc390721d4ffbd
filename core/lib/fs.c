#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* One level of the walk below: the directory's name in its parent, and its identity,
 * checked when the walk climbs back through "..". */
struct level {
    char *name;
    dev_t dev;
    ino_t ino;
};

/* Unlinks every non-directory entry of the directory open at dfd; returns the name of
 * one subdirectory left (malloc'd), or NULL when none is. *err keeps the first error. */
static char *unlink_entries(int dfd, int *err)
{
    int scan = dup(dfd);
    if (scan < 0) {
        if (!*err) *err = -errno;
        return NULL;
    }
    DIR *d = fdopendir(scan);
    if (!d) {
        if (!*err) *err = -errno;
        close(scan);
        return NULL;
    }
    char *subdir = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dfd, e->d_name, 0) == 0 || errno == ENOENT) continue;
        if (errno == EISDIR || errno == EPERM) {
            if (!subdir) subdir = strdup(e->d_name);
            continue;
        }
        if (!*err) *err = -errno;
    }
    closedir(d);
    return subdir;
}

int corral_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode)) return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    /*
     * Depth first with one fd and a stack of names: a tree as deep as its owner likes
     * (21,000 levels from a red-team tenant) must not run out of fds, which a recursion
     * holding one per level did, leaving the tree behind. Climbing uses "..", checked
     * against the identity recorded on the way down.
     */
    struct level *stack = NULL;
    size_t depth = 0, cap = 0;
    int err = 0;
    for (;;) {
        char *sub = unlink_entries(fd, &err);
        if (sub) {
            int child = openat(fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct stat cst;
            if (child < 0 || fstat(child, &cst) < 0) {
                if (!err) err = -errno;
                if (child >= 0) close(child);
                free(sub);
                break; /* cannot go down: leave the rest rather than loop */
            }
            if (depth == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                struct level *n = realloc(stack, ncap * sizeof *n);
                if (!n) {
                    close(child);
                    free(sub);
                    err = -ENOMEM;
                    break;
                }
                stack = n;
                cap = ncap;
            }
            struct stat pst;
            fstat(fd, &pst);
            stack[depth++] = (struct level){sub, pst.st_dev, pst.st_ino};
            close(fd);
            fd = child;
            continue;
        }
        if (depth == 0) break;
        struct level up = stack[--depth];
        int parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat pst;
        if (parent < 0 || fstat(parent, &pst) < 0 || pst.st_dev != up.dev || pst.st_ino != up.ino) {
            if (!err) err = parent < 0 ? -errno : -ESTALE;
            if (parent >= 0) close(parent);
            free(up.name);
            break;
        }
        close(fd);
        fd = parent;
        /* A directory that will not go (a mount point, an entry that stayed) ends the
         * walk: going down into it again would never finish. */
        int gone = unlinkat(fd, up.name, AT_REMOVEDIR) == 0 || errno == ENOENT;
        if (!gone && !err) err = -errno;
        free(up.name);
        if (!gone) break;
    }
    close(fd);
    for (size_t i = 0; i < depth; i++)
        free(stack[i].name);
    free(stack);
    if (rmdir(path) < 0 && errno != ENOENT && !err) err = -errno;
    return err;
}

int corral_access_as(const char *path, uid_t uid, gid_t gid, int mode)
{
    /* vfork-like cost is not needed: the child does four system calls and exits. */
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
