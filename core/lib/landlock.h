/*
 * Landlock: unprivileged filesystem access control, stacked on whatever else confines
 * the process. corral builds a ruleset at the best ABI the kernel offers (1..7),
 * dropping the rights an older ABI does not know one by one, so the same rule set means
 * "as much as this kernel can enforce" and the ABI is reported, never guessed.
 */
#ifndef CORRAL_LANDLOCK_H
#define CORRAL_LANDLOCK_H

#include <stdint.h>

/* Filesystem rights (linux/landlock.h; Debian's header stops before ABI 3). */
#define CORRAL_LL_EXECUTE (1ULL << 0)
#define CORRAL_LL_WRITE_FILE (1ULL << 1)
#define CORRAL_LL_READ_FILE (1ULL << 2)
#define CORRAL_LL_READ_DIR (1ULL << 3)
#define CORRAL_LL_REMOVE_DIR (1ULL << 4)
#define CORRAL_LL_REMOVE_FILE (1ULL << 5)
#define CORRAL_LL_MAKE_CHAR (1ULL << 6)
#define CORRAL_LL_MAKE_DIR (1ULL << 7)
#define CORRAL_LL_MAKE_REG (1ULL << 8)
#define CORRAL_LL_MAKE_SOCK (1ULL << 9)
#define CORRAL_LL_MAKE_FIFO (1ULL << 10)
#define CORRAL_LL_MAKE_BLOCK (1ULL << 11)
#define CORRAL_LL_MAKE_SYM (1ULL << 12)
#define CORRAL_LL_REFER (1ULL << 13)     /* ABI 2 */
#define CORRAL_LL_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define CORRAL_LL_IOCTL_DEV (1ULL << 15) /* ABI 5 */

/* Scopes (ABI 6): IPC that leaves the domain. */
#define CORRAL_LL_SCOPE_ABSTRACT_UNIX (1ULL << 0)
#define CORRAL_LL_SCOPE_SIGNAL (1ULL << 1)

#define CORRAL_LL_READ_EXEC (CORRAL_LL_EXECUTE | CORRAL_LL_READ_FILE | CORRAL_LL_READ_DIR)
#define CORRAL_LL_FS_ALL ((1ULL << 16) - 1)
/* A file (not a directory) can only carry these rights in a path-beneath rule. */
#define CORRAL_LL_FILE_RIGHTS                                                                      \
    (CORRAL_LL_EXECUTE | CORRAL_LL_WRITE_FILE | CORRAL_LL_READ_FILE | CORRAL_LL_TRUNCATE |         \
     CORRAL_LL_IOCTL_DEV)

/* The best ABI the running kernel supports, or -errno (-ENOSYS / -EOPNOTSUPP when
 * Landlock is absent or disabled). */
int corral_landlock_abi(void);

/* The filesystem rights, and the scopes, the given ABI can handle. */
uint64_t corral_landlock_fs_rights(int abi);
uint64_t corral_landlock_scopes(int abi);

/* Creates a ruleset handling every right `abi` knows (fs rights and scopes). Returns a
 * CLOEXEC ruleset fd or -errno. */
int corral_landlock_create(int abi);

/* Adds a path-beneath rule for an open directory or file (O_PATH is enough); rights
 * the ruleset does not handle are dropped, and a non-directory keeps only file rights.
 * Returns 0 or -errno. */
int corral_landlock_allow_fd(int ruleset_fd, int abi, int parent_fd, uint64_t rights);

/* The same for a path; a path that does not exist is skipped (returns 0) only when
 * optional is set. */
int corral_landlock_allow_path(int ruleset_fd, int abi, const char *path, uint64_t rights,
                               int optional);

/* Sets no_new_privs and enforces the ruleset on the calling thread (and what it execs).
 * Returns 0 or -errno. */
int corral_landlock_restrict(int ruleset_fd);

#endif
