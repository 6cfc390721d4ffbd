#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Empties the directory open at dfd (which this function closes). Depth is bounded by the
 * fd limit: each level holds one fd, and running out reports EMFILE instead of recursing
 * without bound. */
static int empty_dir(int dfd)
{
    int first_err = 0;
    DIR *d = fdopendir(dfd);
    if (!d) {
        int err = -errno;
        close(dfd);
        return err;
    }
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno && !first_err) first_err = -errno;
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 || errno == ENOENT) continue;
        if (errno != EISDIR && errno != EPERM) {
            if (!first_err) first_err = -errno;
            continue;
        }
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            if (!first_err) first_err = -errno;
            continue;
        }
        int err = empty_dir(sub);
        if (err && !first_err) first_err = err;
        if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT && !first_err)
            first_err = -errno;
    }
    closedir(d);
    return first_err;
}

int corral_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode)) return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return -errno;
    int err = empty_dir(dfd);
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
