/*
 * core/lib/fs.c against the real kernel: a tree is removed without ever following a
 * planted symlink (the link's target survives, the link and the tree are gone), and
 * access_as answers as the kernel does for another identity (a searchable chain says
 * yes, one directory without x for that identity says no), and a private file is opened
 * only when the fd it gave is this user's own regular file (then mode 0600).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "fs.h"

static void touch(const char *rel)
{
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
}

static int exists(const char *rel)
{
    struct stat st;
    return lstat(at(rel), &st) == 0;
}

static void removal_never_follows_links(void)
{
    CHECK(mkdir(at("keep"), 0755) == 0);
    touch("keep/precious");
    CHECK(mkdir(at("tree"), 0755) == 0);
    CHECK(mkdir(at("tree/a"), 0755) == 0);
    CHECK(mkdir(at("tree/a/b"), 0700) == 0);
    touch("tree/a/b/f");
    touch("tree/top");
    CHECK(symlink(at("keep"), at("tree/a/dirlink")) == 0);
    CHECK(symlink(at("keep/precious"), at("tree/filelink")) == 0);
    int fds = count_fds();
    CHECK(corral_remove_tree(at("tree")) == 0);
    CHECK(count_fds() == fds);
    CHECK(!exists("tree"));                     /* the tree and the links in it are gone */
    CHECK(exists("keep/precious"));             /* and what they pointed at is not */
    CHECK(corral_remove_tree(at("tree")) == 0); /* missing: nothing to do */
    /* A symlink given as the root itself is unlinked, its target untouched. */
    CHECK(symlink(at("keep"), at("rootlink")) == 0);
    CHECK(corral_remove_tree(at("rootlink")) == 0);
    CHECK(!exists("rootlink") && exists("keep/precious"));
}

