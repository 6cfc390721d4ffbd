/*
 * Idmapped mounts (mount_setattr with MOUNT_ATTR_IDMAP, Linux 5.12+ on the filesystems
 * that support them): a directory an operator made, owned by its owner O on the host,
 * shown to a tenant as its own. The tenant's root is an unprivileged host id H; a mount
 * idmapped with a user namespace mapping O to H shows O's files as H's (so as the
 * tenant's root inside its own user namespace), and stores a file the tenant creates as
 * O's. Nothing is ever chowned.
 *
 * The mounts are detached trees (no path on the host names them), made by a privileged
 * parent before a tenant spawn and handed across clone3 (mount.h, CORRAL_BIND_TREE).
 */
#ifndef CORRAL_IDMAP_H
#define CORRAL_IDMAP_H

#include <stddef.h>
#include <sys/types.h>

/*
 * A user namespace that maps disk_uid to shown_uid and disk_gid to shown_gid (one id
 * each; uid_map "disk_uid shown_uid 1"), for MOUNT_ATTR_IDMAP: through a mount idmapped
 * with it, a file stored as disk_uid shows as shown_uid, and one created by shown_uid is
 * stored as disk_uid. Every other id shows as the overflow id and cannot be created.
 * Made by a short-lived child (a namespace outlives its last process while an fd holds
 * it); the child is reaped before this returns. Needs CAP_SETUID/CAP_SETGID to map ids
 * other than the caller's own. Returns an O_CLOEXEC fd on the namespace, or -errno.
 */
int corral_idmap_userns(uid_t disk_uid, uid_t shown_uid, gid_t disk_gid, gid_t shown_gid);

enum {
    CORRAL_TREE_RDONLY = 1 << 0,
    CORRAL_TREE_RECURSIVE = 1 << 1, /* with the mounts beneath (never with an idmap) */
};

/*
 * A detached copy (open_tree OPEN_TREE_CLONE) of the mount at fd — a directory fd, or a
 * detached mount such as another tree or a filesystem from corral_disk_attach — nosuid
 * and nodev, read-only with CORRAL_TREE_RDONLY, and idmapped through userns_fd when it
 * is >= 0. Needs CAP_SYS_ADMIN. Returns the O_CLOEXEC mount fd, or -errno: -EINVAL from
 * the idmap means this filesystem does not support idmapped mounts. Closing the fd
 * unmounts the copy unless it was attached somewhere first.
 */
int corral_idmap_tree(int fd, int userns_fd, unsigned flags);

/*
 * Regular files in the tree at fd whose other links may lie outside it: a tree shown
 * through an idmap gives the tenant write access to what owner_uid (or group owner_gid)
 * owns, so a hard link planted in it to a file outside (an operator-made storage owned
 * by root holding a link to /etc/shadow) would hand the tenant that file. Walks the tree
 * without following a symlink or crossing a mount (what a non-recursive tree shows),
 * counts the links found inside for each file with st_nlink > 1 that owner_uid or
 * owner_gid owns, and reports those with fewer inside than st_nlink. Returns their
 * number (0: none), with one of their paths (relative to fd) in first (truncated to
 * len, "" when none), or -errno.
 */
int corral_idmap_foreign_links(int fd, uid_t owner_uid, gid_t owner_gid, char *first, size_t len);

#endif
