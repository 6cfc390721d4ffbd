/*
 * core/lib/unix.c's fd passing: fds sent with a message arrive as the same open files,
 * CLOEXEC; a message carrying more than the receiver takes is refused whole, with no fd
 * left open; a message without fds reads as one. A connect to a listener whose backlog
 * is full waits for room, up to its timeout, and never hands back an unconnected socket.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "unix.h"

static int same_file(int a, int b)
{
    struct stat sa, sb;
    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static void test_passes_fds(void)
{
    int sv[2], p[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    int send[3] = {p[0], p[1], p[0]};
    CHECK(corral_unix_send_fds(sv[0], "hi\n", 3, send, 3) == 3);
    char buf[16] = {0};
    int got[3] = {-1, -1, -1};
    size_t n = 0;
    CHECK(corral_unix_recv_fds(sv[1], buf, sizeof buf, got, 3, &n, 1) == 3);
    CHECK(n == 3 && memcmp(buf, "hi\n", 3) == 0);
    CHECK(same_file(got[0], p[0]) && same_file(got[1], p[1]) && same_file(got[2], p[0]));
    for (int i = 0; i < 3; i++)
        CHECK(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
    /* the passed write end works: a byte through it reaches the pipe's reader */
    CHECK(write(got[1], "x", 1) == 1);
    char c = 0;
    CHECK(read(p[0], &c, 1) == 1 && c == 'x');
    for (int i = 0; i < 3; i++)
        close(got[i]);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static void test_too_many_refused_whole(void)
{
    int sv[2], p[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    int before = count_fds();
    int send[3] = {p[0], p[1], p[0]};
    CHECK(corral_unix_send_fds(sv[0], "x", 1, send, 3) == 1);
    char buf[4];
    int got[2] = {-1, -1};
    size_t n = 9;
    CHECK(corral_unix_recv_fds(sv[1], buf, sizeof buf, got, 2, &n, 1) == -EPROTO);
    CHECK(n == 0);
    CHECK(count_fds() == before);
    /* control: a message without fds is read, and nothing is waiting then */
    CHECK(corral_unix_send_fds(sv[0], "y", 1, NULL, 0) == 1);
    CHECK(corral_unix_recv_fds(sv[1], buf, sizeof buf, got, 2, &n, 1) == 1 && n == 0 &&
          buf[0] == 'y');
    CHECK(corral_unix_recv_fds(sv[1], buf, sizeof buf, got, 2, &n, 1) == -EAGAIN);
    CHECK(corral_unix_send_fds(sv[0], "z", 0, NULL, 0) == -EINVAL);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

/* Whether fd is connected: a connected unix socket has a peer. */
static int connected(int fd)
{
    struct sockaddr_un sa;
    socklen_t len = sizeof sa;
    return getpeername(fd, (struct sockaddr *)&sa, &len) == 0;
}

static void test_connect_waits_for_a_full_backlog(void)
{
    char dir[] = "/tmp/corral-test-unix-XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/sock", dir);
    int lfd = corral_unix_listen(path, 0, 0600);
    CHECK(lfd >= 0);
    /* fill the backlog: connections the listener never accepts */
    int held[4], n = 0, fd;
    while (n < 4 && (fd = corral_unix_connect(path, 100)) >= 0)
        held[n++] = fd;
    CHECK(n >= 1 && n < 4);
    CHECK(fd == -ETIMEDOUT); /* the attempt past the backlog waited, then said so */
    for (int i = 0; i < n; i++)
        CHECK(connected(held[i]));
    /* control: once one is accepted there is room, and the next connect is a connection */
    int a = accept(lfd, NULL, NULL);
    CHECK(a >= 0);
    fd = corral_unix_connect(path, 1000);
    CHECK(fd >= 0 && connected(fd));
    close(fd);
    close(a);
    for (int i = 0; i < n; i++)
        close(held[i]);
    close(lfd);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    test_passes_fds();
    test_too_many_refused_whole();
    test_connect_waits_for_a_full_backlog();
    return DONE();
}
