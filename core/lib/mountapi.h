/*
 * The new mount API as raw system calls (open_tree, move_mount, fsopen, fsconfig,
 * fsmount, mount_setattr; Linux 5.12+), with the constants older headers lack. One copy
 * for every file that builds or hands over detached mounts: mount.c (a root built from
 * fds), idmap.c (idmapped trees), disk.c (a filesystem on a loop device).
 */
#ifndef CORRAL_MOUNTAPI_H
#define CORRAL_MOUNTAPI_H

#include <fcntl.h>
#include <linux/types.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef FSOPEN_CLOEXEC
#define FSOPEN_CLOEXEC 0x00000001
#define FSMOUNT_CLOEXEC 0x00000001
#define FSCONFIG_SET_FLAG 0
#define FSCONFIG_SET_STRING 1
#define FSCONFIG_CMD_CREATE 6
#endif
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV 0x00000004
#define MOUNT_ATTR_NOEXEC 0x00000008
struct mount_attr {
    __u64 attr_set;
    __u64 attr_clr;
    __u64 propagation;
    __u64 userns_fd;
};
#endif
#ifndef MOUNT_ATTR_IDMAP
#define MOUNT_ATTR_IDMAP 0x00100000
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

static inline int sys_open_tree(int dfd, const char *path, unsigned flags)
{
    return (int)syscall(SYS_open_tree, dfd, path, flags);
}

static inline int sys_move_mount(int from, const char *from_path, int to, const char *to_path,
                                 unsigned flags)
{
    return (int)syscall(SYS_move_mount, from, from_path, to, to_path, flags);
}

static inline int sys_fsopen(const char *fs, unsigned flags)
{
    return (int)syscall(SYS_fsopen, fs, flags);
}

static inline int sys_fsconfig(int fd, unsigned cmd, const char *key, const void *value, int aux)
{
    return (int)syscall(SYS_fsconfig, fd, cmd, key, value, aux);
}

static inline int sys_fsmount(int fd, unsigned flags, unsigned attrs)
{
    return (int)syscall(SYS_fsmount, fd, flags, attrs);
}

/* Sets attrs (MOUNT_ATTR_*) on the mount at dfd/path; with MOUNT_ATTR_IDMAP, userns_fd
 * names the user namespace whose maps the mount shows its files through. */
static inline int sys_mount_setattr_ns(int dfd, const char *path, unsigned flags, __u64 set,
                                       int userns_fd)
{
    struct mount_attr attr = {.attr_set = set, .userns_fd = userns_fd >= 0 ? (__u64)userns_fd : 0};
    return (int)syscall(SYS_mount_setattr, dfd, path, flags, &attr, sizeof attr);
}

static inline int sys_mount_setattr(int dfd, const char *path, unsigned flags, __u64 set)
{
    return sys_mount_setattr_ns(dfd, path, flags, set, -1);
}

#endif
