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

#define CORRAL_IDMAP_PATH_MAX 4096

/* What a tree about to be shown through an idmap holds that would hand the tenant more
 * than the tree (see corral_idmap_scan). Each first path is relative to the tree, ""
 * when there is none. */
struct corral_idmap_findings {
    int links;      /* regular files with a hard link outside the tree */
    int privileged; /* files that run with privileges and whose contents the tenant could change */
    int storages;   /* directories carrying the mark: other sandboxes' storages */
    char link[CORRAL_IDMAP_PATH_MAX];
    char privileged_path[CORRAL_IDMAP_PATH_MAX];
    char storage[CORRAL_IDMAP_PATH_MAX];
};

/*
 * Walks the tree at fd without following a symlink or crossing a mount (what a
 * non-recursive tree shows). A tree shown through an idmap gives the tenant what
 * owner_uid (or group owner_gid) owns, so two kinds of file in it would hand over more:
 *
 * - a hard link to a file outside (an operator-made storage owned by root holding a link
 *   to /etc/shadow would hand the tenant that file): for each regular file with st_nlink
 *   > 1 that owner_uid or owner_gid owns, the links found inside are counted, and those
 *   with fewer than st_nlink are reported;
 * - a file that runs with privileges on the host (setuid, setgid and group-executable,
 *   or with a file capability) whose contents the tenant could change (owner_uid's, or
 *   writable through owner_gid or by anyone): a write through a shared mapping keeps the
 *   setuid bit and the capability, so the tenant could rewrite a setuid-root program
 *   that any host user then runs as root;
 * - with mark (an extended attribute name, or NULL), a directory beneath the top that
 *   carries it (another sandbox's storage, see fs.h corral_mark_dir): the tenant could
 *   reach that sandbox's files and the disk image beside them. It is not walked.
 *
 * Returns 0 with the findings in out, or -errno.
 */
int corral_idmap_scan(int fd, uid_t owner_uid, gid_t owner_gid, const char *mark,
                      struct corral_idmap_findings *out);

#endif
