/*
 * The fuzz targets' corpora replayed on every `make test`, not only under `make fuzz`
 * (which needs clang and libFuzzer): each file of tests/fuzz/corpus/<target>/ (seeds,
 * and every input that once crashed a target, kept as its regression test) goes
 * through the target's own entry point with the target's own checks, in a child of its
 * own so that a crash, a failed check (a trap or an abort) or a hang names the input
 * instead of ending the run. The Makefile links each C target in with its entry point
 * renamed fuzz_<target>_one, and tests/fuzz/fuzz_lua.c for the Lua targets
 * (tests/fuzz/lua/<target>.lua); it builds all of it under ASan and UBSan where the
 * compiler has them, so that a sanitizer's report fails the replay too.
 *
 * The control: an input that traps a target made to trap on it (and a Lua target that
 * does not exist) must be reported as a failure by the same replay, and an input that
 * does not, as a pass. Run from the repository's root (scripts/run-tests does).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define CORPUS "tests/fuzz/corpus/"
#define INPUT_MAX (1 << 20)
#define HANG_SECONDS 20

int fuzz_sni_one(const uint8_t *d, size_t n);
int fuzz_dns_one(const uint8_t *d, size_t n);
int fuzz_session_wire_one(const uint8_t *d, size_t n);
int fuzz_http1_one(const uint8_t *d, size_t n);
int fuzz_h2_one(const uint8_t *d, size_t n);
int corral_fuzz_lua(const char *target, const uint8_t *data, size_t size);
void corral_fuzz_lua_load(const char *target);

typedef int (*target_fn)(const uint8_t *, size_t);

/* Under ASan: the Lua targets' states live until exit (each child ends with _exit), and
 * LeakSanitizer's exit scan needs ptrace, which a container may refuse. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}

static const struct {
    const char *name;
    target_fn fn; /* NULL: a Lua target */
    int min;      /* inputs committed: an empty or missing corpus is a failure */
} targets[] = {
    {"sni", fuzz_sni_one, 9},
    {"dns", fuzz_dns_one, 30},
    {"session_wire", fuzz_session_wire_one, 10},
    {"http1", fuzz_http1_one, 10},
    {"h2", fuzz_h2_one, 2},
    {"control", NULL, 4},
    {"session", NULL, 4},
    {"runtime", NULL, 7},
    {"receipt", NULL, 6},
    {"allow_file", NULL, 3},
    {"learn", NULL, 2},
};

#define FILES_MAX 4096

/* One input's bytes into buf: their count, or -1. */
static ssize_t load(const char *path, uint8_t *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, cap);
    close(fd);
    return n;
}

/*
 * Runs the target (fn, or the Lua target lua) on paths[from..n) one after another in a
 * child (one fork for them all: a fork of a sanitized process costs ~20 ms), which
 * says each input's index on a pipe before it starts. Returns n when every check held,
 * else the index of the input the child died on (crash, failed check, sanitizer report,
 * or a hang: SIGALRM).
 */
static size_t replay_from(target_fn fn, const char *lua, char *const *paths, size_t from, size_t n)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return from;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return from;
    if (pid == 0) {
        static uint8_t buf[INPUT_MAX];
        close(p[0]);
        for (size_t i = from; i < n; i++) {
            if (write(p[1], &i, sizeof i) != sizeof i) _exit(1);
            ssize_t len = load(paths[i], buf, sizeof buf);
            if (len < 0) _exit(1);
            alarm(HANG_SECONDS); /* a hang is a finding too */
            if (fn)
                fn(buf, (size_t)len);
            else
                corral_fuzz_lua(lua, buf, (size_t)len);
        }
        _exit(0);
    }
    close(p[1]);
    size_t at = from, i;
    while (read(p[0], &i, sizeof i) == sizeof i)
        at = i;
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? n : at;
}

/* One input alone: 1 when its checks held, else 0. */
static int replay_one(target_fn fn, const char *lua, const char *path)
{
    char *paths[] = {(char *)path};
    return replay_from(fn, lua, paths, 0, 1) == 1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays every regular file of CORPUS<name>, each failing one named (the replay goes
 * on past it); returns how many there were. */
static int replay(const char *name, target_fn fn)
{
    static char *paths[FILES_MAX];
    char dir[256], path[512];
    snprintf(dir, sizeof dir, CORPUS "%s", name);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "FAIL %s: %s (run from the repository's root)\n", dir, strerror(errno));
        return 0;
    }
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < FILES_MAX) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
        paths[n++] = strdup(path);
    }
    closedir(d);
    qsort(paths, n, sizeof paths[0], by_name);
    if (!fn) corral_fuzz_lua_load(name);
    size_t failed = 0;
    for (size_t at = 0; (at = replay_from(fn, name, paths, at, n)) < n; at++) {
        fprintf(stderr, "FAIL %s: the target crashed or its checks did not hold\n", paths[at]);
        failed++;
    }
    check_passed += (int)(n - failed);
    check_failed += (int)failed;
    for (size_t i = 0; i < n; i++)
        free(paths[i]);
    return (int)n;
}

/* The control's target: traps on an input that starts with "trap", as a broken check
 * does. */
static int trap_on_trap(const uint8_t *d, size_t n)
{
    if (n >= 4 && memcmp(d, "trap", 4) == 0) __builtin_trap();
    return 0;
}

static void test_replay_detects_a_crash(void)
{
    char dir[] = "/tmp/corral-fuzz-control-XXXXXX", trap[64], fine[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(trap, sizeof trap, "%s/trap", dir);
    snprintf(fine, sizeof fine, "%s/fine", dir);
    FILE *f = fopen(trap, "w");
    if (f) fputs("trap here", f), fclose(f);
    f = fopen(fine, "w");
    if (f) fputs("nothing to see", f), fclose(f);
    CHECK(replay_one(trap_on_trap, NULL, trap) == 0);
    CHECK(replay_one(trap_on_trap, NULL, fine) == 1); /* the control: same replay, no trap */
    int saved = dup(2), null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    dup2(null, 2); /* its "did not load" is expected here, not news in the test's output */
    CHECK(replay_one(NULL, "no_such_target", fine) == 0);
    dup2(saved, 2);
    close(saved), close(null);
    unlink(trap), unlink(fine), rmdir(dir);
}

int main(void)
{
    test_replay_detects_a_crash();
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        int n = replay(targets[i].name, targets[i].fn);
        NOTE("replayed %d %s corpus inputs\n", n, targets[i].name);
        if (n < targets[i].min)
            fprintf(stderr, "FAIL %s: %d corpus inputs, %d committed\n", targets[i].name, n,
                    targets[i].min);
        CHECK(n >= targets[i].min);
    }
    return DONE();
}
