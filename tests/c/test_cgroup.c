/*
 * Resource cgroups against the real kernel: a pids cap that allows N-1 forks and
 * refuses the next, a memory cap under which 16 MiB succeeds and 128 MiB is OOM-killed,
 * a CPU quota compared with an unlimited cgroup in the same run, kill and destroy with
 * live processes inside, and nothing left behind. A section whose controller this host
 * does not hand to our cgroup prints SKIP instead of passing.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "check.h"

#define MiB (1024ULL * 1024)

static struct corral_cgroup_info info;

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int have(unsigned controllers, const char *what)
{
    if ((info.controllers & controllers) == controllers) return 1;
    printf("SKIP %s: controller not available beneath this process's cgroup\n", what);
    return 0;
}

static int all_paths(const struct corral_cgroup *cg, int (*pred)(const char *))
{
    size_t i = 0;
    for (const char *p; (p = corral_cgroup_path(cg, i, NULL)); i++)
        if (!pred(p)) return 0;
    return i > 0;
}

static int missing(const char *path)
{
    return !is_dir(path);
}

/* Saves the paths so that they can be checked after the object is freed. */
static size_t save_paths(const struct corral_cgroup *cg, char saved[][PATH_MAX])
{
    size_t i = 0;
    for (const char *p; (p = corral_cgroup_path(cg, i, NULL)); i++)
        snprintf(saved[i], PATH_MAX, "%s", p);
    return i;
}

static int contains_pid(const char *dir, pid_t pid)
{
    char path[PATH_MAX + 16], buf[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    for (char *p = buf; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (v == pid) return 1;
        p = end + (*end == '\n');
    }
    return 0;
}

static void test_info(void)
{
    CHECK(corral_cgroup_info(&info) == 0);
    CHECK(info.n > 0);
    CHECK(corral_cgroup_version() == info.version && info.version > 0);
    /* Each reported directory is really this process's cgroup: it lists our pid. */
    for (size_t i = 0; i < info.n; i++) {
        CHECK(is_dir(info.hier[i].dir));
        CHECK(contains_pid(info.hier[i].dir, getpid()));
    }
}

static void test_names(void)
{
    struct corral_cgroup *cg = (void *)1;
    CHECK(corral_cgroup_create("a/b", NULL, &cg) == -EINVAL && cg == NULL);
    CHECK(corral_cgroup_create("..", NULL, &cg) == -EINVAL);
    CHECK(corral_cgroup_create("", NULL, &cg) == -EINVAL);

    char name[64];
    snprintf(name, sizeof name, "corral-%d-named", (int)getpid());
    struct corral_cgroup *first = NULL, *second = (void *)1;
    CHECK(corral_cgroup_create(name, NULL, &first) == 0); /* control */
    CHECK(corral_cgroup_create(name, NULL, &second) == -EEXIST && second == NULL);
    /* The refused second attempt removed nothing of the first. */
    CHECK(all_paths(first, is_dir));
    CHECK(corral_cgroup_destroy(first) == 0);
}

/* A child that waits for a byte on `go`, then runs fn and reports an int on `out`;
 * then waits for the pipe to close. */
static pid_t fork_waiting(int go[2], int out[2], int (*fn)(void))
{
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(go[1]);
        close(out[0]);
        if (read(go[0], &c, 1) != 1) _exit(1);
        int v = fn();
        if (write(out[1], &v, sizeof v) != sizeof v) _exit(1);
        while (read(go[0], &c, 1) > 0) {
        }
        _exit(0);
    }
    close(go[0]);
    close(out[1]);
    return pid;
}

/* Forks sleeping children until fork fails: returns successes * 1000 + errno. */
static int fork_until_refused(void)
{
    int made = 0;
    for (; made < 50; made++) {
        pid_t p = fork();
        if (p == 0) {
            pause();
            _exit(0);
        }
        if (p < 0) return made * 1000 + errno;
    }
    return made * 1000;
}

