/*
 * core/lib/util.c: the containment test (with "/" and near-miss prefixes), one-write
 * files against real files, poll that a signal does not cut short, and a write to a
 * reader gone that raises no SIGPIPE.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "util.h"

static void test_is_beneath(void)
{
    CHECK(corral_is_beneath("/a/b", "/a") == 1);
    CHECK(corral_is_beneath("/a", "/a") == 1);
    CHECK(corral_is_beneath("/a/b/c", "/a/b") == 1);
    /* A shared prefix is not containment, either way round. */
    CHECK(corral_is_beneath("/ab", "/a") == 0);
    CHECK(corral_is_beneath("/a", "/a/b") == 0);
    CHECK(corral_is_beneath("/b", "/a") == 0);
    /* Every absolute path is beneath "/", "/" included; a relative one is beneath nothing. */
    CHECK(corral_is_beneath("/", "/") == 1);
    CHECK(corral_is_beneath("/usr/bin", "/") == 1);
    CHECK(corral_is_beneath("usr", "/") == 0);
    CHECK(corral_is_beneath("/", "/a") == 0);
}

static void test_write_file(void)
{
    char dir[] = "/tmp/corral-util-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64], missing[64], buf[16] = {0};
    snprintf(path, sizeof path, "%s/f", dir);
    snprintf(missing, sizeof missing, "%s/missing", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    close(fd);

    int fds = count_fds();
    CHECK(corral_write_file(path, "deny\n", 5) == 0);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 5 && memcmp(buf, "deny\n", 5) == 0);
    close(fd);
    /* The file must exist: a kernel control file is never created by mistake. */
    CHECK(corral_write_file(missing, "x", 1) == -ENOENT);
    CHECK(access(missing, F_OK) < 0 && errno == ENOENT);
    CHECK(corral_write_file(dir, "x", 1) == -EISDIR);
    CHECK(corral_write_file("/dev/full", "x", 1) == -ENOSPC);
    CHECK(count_fds() == fds);

    unlink(path);
    rmdir(dir);
}

static void on_alarm(int sig)
{
    (void)sig;
}

static void test_poll_fd(void)
{
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    CHECK(corral_poll_fd(p[0], POLLIN, 0) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK(corral_poll_fd(p[0], POLLIN, 0) == 1);
    char c;
    CHECK(read(p[0], &c, 1) == 1);

    /* A signal handler without SA_RESTART interrupts poll(2) itself (the control), and
     * corral_poll_fd waits on through it to its own timeout. The timer fires once: each
     * restart takes the whole timeout again. */
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGALRM, &sa, &old) == 0);
    struct itimerval once = {{0, 0}, {0, 20000}};
    CHECK(setitimer(ITIMER_REAL, &once, NULL) == 0);
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    errno = 0;
    CHECK(poll(&pf, 1, 200) < 0 && errno == EINTR);
    CHECK(setitimer(ITIMER_REAL, &once, NULL) == 0);
    CHECK(corral_poll_fd(p[0], POLLIN, 200) == 0);
    sigaction(SIGALRM, &old, NULL);
    close(p[0]);
    close(p[1]);
}

static int sigpipe_blocked(void)
{
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    return sigismember(&now, SIGPIPE);
}

/* A write to a pipe whose reader is gone: EPIPE, no signal (SIGPIPE's default action
 * would end this test process), nothing left pending, the mask as it was. Control: the
 * same write while the reader is there succeeds. */
static void test_write_nosigpipe(void)
{
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(corral_write_nosigpipe(p[1], "x", 1) == 1); /* control */
    close(p[0]);
    errno = 0;
    CHECK(corral_write_nosigpipe(p[1], "x", 1) == -1 && errno == EPIPE);
    sigset_t pending;
    CHECK(sigpending(&pending) == 0 && !sigismember(&pending, SIGPIPE));
    CHECK(!sigpipe_blocked());
    /* a caller that blocks SIGPIPE itself keeps its block */
    sigset_t pipe_only, old;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    CHECK(corral_write_nosigpipe(p[1], "x", 1) == -1 && errno == EPIPE);
    CHECK(sigpipe_blocked());
    const struct timespec none = {0, 0};
    sigtimedwait(&pipe_only, NULL, &none); /* its own SIGPIPE, taken by itself */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[1]);
}

int main(void)
{
    test_is_beneath();
    test_write_file();
    test_poll_fd();
    test_write_nosigpipe();
    return DONE();
}
