/*
 * A sandbox's pseudo-terminal (see pty.h). openat2's RESOLVE_IN_ROOT keeps the lookup
 * inside the sandbox's root, and RESOLVE_NO_SYMLINKS refuses a link the tenant put on
 * the way; the devpts magic check refuses a file standing in for the multiplexer.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include "pty.h"
#include "util.h"

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

int corral_pty_open_in(int root_dirfd, int rows, int cols, int *master, int *slave)
{
    struct open_how how = {.flags = O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
                                      RESOLVE_NO_MAGICLINKS};
    _cleanup_close_ int m = (int)syscall(SYS_openat2, root_dirfd, "dev/pts/ptmx", &how, sizeof how);
    if (m < 0) return -errno;
    struct stat st;
    struct statfs sfs;
    if (fstat(m, &st) < 0 || fstatfs(m, &sfs) < 0) return -errno;
    if (!S_ISCHR(st.st_mode) || sfs.f_type != DEVPTS_SUPER_MAGIC) return -ENOTTY;
    int unlock = 0;
    if (ioctl(m, TIOCSPTLCK, &unlock) < 0) return -errno;
    if (rows > 0 && cols > 0) {
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
        if (ioctl(m, TIOCSWINSZ, &ws) < 0) return -errno;
    }
    int flags = fcntl(m, F_GETFL);
    if (flags < 0 || fcntl(m, F_SETFL, flags & ~O_NONBLOCK) < 0) return -errno;
    int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (s < 0) return -errno;
    *slave = s;
    *master = corral_take_fd(&m);
    return 0;
}
