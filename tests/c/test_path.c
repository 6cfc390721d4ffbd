/*
 * core/lib/path.c against the real kernel: every successful resolution is cross-checked
 * with realpath(3), and every refusal with the error open(2) gives for the same path, so
 * the walk cannot drift from what an exec of the same string would do.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "path.h"
#include "seccomp.h"

static void mkfile(const char *rel, mode_t mode)
{
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK(chmod(at(rel), mode) == 0);
}

static void mkdir_(const char *rel)
{
    CHECK(mkdir(at(rel), 0755) == 0);
}

static void link_(const char *target, const char *rel)
{
    CHECK(symlink(target, at(rel)) == 0);
}

/* The kernel's verdict on a path: 0 if open(O_PATH) follows it to an object, or -errno. */
static int kernel_err(const char *p)
{
    int fd = open(p, O_PATH | O_CLOEXEC);
    if (fd < 0) return -errno;
    close(fd);
    return 0;
}

/* corral_resolve_file(p) must succeed, equal want, and equal realpath(3). */
static bool resolves_to(const char *p, const char *want)
{
    char *got = NULL;
    int err = corral_resolve_file(p, &got);
    char rp[PATH_MAX];
    bool ok = err == 0 && got && strcmp(got, want) == 0 && realpath(p, rp) && strcmp(rp, got) == 0;
    if (!ok) fprintf(stderr, "  %s: err=%d got=%s want=%s\n", p, err, got ? got : "(null)", want);
    free(got);
    return ok;
}

/* corral_resolve_file(p) must fail with want, as open(2) does, and leave *out NULL. */
static bool fails_with(const char *p, int want)
{
    char *got = (char *)1;
    int err = corral_resolve_file(p, &got);
    bool ok = err == want && got == NULL && kernel_err(p) == want;
    if (!ok) fprintf(stderr, "  %s: err=%d kernel=%d want=%d\n", p, err, kernel_err(p), want);
    return ok;
}

static void test_walk(void)
{
    mkdir_("dir");
    mkdir_("dir/sub");
    mkdir_("x");
    mkdir_("x/y");
    mkfile("file", 0644);

    /* Control: plain paths, `.`, `..` and repeated slashes. */
    CHECK(resolves_to(at("dir/sub"), at("dir/sub")));
    CHECK(resolves_to(at("dir/./sub/..//sub/"), at("dir/sub")));
    CHECK(resolves_to("/", "/"));
    CHECK(resolves_to("/..", "/"));
    CHECK(resolves_to("//../..//.", "/"));

    /* a -> b -> c -> dir: every link in the chain is followed. */
    link_("b", "a");
    link_("c", "b");
    link_("dir", "c");
    CHECK(resolves_to(at("a"), at("dir")));
    CHECK(resolves_to(at("a/sub"), at("dir/sub")));

    /* Relative targets are read against the link's own directory, not the cwd. */
    link_("sub", "dir/rel");
    CHECK(resolves_to(at("dir/rel"), at("dir/sub")));
    /* ... including a target that climbs with `..`. */
    link_("../x/y", "dir/up");
    CHECK(resolves_to(at("dir/up"), at("x/y")));

    /* `..` after a link applies to the link's target: link -> <root>/x/y, so link/.. is
     * <root>/x. A lexical clean-up would have said <root>. */
    link_(at("x/y"), "link");
    CHECK(resolves_to(at("link/.."), at("x")));
    CHECK(resolves_to(at("link/../y/../.."), fixture_root));

    /* Absolute targets restart from the root. */
    link_("/", "toroot");
    CHECK(resolves_to(at("toroot"), "/"));
    CHECK(resolves_to(at("toroot/.."), "/"));

    /* A final link is followed (the object is what is granted), also to a file. */
    link_("file", "tofile");
    CHECK(resolves_to(at("tofile"), at("file")));

    /* Missing names: ENOENT, as the kernel says, also through a dangling link. */
    CHECK(fails_with(at("nope"), -ENOENT));
    CHECK(fails_with(at("dir/nope/deeper"), -ENOENT));
    link_("nowhere", "dangling");
    CHECK(fails_with(at("dangling"), -ENOENT));
    CHECK(fails_with("", -ENOENT));

    /* A non-directory in the middle, or before a trailing slash / `.` / `..`. */
    CHECK(fails_with(at("file/x"), -ENOTDIR));
    CHECK(fails_with(at("file/"), -ENOTDIR));
    CHECK(fails_with(at("file/.."), -ENOTDIR));
    CHECK(fails_with(at("tofile/"), -ENOTDIR));

    /* A component longer than NAME_MAX. Control: the same directory, a legal name. */
    char longname[NAME_MAX + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK(fails_with(at(longname), -ENAMETOOLONG));
    CHECK(fails_with(at(longname + 1), -ENOENT));

    /* Relative input is taken against the working directory. */
    char cwd[PATH_MAX];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(at("dir")) == 0);
    CHECK(resolves_to("sub", at("dir/sub")));
    CHECK(resolves_to("up/../..", fixture_root));
    CHECK(resolves_to(".", at("dir")));
    CHECK(chdir(cwd) == 0);

    /* corral_resolve_dir: a directory (through links) passes, anything else is ENOTDIR. */
    char *out = NULL;
    CHECK(corral_resolve_dir(at("a"), &out) == 0 && out && strcmp(out, at("dir")) == 0);
    free(out);
    out = (char *)1;
    CHECK(corral_resolve_dir(at("tofile"), &out) == -ENOTDIR && out == NULL);
    CHECK(corral_resolve_dir(at("file"), &out) == -ENOTDIR && out == NULL);
    CHECK(corral_resolve_dir(at("nope"), &out) == -ENOENT && out == NULL);
}

