/*
 * The S1/S0 runner (see tier.h).
 *
 * Why a supervisor for exec: a seccomp program is stateless, so it cannot tell the one
 * execve that starts the program from the ones the program makes later. User
 * notification (Linux 5.5's SECCOMP_USER_NOTIF_FLAG_CONTINUE) lets the caller count:
 * the first notification comes from the child's own code, before any of the program
 * has run, and it is the only one let through. The kernel documents CONTINUE as unsafe
 * for decisions on a call's arguments (they can change after the check); this decision
 * reads none. Once the supervisor is gone (the listener closed), every notifying call
 * fails with ENOSYS: it fails closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "caps.h"
#include "exitcodes.h"
#include "ns.h"
#include "landlock.h"
#include "tier.h"
#include "util.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef SECCOMP_USER_NOTIF_FLAG_CONTINUE
#define SECCOMP_USER_NOTIF_FLAG_CONTINUE (1UL << 0)
#endif

int corral_tier_ruleset(int abi, const struct corral_tier_rule *rules, size_t n, size_t *failed)
{
    *failed = n;
    int rs = corral_landlock_create(abi);
    if (rs < 0) return rs;
    for (size_t i = 0; i < n; i++) {
        int r =
            corral_landlock_allow_path(rs, abi, rules[i].path, rules[i].rights, rules[i].optional);
        if (r < 0) {
            *failed = i;
            close(rs);
            return r;
        }
    }
    return rs;
}

enum step {
    STEP_SYNC,
    STEP_STDIO,
    STEP_CWD,
    STEP_NETNS,
    STEP_CAPS,
    STEP_LANDLOCK,
    STEP_SECCOMP,
    STEP_LISTENER,
    STEP_EXEC
};
static const char *const step_names[] = {
    [STEP_SYNC] = "start",
    [STEP_STDIO] = "stdio",
    [STEP_CWD] = "chdir",
    [STEP_NETNS] = "join network namespace",
    [STEP_CAPS] = "drop capabilities",
    [STEP_LANDLOCK] = "landlock",
    [STEP_SECCOMP] = "seccomp",
    [STEP_LISTENER] = "seccomp listener",
    [STEP_EXEC] = "exec",
};

struct report {
    int32_t step, err;
};

CORRAL_OWN_STACK __attribute__((noreturn)) static void child_fail(int fd, enum step step, int err)
{
    struct report r = {step, err < 0 ? -err : err};
    ssize_t w = write(fd, &r, sizeof r);
    (void)w;
    _exit(CORRAL_EXIT_NOTFOUND);
}

static int install(const struct corral_bpf *prog, unsigned flags)
{
    struct sock_fprog f = {.len = prog->len, .filter = prog->insns};
    long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &f);
    return r < 0 ? -errno : (int)r;
}

static int send_fd(int sock, int fd)
{
    char byte = 0;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

static int recv_fd(int sock)
{
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (n == 0 || !c || c->cmsg_type != SCM_RIGHTS) return -EPIPE;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* In the child: only syscalls and stack memory (the caller may be multi-threaded). */
/*
 * owner_fd >= 0: p->netns_fd belongs to a user namespace of the caller's own (an egress
 * plane made without root, corral_ns_new_net_in_userns), joined first, as only a member
 * may join its netns. Joining it grants every capability there, which the program must
 * not keep over its own netns (docs/architecture.md, invariant 4): empty_caps drops
 * them all, whatever the policy kept of the caller's own.
 */
