/*
 * The runtime directory rule (see rundir.h); lua/corral/runtime_dir.lua is the same rule
 * for the Lua side, which also makes the directory. Nothing here makes one: a caller
 * that finds none has nothing to talk to.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "rundir.h"

int corral_rundir_path(char *out, size_t cap, uid_t euid, const char *xdg_runtime_dir)
{
    int n;
    if (euid == 0)
        n = snprintf(out, cap, "/run/corral/%u", (unsigned)euid);
    else if (xdg_runtime_dir != NULL && xdg_runtime_dir[0] == '/')
        n = snprintf(out, cap, "%s/corral", xdg_runtime_dir);
    else
        n = snprintf(out, cap, "/tmp/corral-%u", (unsigned)euid);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int corral_rundir_check(const char *path, uid_t euid)
{
    struct stat st;
    if (lstat(path, &st) < 0) return -errno;
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    if (st.st_uid != euid) return -EPERM;
    if (st.st_mode & 077) return -EACCES;
    return 0;
}