static void test_loops(void)
{
    /* la -> lb -> la: ELOOP. */
    link_("lb", "la");
    link_("la", "lb");
    CHECK(fails_with(at("la"), -ELOOP));

    /* n0 -> dir and nK -> n(K-1): resolving nK follows K+1 links. The kernel allows 40;
     * both sides of the boundary are checked against open(2) by the helpers. */
    char name[32], target[32];
    CHECK(snprintf(name, sizeof name, "n0") > 0);
    link_("dir", name);
    for (int k = 1; k <= 40; k++) {
        snprintf(name, sizeof name, "n%d", k);
        snprintf(target, sizeof target, "n%d", k - 1);
        link_(target, name);
    }
    CHECK(resolves_to(at("n39"), at("dir"))); /* 40 links */
    CHECK(fails_with(at("n40"), -ELOOP));     /* 41 links */
    /* The count is per resolution, not per chain: 40 links then more components. */
    CHECK(resolves_to(at("n39/sub/.."), at("dir")));
}

static void test_executable(void)
{
    char *out = NULL;
    mkdir_("bin");
    mkdir_("noexec");
    mkdir_("real");
    mkdir_("shadow");
    mkdir_("shadow/tool"); /* a directory named like the command: never a hit */
    mkfile("noexec/tool", 0644);
    mkfile("real/tool", 0755);
    link_("../real/tool", "bin/tool");

    /* Found through a symlink on PATH, and resolved to the link's target; the
     * non-executable file and the directory earlier on PATH are skipped. */
    char path_env[4 * PATH_MAX];
    snprintf(path_env, sizeof path_env, "%s:%s:%s:%s", at("nonexistent"), at("shadow"),
             at("noexec"), at("bin"));
    CHECK(corral_resolve_executable("tool", path_env, &out) == 0 && out &&
          strcmp(out, at("real/tool")) == 0);
    free(out);

    /* Control for the skip: the same file, made executable, is found first. */
    CHECK(chmod(at("noexec/tool"), 0755) == 0);
    CHECK(corral_resolve_executable("tool", path_env, &out) == 0 && out &&
          strcmp(out, at("noexec/tool")) == 0);
    free(out);
    CHECK(chmod(at("noexec/tool"), 0644) == 0);

    /* Not on PATH: returned unchanged, for the exec to fail with its own error. */
    CHECK(corral_resolve_executable("corral-no-such-command", path_env, &out) == 0 && out &&
          strcmp(out, "corral-no-such-command") == 0);
    free(out);
    snprintf(path_env, sizeof path_env, "%s", at("noexec"));
    CHECK(corral_resolve_executable("tool", path_env, &out) == 0 && out &&
          strcmp(out, "tool") == 0);
    free(out);

    /* An empty PATH entry is the working directory; a leading, middle or trailing one. */
    char cwd[PATH_MAX];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(at("real")) == 0);
    const char *empties[] = {":/nonexistent", "/nonexistent::/x", "/nonexistent:"};
    for (size_t i = 0; i < sizeof empties / sizeof *empties; i++) {
        CHECK(corral_resolve_executable("tool", empties[i], &out) == 0 && out &&
              strcmp(out, at("real/tool")) == 0);
        free(out);
    }
    /* Control: without the empty entry, the cwd is not searched. */
    CHECK(corral_resolve_executable("tool", "/nonexistent", &out) == 0 && out &&
          strcmp(out, "tool") == 0);
    free(out);
    CHECK(chdir(cwd) == 0);

    /* NULL path_env: the default search path finds sh, fully resolved. */
    CHECK(corral_resolve_executable("sh", NULL, &out) == 0 && out);
    if (out) {
        struct stat st;
        char rp[PATH_MAX];
        CHECK(out[0] == '/' && lstat(out, &st) == 0 && S_ISREG(st.st_mode));
        CHECK(realpath(out, rp) && strcmp(rp, out) == 0);
        free(out);
    }

    /* With a slash: resolved when it exists, unchanged when it does not, ELOOP kept. */
    CHECK(corral_resolve_executable(at("bin/tool"), "/nonexistent", &out) == 0 && out &&
          strcmp(out, at("real/tool")) == 0);
    free(out);
    CHECK(corral_resolve_executable(at("bin/nope"), NULL, &out) == 0 && out &&
          strcmp(out, at("bin/nope")) == 0);
    free(out);
    CHECK(corral_resolve_executable(at("real/tool/x"), NULL, &out) == 0 && out &&
          strcmp(out, at("real/tool/x")) == 0);
    free(out);
    CHECK(corral_resolve_executable("./corral-no-such", NULL, &out) == 0 && out &&
          strcmp(out, "./corral-no-such") == 0);
    free(out);
    out = (char *)1;
    CHECK(corral_resolve_executable(at("la"), NULL, &out) == -ELOOP && out == NULL);
    CHECK(corral_resolve_executable("", NULL, &out) == -EINVAL && out == NULL);
}