CORRAL_OWN_STACK __attribute__((noreturn)) static void child_main(const struct corral_tier_plan *p,
                                                                  int errfd, int sock, pid_t parent,
                                                                  int owner_fd, void *empty_caps)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(CORRAL_EXIT_NOTFOUND);
    /* No signal blocked and every handler at its default, whatever the caller had
     * (exec keeps the mask and ignored signals). */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Moved above 2 first, so that one target's dup2 cannot clobber another's source. */
    int moved[3];
    for (int i = 0; i < 3; i++) {
        moved[i] = p->stdio[i] < 0 ? -1 : fcntl(p->stdio[i], F_DUPFD_CLOEXEC, 3);
        if (p->stdio[i] >= 0 && moved[i] < 0) child_fail(errfd, STEP_STDIO, errno);
    }
    for (int i = 0; i < 3; i++)
        if (moved[i] >= 0 && dup2(moved[i], i) < 0) child_fail(errfd, STEP_STDIO, errno);
    if (p->cwd && chdir(p->cwd) < 0) child_fail(errfd, STEP_CWD, errno);
    if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        child_fail(errfd, STEP_STDIO, errno);
    /* Before the capabilities go: joining needs CAP_SYS_ADMIN over the namespace. */
    if (owner_fd >= 0 && setns(owner_fd, CLONE_NEWUSER) < 0) child_fail(errfd, STEP_NETNS, errno);
    if (p->netns_fd >= 0 && setns(p->netns_fd, CLONE_NEWNET) < 0)
        child_fail(errfd, STEP_NETNS, errno);
    /* no_new_privs first: it lets the bounding set stay where CAP_SETPCAP is missing
     * (caps.c), and every layer below needs it anyway. */
    if ((empty_caps || p->n_filters || p->supervised) && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        child_fail(errfd, STEP_CAPS, errno);
    if (empty_caps) {
        int r = corral_caps_drop_all_with(empty_caps);
        if (r < 0) child_fail(errfd, STEP_CAPS, r);
    }
    if (p->ruleset_fd >= 0) {
        int r = corral_landlock_restrict(p->ruleset_fd);
        if (r < 0) child_fail(errfd, STEP_LANDLOCK, r);
    }
    for (size_t i = 0; i < p->n_filters; i++) {
        int r = install(p->filters[i], 0);
        if (r < 0) child_fail(errfd, STEP_SECCOMP, r);
    }
    if (p->supervised) {
        int listener = install(p->supervised, SECCOMP_FILTER_FLAG_NEW_LISTENER);
        if (listener < 0) child_fail(errfd, STEP_LISTENER, listener);
        int r = send_fd(sock, listener);
        if (r < 0) child_fail(errfd, STEP_LISTENER, r);
        close(listener);
        close(sock);
    }
    execve(p->path, p->argv, p->envp);
    child_fail(errfd, STEP_EXEC, errno);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Answers one notification: the first exec from the child itself passes, any other is
 * refused. A notification whose process is gone (ENOENT) is simply dropped. */
static void answer(int listener, pid_t child, int *first, unsigned *denied)
{
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    memset(&req, 0, sizeof req);
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0) return;
    memset(&resp, 0, sizeof resp);
    resp.id = req.id;
    if (*first && (pid_t)req.pid == child) {
        *first = 0;
        resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    } else {
        resp.error = -EPERM;
        (*denied)++;
    }
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

/* Supervises until the child exits (or the timeout kills it); returns the listener
 * closed. */
static void supervise(const struct corral_tier_plan *p, pid_t pid, int pidfd, int listener,
                      const struct timespec *t0, struct corral_tier_result *out)
{
    int first = 1;
    for (;;) {
        struct pollfd pf[2] = {{.fd = pidfd, .events = POLLIN}, {.fd = listener, .events = POLLIN}};
        int timeout = -1;
        if (p->timeout_ms > 0 && !out->timed_out) {
            double left = p->timeout_ms / 1000.0 - seconds_since(t0);
            timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
        }
        int n = poll(pf, listener >= 0 ? 2 : 1, timeout);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
            syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
            out->timed_out = 1;
            continue;
        }
        if (n < 0 || (pf[0].revents & POLLIN)) break;
        if (pf[1].revents & POLLIN)
            answer(listener, pid, &first, &out->execs_denied);
        else if (pf[1].revents & (POLLHUP | POLLERR)) {
            close(listener); /* every user of the filter is gone */
            listener = -1;
        }
    }
    if (listener >= 0) close(listener);
}

int corral_tier_run(const struct corral_tier_plan *p, struct corral_tier_result *out,
                    const char **step)
{
    memset(out, 0, sizeof *out);
    *step = step_names[STEP_SYNC];
    int errp[2], sv[2] = {-1, -1};
    if (pipe2(errp, O_CLOEXEC) < 0) return -errno;
    if (p->supervised && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        int err = errno;
        close(errp[0]);
        close(errp[1]);
        return -err;
    }
    int owner = -1, err = 0;
    void *empty_caps = p->empty_caps, *own_empty = NULL;
    if (p->netns_fd >= 0 && (err = corral_ns_owner(p->netns_fd, &owner)) == 0 && owner >= 0 &&
        !empty_caps && !(empty_caps = own_empty = corral_caps_empty()))
        err = -ENOMEM;
    if (err < 0) {
        *step = step_names[STEP_NETNS];
        if (owner >= 0) close(owner);
        close(errp[0]);
        close(errp[1]);
        if (sv[0] >= 0) close(sv[0]);
        if (sv[1] >= 0) close(sv[1]);
        return err;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int pidfd = -1;
    struct clone_args ca = {
        .flags = CLONE_PIDFD, .pidfd = (uintptr_t)&pidfd, .exit_signal = SIGCHLD};
    pid_t parent = getpid();
    pid_t pid = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) {
        close(errp[0]);
        if (sv[0] >= 0) close(sv[0]);
        child_main(p, errp[1], sv[1], parent, owner, empty_caps);
    }
    err = pid < 0 ? -errno : 0;
    if (owner >= 0) close(owner);
    corral_caps_free(own_empty);
    close(errp[1]);
    if (sv[1] >= 0) close(sv[1]);
    int listener = -1;
    if (pid > 0 && p->supervised) {
        listener = recv_fd(sv[0]); /* EOF: the child failed first and reports why */
        if (listener < 0) listener = -1;
    }
    if (sv[0] >= 0) close(sv[0]);
    if (pid > 0) {
        supervise(p, pid, pidfd, listener, &t0, out);
        int status;
        struct rusage ru;
        while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
            ;
        close(pidfd);
        out->wall_s = seconds_since(&t0);
        out->cpu_s = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
        out->max_rss_kb = ru.ru_maxrss;
        out->status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        struct report rep;
        ssize_t n;
        do
            n = read(errp[0], &rep, sizeof rep);
        while (n < 0 && errno == EINTR);
        if (n == (ssize_t)sizeof rep && rep.step >= 0 && rep.step <= STEP_EXEC) {
            *step = step_names[rep.step];
            err = -rep.err;
        }
    }
    close(errp[0]);
    return err;
}
