/* The checks core/host/dispatch.h describes, shared by the host and the front. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "dispatch.h"

int corral_invoked_as_runtime(const char *argv0)
{
    const char *base = argv0 ? strrchr(argv0, '/') : NULL;
    base = base ? base + 1 : argv0;
    return base && strcmp(base, "corral-runtime") == 0;
}

int corral_brokered(void)
{
    const char *b = getenv("CORRAL_BROKER");
    return b != NULL && b[0] != '\0' && prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
}

void corral_open_closed_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd) return;
}