/* A tree deeper than the fd limit is removed all the same (one fd, a stack of names). */
static void removal_of_a_deep_tree(void)
{
    struct rlimit saved, low = {64, 64};
    getrlimit(RLIMIT_NOFILE, &saved);
    CHECK(mkdir(at("deep"), 0755) == 0);
    int fd = open(at("deep"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int made = 0;
    for (int i = 0; i < 3000 && fd >= 0; i++) {
        if (mkdirat(fd, "d", 0755) < 0) break;
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(fd);
        fd = next;
        made++;
    }
    if (fd >= 0) {
        int f = openat(fd, "leaf", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (f >= 0) close(f);
        close(fd);
    }
    CHECK(made == 3000); /* control: the tree is as deep as asked */
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    CHECK(corral_remove_tree(at("deep")) == 0);
    setrlimit(RLIMIT_NOFILE, &saved);
    CHECK(!exists("deep"));
}

/* Many siblings are removed in time linear in their number: each directory is read
 * once. (20,000 took 148 s when every pass returned one subdirectory.) */
static void removal_of_a_wide_tree(void)
{
    CHECK(mkdir(at("wide"), 0755) == 0);
    int fd = open(at("wide"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int made = 0;
    char name[32];
    for (int i = 0; i < 20000 && fd >= 0; i++) {
        snprintf(name, sizeof name, "d%d", i);
        if (mkdirat(fd, name, 0755) == 0) made++;
    }
    if (fd >= 0) close(fd);
    CHECK(made == 20000); /* control: the tree is as wide as asked */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(corral_remove_tree(at("wide")) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(!exists("wide"));
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    NOTE("removed 20,000 sibling directories in %.2f s\n", s);
}

static void access_as_another_identity(void)
{
    CHECK(mkdir(at("open"), 0711) == 0);
    CHECK(mkdir(at("open/mine"), 0700) == 0);
    CHECK(chown(at("open/mine"), 54321, 54321) == 0);
    CHECK(mkdir(at("shut"), 0700) == 0);
    CHECK(mkdir(at("shut/mine"), 0700) == 0);
    CHECK(chown(at("shut/mine"), 54321, 54321) == 0);
    /* Control: through a searchable parent the owner reaches its directory. */
    CHECK(corral_access_as(at("open/mine"), 54321, 54321, X_OK | W_OK) == 1);
    /* Another identity cannot, nor can the owner through a parent closed to it. */
    CHECK(corral_access_as(at("open/mine"), 54322, 54322, X_OK) == 0);
    CHECK(corral_access_as(at("shut/mine"), 54321, 54321, X_OK) == 0);
    /* As ourselves (root) the closed parent is no obstacle: the answer is per identity. */
    CHECK(corral_access_as(at("shut/mine"), 0, 0, X_OK) == 1);
}

/* The private log open: refusals on the fd (a link, a FIFO with or without a reader, a
 * device, another uid's file), each followed by the control on an own regular file. */
static void open_private(void)
{
    struct stat st;
    char own[2 * PATH_MAX]; /* at() reuses its buffers */
    snprintf(own, sizeof own, "%s", at("own.log"));
    mode_t old = umask(0277); /* a new file would be 0400 by the umask alone */
    int fd = corral_open_private(own, 0, &st);
    umask(old);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC) && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0600);
    CHECK(write(fd, "a\n", 2) == 2);
    close(fd);
    CHECK(chmod(own, 0644) == 0);
    CHECK(symlink("own.log", at("link.log")) == 0);
    CHECK(corral_open_private(at("link.log"), 0, NULL) == -ELOOP);
    CHECK(mkfifo(at("fifo"), 0600) == 0);
    CHECK(corral_open_private(at("fifo"), 0, NULL) == -ENXIO); /* no reader: never blocks */
    int rd = open(at("fifo"), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(rd >= 0 && corral_open_private(at("fifo"), 0, &st) == -EINVAL && S_ISFIFO(st.st_mode));
    close(rd);
    CHECK(corral_open_private("/dev/null", 0, &st) == -EINVAL && S_ISCHR(st.st_mode));
    if (geteuid() == 0) {
        char theirs[2 * PATH_MAX];
        snprintf(theirs, sizeof theirs, "%s", at("theirs.log"));
        touch("theirs.log");
        CHECK(chown(theirs, 65534, 65534) == 0 && chmod(theirs, 0644) == 0);
        int w = open(theirs, O_WRONLY | O_CLOEXEC);
        CHECK(w >= 0 && write(w, "keep", 4) == 4);
        close(w);
        CHECK(corral_open_private(theirs, 0, &st) == -EPERM && st.st_uid == 65534);
        CHECK(corral_open_private(theirs, 1, &st) == -EPERM); /* refused before emptying */
        CHECK(stat(theirs, &st) == 0 && (st.st_mode & 07777) == 0644 && st.st_size == 4);
    }
    fd = corral_open_private(own, 0, &st); /* the control: appended, mode tightened */
    CHECK(fd >= 0 && write(fd, "b\n", 2) == 2);
    close(fd);
    char buf[8] = {0};
    int r = open(own, O_RDONLY | O_CLOEXEC);
    CHECK(r >= 0 && read(r, buf, sizeof buf) == 4 && memcmp(buf, "a\nb\n", 4) == 0);
    close(r);
    CHECK(stat(own, &st) == 0 && (st.st_mode & 07777) == 0600);
    fd = corral_open_private(own, 1, &st); /* truncate: emptied, once it is checked */
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0);
    if (fd >= 0) close(fd);
}

int main(void)
{
    if (fixture_make("fs") < 0) return 1;
    CHECK(chmod(fixture_root, 0711) == 0);
    removal_never_follows_links();
    removal_of_a_deep_tree();
    removal_of_a_wide_tree();
    if (geteuid() == 0) access_as_another_identity();
    open_private();
    CHECK(corral_remove_tree(fixture_root) == 0); /* the verb under test, not fixture_remove */
    CHECK(access(fixture_root, F_OK) < 0 && errno == ENOENT);
    return DONE();
}
