/*
 * A command joined into a running sandbox in one step (see spawn_join.h): no copy of the
 * caller's memory, no set-up process of its own.
 *
 * The calling thread points its pid_ns_for_children at the sandbox's pid namespace
 * (setns CLONE_NEWPID changes only where this thread's children are born), clones the
 * command with CLONE_VM | CLONE_VFORK (as posix_spawn does: it runs on a stack of ours
 * while we wait, until its exec or its exit) and comes back to its own pid namespace. The
 * command itself then attaches to the sandbox's cgroup, enters its other namespaces, takes
 * its ids, drops every capability, sets no_new_privs and the seccomp filter, and execs: a
 * failed step is left in the memory it shares with us. It is our child, the leader of a
 * session and a process group of its own (a job, as reaper.h's).
 *
 * While it shares our memory it must not run a handler of ours: every signal is blocked
 * across the clone and each disposition reset before the mask is emptied for the exec.
 * Its credentials change once it is in the sandbox's user namespace, which leaves the
 * shared memory non-dumpable (commit_creds): from then on the sandbox's processes, of the
 * same ids but without a capability over our user namespace, cannot read it
 * (/proc/PID/environ, mem, ptrace). Before that it holds the host's root ids, which no
 * id of the sandbox maps to. The caller's argument area is what it shows as its command
 * line until the exec: a caller whose arguments are the sandbox's business blanks them
 * (core.proc.set_title).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <linux/securebits.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "seccomp.h"
#include "spawn_join.h"

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

/* What the command and the thread that made it share: its plan, and its failure. */
struct direct {
    const struct corral_spawn_plan *p;
    uint64_t handled; /* corral_signals_set_aside() */
    int last_cap;
    const char *step; /* the step that failed, or NULL */
    int err;
};

#define FAIL(d, name, e)                                                                           \
    do {                                                                                           \
        (d)->step = (name);                                                                        \
        (d)->err = (e);                                                                            \
        _exit(CORRAL_SPAWN_EXEC_FAILED);                                                           \
    } while (0)

/* Every capability gone for good (caps.c's drop, in raw system calls: securebits locked
 * first, the bounding set, the ambient set, then the permitted, effective and
 * inheritable sets). */
static int drop_capabilities(int last_cap)
{
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0) return -errno;
    for (int c = 0; c <= last_cap; c++)
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) return -errno;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    struct __user_cap_header_struct hd = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
    memset(none, 0, sizeof none);
    return syscall(SYS_capset, &hd, none) < 0 ? -errno : 0;
}

/* stdio as planned, and every other fd closed. */
static int set_fds(const struct corral_spawn_plan *p)
{
    for (int i = 0; i < 3; i++)
        if (p->stdio[i] >= 0 && dup2(p->stdio[i], i) < 0) return -errno;
    return syscall(SYS_close_range, 3, ~0U, 0) < 0 ? -errno : 0;
}

static int direct_run(void *arg)
{
    struct direct *d = arg;
    const struct corral_spawn_plan *p = d->p;
    /* The raw system call: glibc's refuses the two signals it reserves (32, 33), which
     * a caller that ignores them would hand on ignored. */
    struct {
        void (*handler)(int);
        unsigned long flags;
        void (*restorer)(void);
        uint64_t mask;
    } dfl = {SIG_DFL, 0, NULL, 0};
    for (int sig = 1; sig <= 64; sig++)
        if ((d->handled >> (sig - 1) & 1) && sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
    /* in the sandbox's cgroup before anything of it runs ("0": the writer itself) */
    for (size_t i = 0; i < p->n_cgroup_fds; i++)
        if (write(p->cgroup_procs_fds[i], "0\n", 2) != 2) FAIL(d, "cgroup attach", errno);
    if (setns(p->join_pidfd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS |
                                 CLONE_NEWNET | CLONE_NEWCGROUP) < 0)
        FAIL(d, "join sandbox", errno);
    /* raw system calls: glibc's wrappers would change the ids of every thread they
     * think is theirs, and this process shares their memory */
    if (syscall(SYS_setresgid, 0, 0, 0) < 0 ||
        (syscall(SYS_setgroups, 0, NULL) < 0 && errno != EPERM) ||
        syscall(SYS_setresuid, 0, 0, 0) < 0)
        FAIL(d, "set ids", errno);
    /* The id change cleared it. Should the caller die before the exec, the sandbox's
     * init, which dies with it, takes its pid namespace and this process along. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (chdir(p->cwd ? p->cwd : "/") < 0) FAIL(d, "chdir", errno);
    for (size_t i = 0; i < p->n_rlimits; i++) {
        struct rlimit rl = {p->rlimits[i].cur, p->rlimits[i].max};
        if (setrlimit(p->rlimits[i].resource, &rl) < 0) FAIL(d, "rlimits", errno);
    }
    /* a session and a group of its own: no terminal to inject keystrokes into */
    if (setsid() < 0) FAIL(d, "setsid", errno);
    int r = set_fds(p);
    if (r < 0) FAIL(d, "close fds", -r);
    if ((r = drop_capabilities(d->last_cap)) < 0) FAIL(d, "drop capabilities", -r);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) FAIL(d, "no_new_privs", errno);
    if (p->seccomp && (r = corral_seccomp_install(p->seccomp)) < 0) FAIL(d, "seccomp", -r);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(p->path, p->argv, p->envp);
    FAIL(d, "exec", errno);
}

/* The running kernel's last capability (/proc/sys/kernel/cap_last_cap), read once. */
static int last_capability(void)
{
    static int last = -1;
    if (last >= 0) return last;
    char buf[16] = {0};
    int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    int v = n > 0 ? atoi(buf) : 0;
    last = v > 0 && v < 64 ? v : 63; /* unknown: every number tried, EINVAL past the end */
    return last;
}

int corral_spawn_join_direct(const struct corral_spawn_plan *p, struct corral_spawn_result *out,
                             const char **step)
{
    *step = "join sandbox";
    if (geteuid() != 0 || p->join_pidfd < 0 || p->ctty || p->plain || p->n_keep_fds)
        return -ENOTSUP;
    int own = open("/proc/thread-self/ns/pid", O_RDONLY | O_CLOEXEC);
    if (own < 0) return -ENOTSUP;
    if (setns(p->join_pidfd, CLONE_NEWPID) < 0) {
        int err = errno;
        close(own);
        return err == EPERM ? -ENOTSUP : -err;
    }
    struct direct d = {
        .p = p, .handled = corral_signals_set_aside(), .last_cap = last_capability()};
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    char stack[64 * 1024] __attribute__((aligned(16))); /* ours waits while it runs */
    int pidfd = -1;
    pid_t pid = clone(direct_run, stack + sizeof stack,
                      CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &d, &pidfd);
    int err = errno;
    /* every later child of this thread must be born in our own pid namespace again */
    if (setns(own, CLONE_NEWPID) < 0) abort();
    close(own);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        *step = "clone3";
        return -err;
    }
    if (d.step) {
        *step = d.step;
        close(pidfd);
        waitpid(pid, NULL, 0);
        return -d.err;
    }
    out->pid = pid;
    out->pidfd = pidfd;
    out->job = 1;
    return 0;
}
