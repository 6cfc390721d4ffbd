/*
 * Tenant spawn (see spawn.h). Ownership order (docs/architecture.md, invariant 4): a
 * pre-made netns is joined by the *parent's* thread before clone3 creates the user
 * namespace, because joining needs CAP_SYS_ADMIN over the netns's owner (the host), which
 * the tenant's new user namespace never has. Root in that user namespace then gets EPERM
 * from `nft flush ruleset` and from SO_MARK. A netns owned by a user namespace of an
 * unprivileged caller's own is joined from inside that owner, and the tenant's user
 * namespace made beneath it (clone_under_owner): the same order, one level down.
 *
 * The child never allocates: the parent may be multi-threaded, so everything it needs
 * (seccomp program, empty capability state, strings) is prepared before clone3.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <linux/securebits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "caps.h"
#include "mountapi.h"
#include "ns.h"
#include "reaper.h"
#include "spawn.h"
#include "spawn_join.h"
#include "util.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

enum step {
    STEP_SYNC,
    STEP_JOIN,
    STEP_ATTACH,
    STEP_CGROUPNS,
    STEP_IDS,
    STEP_ROOT,
    STEP_HOSTNAME,
    STEP_LOOPBACK,
    STEP_CWD,
    STEP_RLIMIT,
    STEP_SETSID,
    STEP_STDIO,
    STEP_FDS,
    STEP_CAPS,
    STEP_NNP,
    STEP_SECCOMP,
    STEP_FORK,
    STEP_EXEC,
    STEP_COUNT
};

static const char *const step_names[STEP_COUNT] = {
    [STEP_SYNC] = "wait for parent",
    [STEP_JOIN] = "join sandbox",
    [STEP_ATTACH] = "attach detached mounts",
    [STEP_CGROUPNS] = "cgroup namespace",
    [STEP_IDS] = "set ids",
    [STEP_ROOT] = "build root",
    [STEP_HOSTNAME] = "hostname",
    [STEP_LOOPBACK] = "loopback up",
    [STEP_CWD] = "chdir",
    [STEP_RLIMIT] = "rlimits",
    [STEP_SETSID] = "setsid",
    [STEP_STDIO] = "stdio",
    [STEP_FDS] = "close fds",
    [STEP_CAPS] = "drop capabilities",
    [STEP_NNP] = "no_new_privs",
    [STEP_SECCOMP] = "seccomp",
    [STEP_FORK] = "fork tenant",
    [STEP_EXEC] = "exec",
};

struct report {
    int32_t step;
    int32_t err;
};

CORRAL_OWN_STACK __attribute__((noreturn)) static void child_fail(int fd, enum step step, int err)
{
    struct report r = {step, err < 0 ? -err : err};
    ssize_t n = write(fd, &r, sizeof r);
    (void)n;
    _exit(CORRAL_SPAWN_EXEC_FAILED);
}

/* The tenant itself (pid 2): a process group of its own (a job, which the init signals
 * as a terminal does), the signal mask restored, and exec. */
CORRAL_OWN_STACK __attribute__((noreturn)) static void
tenant_exec(const struct corral_spawn_plan *p, int fd, const sigset_t *old)
{
    setpgid(0, 0);
    if (p->ctty) {
        /* A background group asking for the terminal is stopped by SIGTTOU unless it
         * blocks it; the command then reads the terminal as its foreground job. */
        sigset_t ttou;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        sigprocmask(SIG_BLOCK, &ttou, NULL);
        if (tcsetpgrp(0, getpid()) < 0) child_fail(fd, STEP_SETSID, errno);
    }
    sigprocmask(SIG_SETMASK, old, NULL);
    execve(p->path, p->argv, p->envp);
    child_fail(fd, STEP_EXEC, errno);
}

/* What the tenant's clone shares with the init until its exec (CLONE_VM). */
struct tenant_start {
    const struct corral_spawn_plan *p;
    int fd; /* the exec pipe's write end */
    const sigset_t *old;
};

CORRAL_OWN_STACK static int tenant_start(void *arg)
{
    struct tenant_start *t = arg;
    tenant_exec(t->p, t->fd, t->old);
}

/* Stays as the init of the pid namespace: starts the command (pid 2), passes a failed exec
 * up to the spawner, then reaps and forwards signals until the command exits. The command
 * shares the init's memory until its exec (CLONE_VM | CLONE_VFORK, as posix_spawn does):
 * the init is itself a copy of the host, and a fork would copy the host's page tables a
 * second time only for the exec to drop them. */
