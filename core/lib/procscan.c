/* Finding a process by the user it runs as (procscan.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "procscan.h"
#include "util.h"

/* Whether process pid (under the /proc dirfd) is a zombie or exiting: its state, after
 * the command name's last ')', is Z or X. A process gone meanwhile counts as not live. */
static int is_dead(int proc_fd, long pid)
{
    char path[32], buf[512];
    snprintf(path, sizeof path, "%ld/stat", pid);
    _cleanup_close_ int fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n <= 0) return 1;
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    if (paren == NULL || paren[1] != ' ') return 1;
    return paren[2] == 'Z' || paren[2] == 'X';
}

int corral_proc_find_owned(uid_t uid, pid_t *pid)
{
    DIR *d = opendir("/proc");
    if (d == NULL) return -errno;
    int proc_fd = dirfd(d), found = 0;
    struct dirent *e;
    /* errno is reset before each readdir: only its own failure may end the loop with one */
    while (!found && (errno = 0, e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char *end;
        long n = strtol(e->d_name, &end, 10);
        if (*end != '\0') continue;
        struct stat st;
        if (fstatat(proc_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_uid != uid) continue;
        if (is_dead(proc_fd, n)) continue;
        *pid = (pid_t)n;
        found = 1;
    }
    int err = found ? 0 : errno;
    closedir(d);
    return err ? -err : found;
}