static void test_pids(void)
{
    if (!have(CORRAL_CG_PIDS, "pids cap")) return;
    const uint64_t cap = 4;
    struct corral_cgroup_limits lim = {.pids = cap};
    struct corral_cgroup *cg = NULL;
    CHECK(corral_cgroup_create(NULL, &lim, &cg) == 0);
    CHECK(corral_cgroup_held(cg) & CORRAL_CG_PIDS);

    int go[2], out[2], result = -1;
    pid_t child = fork_waiting(go, out, fork_until_refused);
    CHECK(child > 0 && corral_cgroup_attach(cg, child) == 0);
    CHECK(write(go[1], "g", 1) == 1 && read(out[0], &result, sizeof result) == sizeof result);
    /* Control: the child itself plus N-1 forks fit; the denial: the next one. */
    CHECK(result / 1000 == (int)cap - 1);
    CHECK(result % 1000 == EAGAIN);

    struct corral_cgroup_usage u;
    CHECK(corral_cgroup_usage(cg, &u) == 0 && (u.have & CORRAL_CG_PIDS) && u.pids_current == cap);

    /* Destroy with every process still alive inside. */
    char saved[CORRAL_CG_MAXHIER][PATH_MAX];
    size_t n = save_paths(cg, saved);
    CHECK(n > 0);
    CHECK(corral_cgroup_destroy(cg) == 0);
    for (size_t i = 0; i < n; i++)
        CHECK(!is_dir(saved[i]));
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
          WTERMSIG(status) == SIGKILL);
    close(go[1]);
    close(out[0]);
}

static int touch(size_t bytes)
{
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    for (size_t i = 0; i < bytes; i += 4096)
        p[i] = 1;
    return 0;
}

/* Forks a child that attaches itself through the pre-opened fds, then touches bytes. */
static int run_touching(struct corral_cgroup *cg, size_t bytes)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (corral_cgroup_attach_self_fds(cg) < 0) _exit(3);
        _exit(touch(bytes));
    }
    int status = -1;
    waitpid(pid, &status, 0);
    return status;
}

static void test_memory(void)
{
    if (!have(CORRAL_CG_MEMORY, "memory cap")) return;
    struct corral_cgroup_limits lim = {.memory_bytes = 32 * MiB};
    struct corral_cgroup *cg = NULL;
    CHECK(corral_cgroup_create(NULL, &lim, &cg) == 0);
    CHECK(corral_cgroup_held(cg) & CORRAL_CG_MEMORY);
    /* No swap on this host, but swap accounting exists: the cap covers it. */
    if (!(corral_cgroup_held(cg) & CORRAL_CG_MEMSW)) NOTE("swap not capped here\n");

    struct corral_cgroup_usage before, after;
    CHECK(corral_cgroup_usage(cg, &before) == 0 && (before.have & CORRAL_CG_MEMORY));
    CHECK(before.oom_kills == 0);

    int status = run_touching(cg, 16 * MiB); /* control */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    status = run_touching(cg, 128 * MiB);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    CHECK(corral_cgroup_usage(cg, &after) == 0);
    CHECK(after.oom_kills >= 1);
    CHECK(after.memory_peak >= 16 * MiB && after.memory_peak <= 32 * MiB);
    CHECK(corral_cgroup_destroy(cg) == 0);
}

static long elapsed_ms(clockid_t clock, const struct timespec *start)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Spins until it has used 150 ms of CPU, or 600 ms of wall time have passed: on a busy
 * host the unlimited control still reaches its CPU target, just later. */
static int spin(void)
{
    struct timespec wall, cpu;
    clock_gettime(CLOCK_MONOTONIC, &wall);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    while (elapsed_ms(CLOCK_PROCESS_CPUTIME_ID, &cpu) < 150 &&
           elapsed_ms(CLOCK_MONOTONIC, &wall) < 600) {
    }
    return 0;
}

