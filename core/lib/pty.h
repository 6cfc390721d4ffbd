/*
 * A pseudo-terminal of a sandbox's own devpts: the master opened through the sandbox's
 * root (never a path the host resolves: the tenant owns that tree), its peer through
 * TIOCGPTPEER (no lookup of /dev/pts/N at all).
 */
#ifndef CORRAL_PTY_H
#define CORRAL_PTY_H

/* Opens root_dirfd's dev/pts/ptmx (resolved inside that root, no symlink followed),
 * checks it is the multiplexer of a devpts instance, unlocks it, and returns its master
 * in *master and its peer in *slave, both CLOEXEC, the slave without becoming anyone's
 * controlling terminal; the window size is set to rows x cols when both are > 0.
 * Returns 0 or -errno (-ENOTTY: not a devpts multiplexer); nothing is left open on
 * failure. */
int corral_pty_open_in(int root_dirfd, int rows, int cols, int *master, int *slave);

#endif
