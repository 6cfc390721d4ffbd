/*
 * core/lib/pty.c: a pty of the devpts under a root, its slave a peer of its master; a
 * root whose dev/pts/ptmx is a symbolic link (the tenant's to place) or a file that is
 * no devpts multiplexer is refused, and nothing is left open.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "check.h"
#include "pty.h"

static void test_host_root(void)
{
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    int m = -1, s = -1;
    int r = corral_pty_open_in(root, 30, 100, &m, &s);
    if (r == -ENOENT) {
        NOTE("no /dev/pts/ptmx on this host: skipped");
        close(root);
        return;
    }
    CHECK(r == 0);
    struct winsize ws;
    CHECK(ioctl(s, TIOCGWINSZ, &ws) == 0 && ws.ws_row == 30 && ws.ws_col == 100);
    CHECK(isatty(s) && (fcntl(m, F_GETFD) & FD_CLOEXEC) && (fcntl(s, F_GETFD) & FD_CLOEXEC));
    /* raw: what the master writes reaches the slave as is */
    struct termios t;
    CHECK(tcgetattr(s, &t) == 0);
    cfmakeraw(&t);
    CHECK(tcsetattr(s, TCSANOW, &t) == 0);
    CHECK(write(m, "q", 1) == 1);
    char c = 0;
    CHECK(read(s, &c, 1) == 1 && c == 'q');
    close(m);
    close(s);
    close(root);
}

static void test_refusals(void)
{
    char dir[] = "/tmp/corral-pty-XXXXXX", path[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/dev", dir);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/dev/pts", dir);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/dev/pts/ptmx", dir);
    CHECK(symlink("/dev/pts/ptmx", path) == 0);
    int root = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int before = count_fds();
    int m = -1, s = -1;
    CHECK(corral_pty_open_in(root, 0, 0, &m, &s) == -ELOOP);
    CHECK(unlink(path) == 0);
    int f = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    CHECK(f >= 0);
    close(f);
    CHECK(corral_pty_open_in(root, 0, 0, &m, &s) == -ENOTTY);
    CHECK(count_fds() == before);
    CHECK(m == -1 && s == -1);
    unlink(path);
    snprintf(path, sizeof path, "%s/dev/pts", dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/dev", dir);
    rmdir(path);
    rmdir(dir);
    close(root);
}

int main(void)
{
    test_host_root();
    test_refusals();
    return DONE();
}
