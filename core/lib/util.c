/* Shared helpers of core/lib (see util.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

int corral_write_file(const char *path, const char *text, size_t len)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t w = write(fd, text, len);
    if (w < 0) return -errno;
    return (size_t)w == len ? 0 : -EIO;
}

int corral_poll_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    int n;
    do
        n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

int corral_is_beneath(const char *path, const char *dir)
{
    if (path[0] != '/') return 0;
    if (strcmp(dir, "/") == 0) return 1;
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}
