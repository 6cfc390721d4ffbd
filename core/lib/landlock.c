/*
 * Landlock rulesets built at the best ABI the kernel offers, falling back right by
 * right (see landlock.h).
 *
 * What Landlock
 does not cover, and why the mount namespace exists beside it
 * (core/host/confine.c): chmod/chown/utime/xattr changes are not access rights at any ABI,
 * so a file that can be reached can have its metadata changed; connecting to an existing
 * pathname unix socket is not checked before ABI 9; device nodes reached through an
 * already-permitted path keep their ioctls before ABI 5. The namespace layer makes
 * outside files unreachable by path at all; Landlock closes what a namespace cannot:
 * magic links (/proc/PID/root, /proc/self/fd/N) and directory fds opened before the
 * boundary, because its checks follow the file hierarchy, not the route taken to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "landlock.h"

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1

/* The kernel's ABI structs, declared here because the installed header predates
 * `scoped` (ABI 6); the kernel accepts a shorter struct from older callers, and the
 * size we pass tells it which fields we know. */
struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

int corral_landlock_abi(void)
{
    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
    if (abi < 0) return -errno;
    return (int)abi;
}

uint64_t corral_landlock_fs_rights(int abi)
{
    uint64_t rights = (1ULL << 13) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
    if (abi >= 2) rights |= CORRAL_LL_REFER;
    if (abi >= 3) rights |= CORRAL_LL_TRUNCATE;
    if (abi >= 5) rights |= CORRAL_LL_IOCTL_DEV;
    return abi >= 1 ? rights : 0;
}

uint64_t corral_landlock_scopes(int abi)
{
    return abi >= 6 ? (CORRAL_LL_SCOPE_ABSTRACT_UNIX | CORRAL_LL_SCOPE_SIGNAL) : 0;
}

int corral_landlock_create(int abi)
{
    if (abi < 1) return -EOPNOTSUPP;
    struct ll_ruleset_attr attr = {
        .handled_access_fs = corral_landlock_fs_rights(abi),
        .handled_access_net = 0, /* egress is the control plane's to keep */
        .scoped = corral_landlock_scopes(abi),
    };
    size_t size = abi >= 6 ? sizeof attr : offsetof(struct ll_ruleset_attr, scoped);
    if (abi < 4) size = offsetof(struct ll_ruleset_attr, handled_access_net);
    long fd = syscall(__NR_landlock_create_ruleset, &attr, size, 0);
    if (fd < 0) return -errno;
    return (int)fd; /* landlock ruleset fds are created O_CLOEXEC by the kernel */
}

int corral_landlock_allow_fd(int ruleset_fd, int abi, int parent_fd, uint64_t rights)
{
    struct stat st;
    if (fstat(parent_fd, &st) < 0) return -errno;
    rights &= corral_landlock_fs_rights(abi);
    if (!S_ISDIR(st.st_mode)) rights &= CORRAL_LL_FILE_RIGHTS;
    if (!rights) return 0;
    struct ll_path_beneath_attr pb = {.allowed_access = rights, .parent_fd = parent_fd};
    if (syscall(__NR_landlock_add_rule, ruleset_fd, LL_RULE_PATH_BENEATH, &pb, 0) < 0)
        return -errno;
    return 0;
}

int corral_landlock_allow_path(int ruleset_fd, int abi, const char *path, uint64_t rights,
                               int optional)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (optional && (err == ENOENT || err == ENOTDIR)) return 0;
        return -err;
    }
    int r = corral_landlock_allow_fd(ruleset_fd, abi, fd, rights);
    close(fd);
    return r;
}

int corral_landlock_restrict(int ruleset_fd)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -errno;
    if (syscall(__NR_landlock_restrict_self, ruleset_fd, 0) < 0) return -errno;
    return 0;
}