CORRAL_OWN_STACK __attribute__((noreturn)) static void init_run(const struct corral_spawn_plan *p,
                                                                int errfd)
{
    static char stack[64 * 1024] __attribute__((aligned(16)));
    sigset_t mask, old;
    corral_reaper_block(&mask, &old);
    int execp[2];
    if (pipe2(execp, O_CLOEXEC) < 0) child_fail(errfd, STEP_FORK, errno);
    struct tenant_start t = {.p = p, .fd = execp[1], .old = &old};
    pid_t tenant = clone(tenant_start, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &t);
    if (tenant < 0) child_fail(errfd, STEP_FORK, errno);
    close(execp[1]);
    /* Made from both sides, so the group exists before any signal is forwarded to it;
     * after the tenant's exec this one fails (EACCES), harmlessly. */
    setpgid(tenant, tenant);
    /* EOF means the tenant's exec succeeded (the pipe closed on exec); a report means
     * it failed, and is forwarded to the spawner so the failure is the spawn's. */
    struct report rep;
    ssize_t n;
    do
        n = read(execp[0], &rep, sizeof rep);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof rep) {
        ssize_t w = write(errfd, &rep, sizeof rep);
        (void)w;
        _exit(CORRAL_SPAWN_EXEC_FAILED);
    }
    /* The tenant has exec'd: nothing the host handed down (netns fds, listeners, the
     * event loop's fds — copies from the fork) stays open in the init it shares a
     * user namespace with. */
    close(execp[0]);
    close(errfd);
    syscall(SYS_close_range, 3, ~0U, 0);
    _exit(corral_reaper_wait_job(tenant, &mask));
}

/* What the joined command's clone shares with the process that made it (CLONE_VM). */
struct joined {
    const struct corral_spawn_plan *p;
    const sigset_t *old;
    volatile int exec_errno; /* set by the command when its exec failed */
};

/* The joined command (no terminal): a group of its own, as tenant_exec's, but a failed
 * exec is left in shared memory for the set-up process to report (the command is the
 * spawner's child, which reaps it). */
CORRAL_OWN_STACK static int joined_exec(void *arg)
{
    struct joined *j = arg;
    const struct corral_spawn_plan *p = j->p;
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, j->old, NULL);
    execve(p->path, p->argv, p->envp);
    j->exec_errno = errno;
    _exit(CORRAL_SPAWN_EXEC_FAILED);
}

/* A command joined into a running sandbox needs no init of its own: the set-up process
 * (in the sandbox's namespaces, its protections applied) makes it a child of the spawner
 * (CLONE_PARENT) in the sandbox's pid namespace, sharing memory until its exec
 * (CLONE_VM | CLONE_VFORK, as posix_spawn does: no copy of the host's pages), reports its
 * pid, and exits. The spawner then holds the command itself: its status, its group for
 * the terminal's signals. No process of the host's memory outlives the exec. */
CORRAL_OWN_STACK __attribute__((noreturn)) static void join_run(const struct corral_spawn_plan *p,
                                                                int errfd)
{
    static char stack[64 * 1024] __attribute__((aligned(16)));
    sigset_t mask, old;
    corral_reaper_block(&mask, &old);
    struct joined j = {.p = p, .old = &old, .exec_errno = 0};
    pid_t pid = clone(joined_exec, stack + sizeof stack, CLONE_VM | CLONE_VFORK | CLONE_PARENT, &j);
    if (pid < 0) child_fail(errfd, STEP_FORK, errno);
    struct report r = {STEP_COUNT, (int32_t)pid}; /* the command's pid, for the spawner */
    if (write(errfd, &r, sizeof r) != (ssize_t)sizeof r) _exit(CORRAL_SPAWN_EXEC_FAILED);
    if (j.exec_errno) child_fail(errfd, STEP_EXEC, j.exec_errno);
    _exit(0);
}

/*
 * The init is a fork of the host, so /proc/1/cmdline and environ inside would show the
 * host's command line (--resolve tables, host paths) and environment. Both are this
 * child's copy-on-write pages: blank them and leave a name. Bounds come from
 * /proc/self/stat (fields 48-51); only syscalls and stack memory, as a child of a
 * threaded parent needs.
 */