static uint64_t cpu_used(const struct corral_cgroup_limits *lim)
{
    struct corral_cgroup *cg = NULL;
    struct corral_cgroup_usage u = {0};
    if (corral_cgroup_create(NULL, lim, &cg) < 0) return UINT64_MAX;
    int go[2], out[2], v;
    pid_t child = fork_waiting(go, out, spin);
    if (child > 0 && corral_cgroup_attach(cg, child) == 0 && write(go[1], "g", 1) == 1 &&
        read(out[0], &v, sizeof v) == sizeof v)
        corral_cgroup_usage(cg, &u);
    close(go[1]);
    close(out[0]);
    waitpid(child, NULL, 0);
    CHECK(!lim->cpu_quota_us || (corral_cgroup_held(cg) & CORRAL_CG_CPU));
    CHECK(corral_cgroup_destroy(cg) == 0);
    return u.have & CORRAL_CG_CPUACCT ? u.cpu_ns : UINT64_MAX;
}

static void test_cpu(void)
{
    if (!have(CORRAL_CG_CPU | CORRAL_CG_CPUACCT, "cpu quota")) return;
    /* Control: unlimited, the child reaches 150 ms of CPU; at a 10% quota it gets about
     * 60 ms in its 600 ms. */
    struct corral_cgroup_limits none = {0},
                                tenth = {.cpu_quota_us = 10000, .cpu_period_us = 100000};
    uint64_t free_ns = cpu_used(&none), capped_ns = cpu_used(&tenth);
    NOTE("cpu used: unlimited %llu ms, 10%% quota %llu ms\n",
         (unsigned long long)(free_ns / 1000000), (unsigned long long)(capped_ns / 1000000));
    CHECK(free_ns != UINT64_MAX && free_ns >= 140000000ULL);
    CHECK(capped_ns != UINT64_MAX && capped_ns <= 100000000ULL);
}

static void test_kill_and_remove(void)
{
    struct corral_cgroup *cg = NULL;
    CHECK(corral_cgroup_create(NULL, NULL, &cg) == 0);
    CHECK(corral_cgroup_kill(cg) == 0); /* empty: nothing to do */

    int go[2], out[2];
    pid_t child = fork_waiting(go, out, fork_until_refused);
    CHECK(child > 0 && corral_cgroup_attach(cg, child) == 0);
    for (size_t i = 0; corral_cgroup_path(cg, i, NULL); i++)
        CHECK(contains_pid(corral_cgroup_path(cg, i, NULL), child));
    CHECK(corral_cgroup_kill(cg) == 0);
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
          WTERMSIG(status) == SIGKILL);
    close(go[1]);
    close(out[0]);
    CHECK(all_paths(cg, is_dir)); /* kill leaves the directories */

    char saved[CORRAL_CG_MAXHIER][PATH_MAX];
    size_t n = save_paths(cg, saved);
    CHECK(corral_cgroup_remove(cg) == 0);
    CHECK(corral_cgroup_remove(cg) == 0); /* idempotent */
    for (size_t i = 0; i < n; i++)
        CHECK(missing(saved[i]));
    corral_cgroup_free(cg);
    CHECK(corral_cgroup_destroy(NULL) == 0);

    /* A process cannot kill the cgroup it is in. */
    CHECK(corral_cgroup_create(NULL, NULL, &cg) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = corral_cgroup_attach_self_fds(cg) == 0 && corral_cgroup_kill(cg) == -EDEADLK;
        _exit(ok ? 0 : 1);
    }
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(corral_cgroup_destroy(cg) == 0);
}

static void test_nothing_left(void)
{
    char prefix[32];
    int leftovers = 0;
    snprintf(prefix, sizeof prefix, "corral-%d-", (int)getpid());
    for (size_t i = 0; i < info.n; i++) {
        DIR *d = opendir(info.hier[i].dir);
        CHECK(d != NULL);
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d));) {
            if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
                fprintf(stderr, "left behind: %s/%s\n", info.hier[i].dir, e->d_name);
                leftovers++;
            }
        }
        closedir(d);
    }
    CHECK(leftovers == 0);
}

int main(void)
{
    test_info();
    test_names();
    test_pids();
    test_memory();
    test_cpu();
    test_kill_and_remove();
    test_nothing_left();
    return DONE();
}
