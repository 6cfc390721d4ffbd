/*
 * Detaching a keeper (see detach.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "detach.h"

int corral_detach(int *fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(p[0]);
        close(p[1]);
        return -err;
    }
    if (pid == 0) {
        close(p[0]);
        if (setsid() < 0) _exit(1);
        pid_t grand = fork();
        if (grand != 0) _exit(grand < 0 ? 1 : 0);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0) _exit(1);
        for (int i = 0; i < 3; i++)
            if (dup2(null, i) < 0) _exit(1);
        close(null);
        *fd = p[1];
        return 0;
    }
    close(p[1]);
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    *fd = p[0];
    return 1;
}