static void hide_host_arguments(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    if (!p) return;
    unsigned long long v[52] = {0};
    int field = 2; /* the name was field 2; what follows ") " is field 3 */
    for (p++; *p && field < 51;) {
        while (*p == ' ')
            p++;
        field++;
        unsigned long long x = 0;
        while (*p >= '0' && *p <= '9')
            x = x * 10 + (unsigned long long)(*p++ - '0');
        while (*p && *p != ' ')
            p++;
        v[field] = x;
    }
    if (field < 51) return;
    for (int f = 48; f <= 50; f += 2)
        if (v[f] && v[f + 1] > v[f] && v[f + 1] - v[f] < (1ULL << 24))
            memset((void *)(uintptr_t)v[f], 0, (size_t)(v[f + 1] - v[f]));
    static const char name[] = "corral-init";
    if (v[48] && v[49] - v[48] > sizeof name) memcpy((void *)(uintptr_t)v[48], name, sizeof name);
}

/* The hex mask after `key` in /proc/self/status's text, or all ones when it is absent. */
static uint64_t status_mask(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    if (!p) return ~UINT64_C(0);
    p += strlen(key);
    uint64_t v = 0;
    int digits = 0;
    for (; digits < 16; p++, digits++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0) break;
        v = v << 4 | (uint64_t)d;
    }
    return digits == 16 ? v : ~UINT64_C(0);
}

/* The signals whose disposition is not the default (caught or ignored, bit sig - 1), from
 * one read of /proc/self/status rather than a sigaction call for each of the ~62; all of
 * them when it cannot be read. Only syscalls and stack memory. */
uint64_t corral_signals_set_aside(void)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ~UINT64_C(0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return ~UINT64_C(0);
    buf[n] = '\0';
    return status_mask(buf, "\nSigIgn:\t") | status_mask(buf, "\nSigCgt:\t");
}

/* Brings up lo in the fresh, otherwise empty network namespace: the tenant may talk to
 * itself on 127.0.0.1, as under bwrap, and still reaches nothing else. ioctls only: no
 * allocation in this child. */
static int loopback_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    r = r < 0 ? -errno : 0;
    close(s);
    return r;
}

static int parent_gone(int parent_pidfd)
{
    struct pollfd pf = {.fd = parent_pidfd, .events = POLLIN};
    return parent_pidfd >= 0 && poll(&pf, 1, 0) > 0;
}

/* Changing ids clears the parent-death signal (prctl(2)): arm it again, then make sure
 * the parent did not die in between (it may live outside our pid namespace, where
 * getppid() reads 0: its pidfd, opened before clone3, is readable once it has exited).
 * Without this, `kill -9` of `corral run` leaves the tenant running. */
static void rearm_death_signal(int parent_pidfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (parent_gone(parent_pidfd)) _exit(CORRAL_SPAWN_EXEC_FAILED);
}

static void apply_rlimits(const struct corral_spawn_plan *p, int errfd)
{
    for (size_t i = 0; i < p->n_rlimits; i++) {
        struct rlimit rl = {p->rlimits[i].cur, p->rlimits[i].max};
        if (setrlimit(p->rlimits[i].resource, &rl) < 0) child_fail(errfd, STEP_RLIMIT, errno);
    }
}

#define KEEP_MAX 64

/* Closes every fd from 3 up but errfd and the caller's keep_fds. The caller's other fds
 * would otherwise stay open in this child until exec (CLOEXEC alone), and with a low
 * RLIMIT_NOFILE already set, the init's own pipe then fails with EMFILE when they hold
 * every number beneath the limit. No allocation here: more fds to keep than KEEP_MAX are
 * left to CLOEXEC instead. */
static int close_all_but(const struct corral_spawn_plan *p, int errfd)
{
    int keep[KEEP_MAX + 1];
    size_t n = 0;
    if (p->n_keep_fds >= KEEP_MAX) return 0;
    keep[n++] = errfd;
    for (size_t i = 0; i < p->n_keep_fds; i++)
        keep[n++] = p->keep_fds[i];
    for (size_t i = 1; i < n; i++) /* insertion sort: a handful of fds */
        for (size_t j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
            int t = keep[j];
            keep[j] = keep[j - 1];
            keep[j - 1] = t;
        }
    unsigned from = 3;
    for (size_t i = 0; i < n; i++) {
        if (keep[i] < (int)from) continue;
        if ((unsigned)keep[i] > from &&
            syscall(SYS_close_range, from, (unsigned)keep[i] - 1, 0) < 0)
            return -errno;
        from = (unsigned)keep[i] + 1;
    }
    return syscall(SYS_close_range, from, ~0U, 0) < 0 ? -errno : 0;
}