/* The one opener of resolved paths: a symlink anywhere on the path is refused, then the
 * resolved path opens (the control, after the attempt); the fd is CLOEXEC. */
static void test_open_no_symlinks(void)
{
    mkdir_("o");
    mkdir_("o/d");
    mkfile("o/d/f", 0644);
    link_("d", "o/ld");
    link_("f", "o/d/lf");
    CHECK(corral_open_no_symlinks(AT_FDCWD, at("o/ld/f"), O_PATH, 0) == -ELOOP);
    CHECK(corral_open_no_symlinks(AT_FDCWD, at("o/d/lf"), O_PATH, 0) == -ELOOP);
    CHECK(corral_open_no_symlinks(AT_FDCWD, at("o/ld"), O_RDONLY | O_DIRECTORY, 0) == -ELOOP);
    int fd = corral_open_no_symlinks(AT_FDCWD, at("o/d/f"), O_PATH, 0);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    if (fd >= 0) close(fd);
    CHECK(corral_open_no_symlinks(AT_FDCWD, at("o/d/f"), O_RDONLY | O_DIRECTORY, 0) == -ENOTDIR);
    fd = corral_open_no_symlinks(AT_FDCWD, at("o/d"), O_RDONLY | O_DIRECTORY, 0);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);

    /* beneath a directory fd: leaving it is refused, a path inside opens */
    int root = open(at("o/d"), O_PATH | O_DIRECTORY | O_CLOEXEC);
    CHECK(root >= 0);
    CHECK(corral_open_no_symlinks(root, "../d/f", O_PATH, CORRAL_OPEN_BENEATH) == -EXDEV);
    CHECK(corral_open_no_symlinks(root, "lf", O_PATH, CORRAL_OPEN_BENEATH) == -ELOOP);
    fd = corral_open_no_symlinks(root, "f", O_PATH, CORRAL_OPEN_BENEATH);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    if (root >= 0) close(root);
}

/* Without openat2 (the control-plane filter answers it ENOSYS, as inside a confinement),
 * CORRAL_OPEN_WALK refuses a symlink as openat2 does, then opens the resolved path; a
 * caller that did not ask for the walk gets ENOSYS. In a child: a filter stays. */
static void test_open_walk(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct corral_bpf prog = {0};
        if (corral_seccomp_tty_program(&prog) < 0 || corral_seccomp_install(&prog) < 0) _exit(100);
        if (syscall(SYS_openat2, AT_FDCWD, "/", NULL, 0) >= 0 || errno != ENOSYS) _exit(101);
        int bad = 0;
        bad += corral_open_no_symlinks(AT_FDCWD, at("o/ld/f"), O_PATH, CORRAL_OPEN_WALK) != -ELOOP;
        bad += corral_open_no_symlinks(AT_FDCWD, at("o/d/lf"), O_PATH, CORRAL_OPEN_WALK) != -ELOOP;
        bad += corral_open_no_symlinks(AT_FDCWD, at("o/d/f"), O_PATH | O_DIRECTORY,
                                       CORRAL_OPEN_WALK) != -ENOTDIR;
        bad += corral_open_no_symlinks(AT_FDCWD, at("o/d/f"), O_PATH, 0) != -ENOSYS;
        int fd = corral_open_no_symlinks(AT_FDCWD, at("o/d/f"), O_PATH, CORRAL_OPEN_WALK);
        struct stat st;
        bad += fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
               !(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        _exit(bad);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) >= 100)
        fprintf(stderr, "  walk: no filter answering openat2 ENOSYS (%d)\n", WEXITSTATUS(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    if (fixture_make("path") < 0) return 1;
    test_walk();
    test_loops();
    test_executable();
    test_open_no_symlinks();
    test_open_walk();
    CHECK(fixture_remove() == 0);
    return DONE();
}
