/*
 * The caller's private runtime directory, by the rule lua/corral/runtime_dir.lua keeps
 * (control and session sockets, the probe cache live there): `/run/corral/<uid>` for
 * euid 0, else `$XDG_RUNTIME_DIR/corral` when that variable is an absolute path, else
 * `/tmp/corral-<uid>`. A directory that another user owns, or whose mode lets group or
 * others in, is never used: a socket found there could be anyone's.
 */
#ifndef CORRAL_RUNDIR_H
#define CORRAL_RUNDIR_H

#include <stddef.h>
#include <sys/types.h>

/* The path for euid, given XDG_RUNTIME_DIR's value (NULL: unset), into out (cap bytes).
 * Pure. Returns 0 or -ENAMETOOLONG. */
int corral_rundir_path(char *out, size_t cap, uid_t euid, const char *xdg_runtime_dir);

/* Whether path is a directory, not a symbolic link, owned by euid, with no group or
 * other mode bits. Returns 0, or -ENOENT (missing), -ENOTDIR (not a directory), -EPERM
 * (another owner), -EACCES (a mode that lets others in), another -errno of lstat. */
int corral_rundir_check(const char *path, uid_t euid);

#endif