/* stdio as the plan says, and everything beyond 0-2 closed but for the fds the caller
 * keeps (and errfd, closed at exec). */
static void set_stdio_and_fds(const struct corral_spawn_plan *p, int errfd)
{
    for (int i = 0; i < 3; i++)
        if (p->stdio[i] >= 0 && dup2(p->stdio[i], i) < 0) child_fail(errfd, STEP_STDIO, errno);
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        child_fail(errfd, STEP_FDS, errno);
    int r = close_all_but(p, errfd);
    if (r < 0) child_fail(errfd, STEP_FDS, -r);
    for (size_t i = 0; i < p->n_keep_fds; i++)
        if (fcntl(p->keep_fds[i], F_SETFD, 0) < 0) child_fail(errfd, STEP_FDS, errno);
}

/* CAP_NET_ADMIN kept across execve as an ambient capability (raised in the inheritable
 * set first, as the kernel requires). Raw syscalls: nothing allocates in this child. */
static int keep_net_admin(void)
{
    struct __user_cap_header_struct hd = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
    if (syscall(SYS_capget, &hd, d) < 0) return -errno;
    d[CAP_TO_INDEX(CAP_NET_ADMIN)].inheritable |= CAP_TO_MASK(CAP_NET_ADMIN);
    if (syscall(SYS_capset, &hd, d) < 0) return -errno;
    return prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0) < 0 ? -errno : 0;
}

/* The plain variant: the helper builds its own sandbox; we only join the host-made netns
 * (still privileged here, so the helper's later user namespace owns nothing in it), apply
 * the rlimits, take the unprivileged ids when asked, set stdio, close what must not be
 * inherited, and exec. A netns owned by a user namespace of the caller's own
 * (corral_ns_new_net_in_userns) is joined from inside that user namespace (owner_fd), so
 * the helper's user namespace is made beneath it and holds nothing over the netns. */
CORRAL_OWN_STACK __attribute__((noreturn)) static void
plain_exec(const struct corral_spawn_plan *p, int errfd, int parent_pidfd, int owner_fd)
{
    if (owner_fd >= 0 && setns(owner_fd, CLONE_NEWUSER) < 0) child_fail(errfd, STEP_JOIN, errno);
    if (p->netns_fd >= 0 && setns(p->netns_fd, CLONE_NEWNET) < 0)
        child_fail(errfd, STEP_JOIN, errno);
    if (p->n_attach) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            child_fail(errfd, STEP_ATTACH, errno);
        for (size_t i = 0; i < p->n_attach; i++)
            if (syscall(SYS_move_mount, p->attach[i].fd, "", AT_FDCWD, p->attach[i].path,
                        MOVE_MOUNT_F_EMPTY_PATH) < 0)
                child_fail(errfd, STEP_ATTACH, errno);
    }
    int r;
    if (owner_fd >= 0 && p->plain_net_admin && (r = keep_net_admin()) < 0)
        child_fail(errfd, STEP_CAPS, r);
    apply_rlimits(p, errfd);
    if (p->plain_ids) {
        if (setgroups(0, NULL) < 0 ||
            setresgid(p->outside_gid, p->outside_gid, p->outside_gid) < 0 ||
            setresuid(p->outside_uid, p->outside_uid, p->outside_uid) < 0)
            child_fail(errfd, STEP_IDS, errno);
        /* A `kill -9` of `corral run` may land before bwrap's own --die-with-parent. */
        rearm_death_signal(parent_pidfd);
    }
    if (p->cwd && chdir(p->cwd) < 0) child_fail(errfd, STEP_CWD, errno);
    if (p->plain_session && setsid() < 0) child_fail(errfd, STEP_SETSID, errno);
    set_stdio_and_fds(p, errfd);
    if (p->plain_pidns) init_run(p, errfd);
    execve(p->path, p->argv, p->envp);
    child_fail(errfd, STEP_EXEC, errno);
}

CORRAL_OWN_STACK __attribute__((noreturn)) static void child_main(const struct corral_spawn_plan *p,
                                                                  int errfd, int syncfd,
                                                                  void *empty_caps,
                                                                  int parent_pidfd, int owner_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_NAME, "corral-init", 0, 0, 0);
    /* The tenant starts with no signal blocked and every handler at its default, whatever
     * the host had: `corral run` blocks SIGTERM to forward it, and a tenant inheriting
     * the block would ignore the forwarded signal. Only the signals the host catches or
     * ignores are reset (every one when that cannot be read). */
    uint64_t set_aside = corral_signals_set_aside();
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        if (sig <= 64 && !(set_aside & (UINT64_C(1) << (sig - 1)))) continue;
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigaction(sig, &dfl, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    char c;
    if (read(syncfd, &c, 1) != 1) child_fail(errfd, STEP_SYNC, EPIPE);
    close(syncfd);
    hide_host_arguments();
    if (p->plain) plain_exec(p, errfd, parent_pidfd, owner_fd);
    int join = p->join_pidfd >= 0;
    if (join) {
        /* One call enters every namespace of the running sandbox (the user namespace
         * first, so the rest are entered with its capabilities); the fork below then
         * lands the command in its pid namespace. */
        if (setns(p->join_pidfd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC |
                                     CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWCGROUP) < 0)
            child_fail(errfd, STEP_JOIN, errno);
    } else if (unshare(CLONE_NEWCGROUP) < 0) {
        /* The parent has placed us in the sandbox's cgroup: a cgroup namespace made now
         * is rooted there, so the tenant sees its own cgroup as "/". */
        child_fail(errfd, STEP_CGROUPNS, errno);
    }
    /* setgroups is refused (EPERM) in a user namespace mapped by an unprivileged
     * caller, who had to write "deny" to setgroups first; there are no groups to drop. */
    if (setresgid(0, 0, 0) < 0 || (setgroups(0, NULL) < 0 && errno != EPERM) ||
        setresuid(0, 0, 0) < 0)
        child_fail(errfd, STEP_IDS, errno);
    rearm_death_signal(parent_pidfd);
    if (parent_pidfd >= 0) close(parent_pidfd);
    const char *what = NULL;
    int r = join ? 0 : corral_root_build(&p->root, &what);
    if (r < 0) child_fail(errfd, STEP_ROOT, r);
    if (!join && p->hostname && sethostname(p->hostname, strlen(p->hostname)) < 0)
        child_fail(errfd, STEP_HOSTNAME, errno);
    if (!join && p->new_net && p->netns_fd < 0 && (r = loopback_up()) < 0)
        child_fail(errfd, STEP_LOOPBACK, r);
    if (chdir(p->cwd ? p->cwd : "/") < 0) child_fail(errfd, STEP_CWD, errno);
    apply_rlimits(p, errfd);
    /* A new session: no controlling terminal to inject keystrokes into. */
    if (setsid() < 0) child_fail(errfd, STEP_SETSID, errno);
    set_stdio_and_fds(p, errfd);
    if (p->ctty && ioctl(0, TIOCSCTTY, 0) < 0) child_fail(errfd, STEP_SETSID, errno);
    if ((r = corral_caps_drop_all_with(empty_caps)) < 0) child_fail(errfd, STEP_CAPS, r);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(errfd, STEP_NNP, errno);
    if (p->seccomp && (r = corral_seccomp_install(p->seccomp)) < 0)
        child_fail(errfd, STEP_SECCOMP, r);

    /* A terminal's command stays beneath the process that made the terminal its session's:
     * a session leader's exit hangs up its terminal's foreground job. */
    if (join && !p->ctty) join_run(p, errfd);
    init_run(p, errfd);
}

static int write_pid(int fd, pid_t pid)
{
    char buf[24];
    int len = snprintf(buf, sizeof buf, "%d\n", (int)pid);
    if (write(fd, buf, (size_t)len) != len) return -errno;
    return 0;
}

/* The release step's name when the child had already ended: how it ended, once reaped
 * here (*pid is then -1; a static buffer: spawns are made from one thread, the caller's). */
static const char *died_before_release(pid_t *pid)
{
    static char why[96];
    int ws = 0;
    if (waitpid(*pid, &ws, 0) != *pid) return "release child";
    *pid = -1;
    if (WIFSIGNALED(ws))
        snprintf(why, sizeof why, "release child (it was killed by signal %d first)", WTERMSIG(ws));
    else
        snprintf(why, sizeof why, "release child (it exited with status %d first)",
                 WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    return why;
}

/*
 * clone3 from this thread, in netns_fd when given: not on a corral_ns_run_in thread,
 * because the child's PDEATHSIG follows the thread that cloned it and would fire when
 * that thread ends. A thread that cannot get back to its own netns would carry the
 * host's work into a sandbox, so that is fatal. owner_uid/gid
 * (when not -1) are held as effective ids for the clone alone, so the new user namespace
 * is owned by the sandbox's unprivileged host id: the kernel charges per-user counts
 * (inotify instances, …) to the owner, and a root-owned tenant holding 128 inotify
 * instances leaves every root process on the host without. Raw syscalls: credentials are
 * per thread, and glibc's wrappers would change every thread of the host process.
 *
 * The effective capabilities stay up while the ids are the owner's (SECBIT_NO_SETUID_FIXUP
 * for the clone alone): a host SIGKILLed in this window dies holding the owner's ids, and
 * the parent-death SIGKILL it then sends each of its other sandboxes' inits is checked as
 * a signal from that user; without CAP_KILL it is refused, and those inits and their
 * tenants outlive it (`corral conformance --only cross_sandbox` killed at random: one
 * run in ~10 left one). The child puts the bits back before anything else.
 */
static pid_t clone_in_netns(struct clone_args *ca, int netns_fd, long owner_uid, long owner_gid,
                            int *err)
{
    int saved = -1;
    if (netns_fd >= 0) {
        saved = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        if (saved < 0 || setns(netns_fd, CLONE_NEWNET) < 0) {
            *err = errno;
            if (saved >= 0) close(saved);
            return -1;
        }
    }
    int switched = 0;
    long bits = -1;
    if (owner_uid >= 0 && owner_gid >= 0) {
        bits = syscall(SYS_prctl, PR_GET_SECUREBITS, 0, 0, 0, 0);
        if (bits < 0 ||
            syscall(SYS_prctl, PR_SET_SECUREBITS, bits | SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0 ||
            syscall(SYS_setresgid, -1, (gid_t)owner_gid, -1) < 0 ||
            syscall(SYS_setresuid, -1, (uid_t)owner_uid, -1) < 0) {
            *err = errno;
            syscall(SYS_setresgid, -1, 0, -1);
            if (bits >= 0) syscall(SYS_prctl, PR_SET_SECUREBITS, bits, 0, 0, 0);
            if (saved >= 0) {
                if (setns(saved, CLONE_NEWNET) < 0) abort();
                close(saved);
            }
            return -1;
        }
        switched = 1;
    }
    pid_t pid = (pid_t)syscall(SYS_clone3, ca, sizeof *ca);
    *err = errno;
    /* the child holds every capability of its new user namespace, CAP_SETPCAP among them */
    if (pid == 0) {
        if (switched && syscall(SYS_prctl, PR_SET_SECUREBITS, bits, 0, 0, 0) < 0) _exit(127);
        return 0;
    }
    /* The saved uid is still 0, so root comes back before anything else runs on this
     * thread, then the bits as they were. */
    if (switched &&
        (syscall(SYS_setresuid, -1, 0, -1) < 0 || syscall(SYS_setresgid, -1, 0, -1) < 0 ||
         syscall(SYS_prctl, PR_SET_SECUREBITS, bits, 0, 0, 0) < 0))
        abort();
    if (saved >= 0) {
        if (setns(saved, CLONE_NEWNET) < 0) abort();
        close(saved);
    }
    return pid;
}

/* What the child of clone_under_owner needs: the clone, the namespaces to enter first,
 * the tenant's maps, and child_main's arguments for the process it makes. */
struct owner_clone {
    struct clone_args *ca;
    int owner_fd, netns_fd;
    struct corral_id_map uid, gid;
    const struct corral_spawn_plan *p;
    int errfd_read, errfd, syncfd, syncfd_write, parent_pidfd;
    void *empty_caps;
    pid_t pid;
    int err;
    const char *failed; /* the step err belongs to */
};

CORRAL_OWN_STACK static int owner_clone_run(void *arg)
{
    struct owner_clone *o = arg;
    o->pid = -1;
    o->failed = "join netns";
    if (setns(o->owner_fd, CLONE_NEWUSER) < 0 || setns(o->netns_fd, CLONE_NEWNET) < 0) {
        o->err = errno;
        return 0;
    }
    o->failed = "clone3";
    pid_t pid = (pid_t)syscall(SYS_clone3, o->ca, sizeof *o->ca);
    if (pid == 0) {
        close(o->errfd_read);
        close(o->syncfd_write);
        child_main(o->p, o->errfd, o->syncfd, o->empty_caps, o->parent_pidfd, -1);
    }
    if (pid < 0) {
        o->err = errno;
        return 0;
    }
    o->pid = pid;
    o->failed = "id maps";
    int r = corral_ns_write_maps(pid, &o->uid, 1, &o->gid, 1);
    o->err = r < 0 ? -r : 0;
    return 0;
}

/*
 * The clone3 of a tenant whose netns is owned by a user namespace of the caller's own
 * (an unprivileged caller's plane, corral_ns_new_net_in_userns). Its user namespace must
 * be made inside that owner, so that the tenant's root holds nothing over the netns
 * (docs/architecture.md, invariant 4) — yet no thread of this process may enter a user
 * namespace. So a child alone in its thread group (corral_ns_run_in_child: shared memory
 * and fds) joins the owner and the netns, makes the tenant with CLONE_PARENT (this
 * process is its parent, its pidfd lands in our fd table, SIGCHLD as our own child's)
 * and writes its id maps: only a process in the parent user namespace may, and that is
 * the owner, not ours. Returns the pid (its maps written) or -1 with *err set; a pid
 * with *err set is the caller's to kill.
 */
static pid_t clone_under_owner(struct owner_clone *o, int *err, const char **step)
{
    o->ca->flags |= CLONE_PARENT;
    o->ca->exit_signal = 0; /* clone3 refuses one with CLONE_PARENT: the child's is ours */
    o->err = EIO;
    int r = corral_ns_run_in_child(owner_clone_run, o, SIGCHLD);
    if (r < 0) o->err = -r;
    *err = o->err;
    if (o->err && o->failed) *step = o->failed;
    return o->err && o->pid <= 0 ? -1 : o->pid;
}

/* A joined spawn's set-up process closes its pipe (EOF) by exiting: reaped here, and the
 * command it made our child (join_run) taken in its place, through a pidfd of its own.
 * On failure *command, when still > 0, is left for the caller to kill and reap. */
static int take_command(pid_t *pid, int *pidfd, pid_t *command)
{
    int ws;
    if (waitpid(*pid, &ws, 0) != *pid) return -errno;
    *pid = -1;
    close(*pidfd);
    *pidfd = -1;
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || *command <= 0) return -ECHILD;
    *pidfd = (int)syscall(SYS_pidfd_open, *command, 0);
    if (*pidfd < 0) return -errno;
    *pid = *command;
    *command = -1;
    return 0;
}

int corral_spawn(const struct corral_spawn_plan *p, struct corral_spawn_result *out,
                 const char **step)
{
    int errp[2] = {-1, -1}, syncp[2] = {-1, -1}, pidfd = -1, self_pidfd = -1, owner = -1, r = 0;
    pid_t pid = -1, command = -1;
    void *empty = NULL;
    *step = "prepare";
    out->pid = -1;
    out->pidfd = -1;
    out->job = 0;
    if (p->join_pidfd >= 0 && !p->ctty) {
        r = corral_spawn_join_direct(p, out, step);
        if (r != -ENOTSUP) return r;
        *step = "prepare";
        r = 0;
    }
    if (pipe2(errp, O_CLOEXEC) < 0 || pipe2(syncp, O_CLOEXEC) < 0) {
        r = -errno;
        goto fail;
    }
    empty = corral_caps_empty();
    if (!empty) {
        r = -ENOMEM;
        goto fail;
    }
    int join = p->join_pidfd >= 0;
    int direct = join && !p->ctty; /* join_run: the command is made our child */
    uint64_t flags =
        CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD;
    if (p->new_net && p->netns_fd < 0) flags |= CLONE_NEWNET;
    if (join || p->plain) flags = CLONE_PIDFD; /* the running sandbox's, or the helper's */
    if (p->plain && p->plain_pidns) flags |= CLONE_NEWPID;
    struct clone_args ca = {
        .flags = flags, .pidfd = (uint64_t)(uintptr_t)&pidfd, .exit_signal = SIGCHLD};
    int err = 0;
    *step = "join netns";
    if (!join && p->netns_fd >= 0 && (r = corral_ns_owner(p->netns_fd, &owner)) < 0) goto fail;
    *step = "clone3";
    self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    /* The tenant's root maps to an unprivileged host id; without privilege over other
     * ids, a caller can only map its own. */
    struct corral_id_map uid = {0, geteuid() == 0 ? p->outside_uid : geteuid(), 1};
    struct corral_id_map gid = {0, geteuid() == 0 ? p->outside_gid : getegid(), 1};
    int under_owner = owner >= 0 && !p->plain;
    if (under_owner) {
        struct owner_clone o = {.ca = &ca,
                                .owner_fd = owner,
                                .netns_fd = p->netns_fd,
                                .uid = uid,
                                .gid = gid,
                                .p = p,
                                .errfd_read = errp[0],
                                .errfd = errp[1],
                                .syncfd = syncp[0],
                                .syncfd_write = syncp[1],
                                .parent_pidfd = self_pidfd,
                                .empty_caps = empty};
        pid = clone_under_owner(&o, &err, step);
        if (pid > 0 && err) {
            r = -err;
            goto fail;
        }
    } else {
        int owned = !join && !p->plain && geteuid() == 0 && p->outside_uid != 0;
        pid = clone_in_netns(&ca, join || p->plain ? -1 : p->netns_fd,
                             owned ? (long)p->outside_uid : -1, owned ? (long)p->outside_gid : -1,
                             &err);
    }
    if (pid == 0) {
        close(errp[0]);
        close(syncp[1]);
        child_main(p, errp[1], syncp[0], empty, self_pidfd, p->plain ? owner : -1);
    }
    if (pid < 0) {
        r = -err;
        goto fail;
    }
    if (owner >= 0) close(owner);
    owner = -1;
    close(errp[1]);
    errp[1] = -1;
    close(syncp[0]);
    syncp[0] = -1;

    *step = "id maps";
    if (!join && !p->plain && !under_owner && (r = corral_ns_write_maps(pid, &uid, 1, &gid, 1)) < 0)
        goto fail;
    *step = "cgroup attach";
    for (size_t i = 0; i < p->n_cgroup_fds; i++)
        if ((r = write_pid(p->cgroup_procs_fds[i], pid)) < 0) goto fail;
    *step = "release child";
    /* a child killed before its release (from outside: the OOM killer, a stray kill) has
     * closed its end: that is EPIPE here, never a SIGPIPE that ends the caller unnamed */
    if (corral_write_nosigpipe(syncp[1], "x", 1) != 1) {
        r = -EPIPE;
        *step = died_before_release(&pid);
        goto fail;
    }
    close(syncp[1]);
    syncp[1] = -1;
    if (p->meanwhile) p->meanwhile(p->meanwhile_arg);

    struct report rep;
    ssize_t n;
    for (;;) {
        do
            n = read(errp[0], &rep, sizeof rep);
        while (n < 0 && errno == EINTR);
        if (n != (ssize_t)sizeof rep || rep.step != STEP_COUNT || !direct) break;
        command = rep.err; /* join_run's report: the command, our child now */
    }
    if (n == (ssize_t)sizeof rep) {
        *step = rep.step >= 0 && rep.step < STEP_COUNT ? step_names[rep.step] : "child";
        r = -rep.err;
        goto fail;
    }
    if (direct && (r = take_command(&pid, &pidfd, &command)) < 0) {
        *step = "join sandbox";
        goto fail;
    }
    close(errp[0]);
    close(self_pidfd);
    corral_caps_free(empty);
    out->pid = pid;
    out->pidfd = pidfd;
    out->job = direct;
    return 0;

fail:
    if (command > 0) {
        kill(command, SIGKILL);
        waitpid(command, NULL, 0);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    if (pidfd >= 0) close(pidfd);
    if (owner >= 0) close(owner);
    for (int i = 0; i < 2; i++) {
        if (errp[i] >= 0) close(errp[i]);
        if (syncp[i] >= 0) close(syncp[i]);
    }
    if (self_pidfd >= 0) close(self_pidfd);
    corral_caps_free(empty);
    return r;
}

int corral_pidfd_signal(int pidfd, int sig)
{
    if (syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) < 0) return -errno;
    return 0;
}
