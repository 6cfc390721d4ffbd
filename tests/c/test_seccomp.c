/*
 * The tenant seccomp filter against the real kernel. Every call is made twice, each in
 * its own forked child: once without the filter (the control: the call succeeds, or at
 * least fails with something other than the filter's errno) and once with it. The
 * filtered child also runs calls the filter must leave alone (getpid, write, fork,
 * unshare(0), ioctls), so a filter that killed or denied everything fails here.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "seccomp.h"
#include "seccomp_tables.h"

#ifndef __X32_SYSCALL_BIT
#define __X32_SYSCALL_BIT 0x40000000
#endif

enum call {
    C_GETPID,
    C_WRITE,
    C_FORK,
    C_UNSHARE0,
    C_FIONREAD,
    C_TIOCGWINSZ,
    C_PERS_QUERY,
    C_PERS_LINUX,
    /* denials from here on */
    C_MOUNT,
    C_FSOPEN,
    C_CLONE_USER,
    C_CLONE3,
    C_SETNS,
    C_TIOCSTI,
    C_TIOCSTI_HIGH,
    C_KEYCTL,
    C_BPF,
    C_IO_URING,
    C_VM_READV,
    C_PERS_NORAND,
    C_X32,
    C_INT80,
    C_UNSHARE_USER,
    C_PTRACE,
    C_DIES, /* dies of SIGUSR1 on purpose: the rows after it must still arrive */
    C_LAST_GETPID,
    C_COUNT,
};

static const char *const names[C_COUNT] = {
    [C_GETPID] = "getpid",
    [C_WRITE] = "write",
    [C_FORK] = "fork",
    [C_UNSHARE0] = "unshare(0)",
    [C_FIONREAD] = "FIONREAD",
    [C_TIOCGWINSZ] = "TIOCGWINSZ",
    [C_PERS_QUERY] = "personality(0xffffffff)",
    [C_PERS_LINUX] = "personality(PER_LINUX)",
    [C_MOUNT] = "mount",
    [C_FSOPEN] = "fsopen",
    [C_CLONE_USER] = "clone(CLONE_NEWUSER)",
    [C_CLONE3] = "clone3",
    [C_SETNS] = "setns",
    [C_TIOCSTI] = "TIOCSTI",
    [C_TIOCSTI_HIGH] = "TIOCSTI | 1 << 32",
    [C_KEYCTL] = "keyctl",
    [C_BPF] = "bpf",
    [C_IO_URING] = "io_uring_setup",
    [C_VM_READV] = "process_vm_readv",
    [C_PERS_NORAND] = "personality(ADDR_NO_RANDOMIZE)",
    [C_X32] = "x32 getpid",
    [C_INT80] = "int 0x80 getpid",
    [C_UNSHARE_USER] = "unshare(CLONE_NEWUSER)",
    [C_PTRACE] = "ptrace(PTRACE_TRACEME)",
    [C_DIES] = "raise(SIGUSR1)",
    [C_LAST_GETPID] = "getpid after a row that died",
};

struct outcome {
    long ret;
    int err;
    int sig; /* the signal the call's process died of, 0 when it returned */
    int arrived;
};

/* Runs one call in a grandchild of its own and records its result, or the signal it
 * died of. Whatever a call changes (namespaces, personality, tracing) stays with it. */
#define CALL(o, c, expr)                                                                           \
    do {                                                                                           \
        int r_[2];                                                                                 \
        if (pipe2(r_, O_CLOEXEC) < 0) _exit(94);                                                   \
        pid_t k_ = fork();                                                                         \
        if (k_ < 0) _exit(95);                                                                     \
        if (k_ == 0) {                                                                             \
            long v_ = (long)(expr);                                                                \
            struct outcome one_ = {.ret = v_, .err = v_ < 0 ? errno : 0, .arrived = 1};            \
            _exit(write(r_[1], &one_, sizeof one_) == sizeof one_ ? 0 : 96);                       \
        }                                                                                          \
        close(r_[1]);                                                                              \
        collect(&(o)[c], r_[0], k_);                                                               \
    } while (0)

static void collect(struct outcome *o, int fd, pid_t pid)
{
    ssize_t n = read(fd, o, sizeof *o);
    close(fd);
    int status = 0;
    while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR) {
    }
    if (n != (ssize_t)sizeof *o) memset(o, 0, sizeof *o);
    o->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    o->arrived = 1;
    if (o->sig) o->ret = -1, o->err = 0;
}

static long int80_getpid(void)
{
    long ret = 20; /* __NR_getpid on i386 */
    __asm__ volatile("int $0x80" : "+a"(ret) : : "memory");
    if (ret < 0 && ret > -4096) {
        errno = (int)-ret;
        return -1;
    }
    return ret;
}

static int open_pty(int *master, int *slave)
{
    *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (*master < 0 || grantpt(*master) < 0 || unlockpt(*master) < 0) return -1;
    const char *name = ptsname(*master);
    if (!name) return -1;
    *slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    return *slave < 0 ? -1 : 0;
}

static long wait_child(long pid)
{
    int status;
    if (pid == 0) _exit(0);
    if (pid < 0) return pid;
    if (waitpid((pid_t)pid, &status, __WALL) < 0) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : (errno = ECHILD, -1);
}

/* Runs every call, each in a process of its own, and stores what happened. */
static void run_calls(struct outcome *o)
{
    int p[2], master = -1, slave = -1;
    if (pipe2(p, O_CLOEXEC) < 0 || open_pty(&master, &slave) < 0) _exit(90);

    CALL(o, C_GETPID, syscall(SYS_getpid) == getpid() ? 0 : -1);
    CALL(o, C_WRITE, write(p[1], "x", 1));
    CALL(o, C_FORK, wait_child(fork()));
    CALL(o, C_UNSHARE0, unshare(0));
    int avail;
    CALL(o, C_FIONREAD, ioctl(p[0], FIONREAD, &avail));
    struct winsize ws;
    CALL(o, C_TIOCGWINSZ, ioctl(slave, TIOCGWINSZ, &ws));
    CALL(o, C_PERS_QUERY, personality(0xffffffff));
    CALL(o, C_PERS_LINUX, personality(PER_LINUX));

    /* A private mount namespace first (CLONE_NEWNS is not denied), so that the control's
     * mount changes nothing outside this child. */
    if (unshare(CLONE_NEWNS) < 0) _exit(91);
    CALL(o, C_MOUNT, mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
    CALL(o, C_FSOPEN, syscall(SYS_fsopen, "tmpfs", 0x1 /* FSOPEN_CLOEXEC */));
    CALL(o, C_CLONE_USER, wait_child(syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)));
    struct clone_args ca = {.exit_signal = SIGCHLD};
    CALL(o, C_CLONE3, wait_child(syscall(SYS_clone3, &ca, sizeof ca)));
    int uts = open("/proc/self/ns/uts", O_RDONLY | O_CLOEXEC);
    CALL(o, C_SETNS, setns(uts, CLONE_NEWUTS));
    char c = '\n';
    CALL(o, C_TIOCSTI, ioctl(slave, TIOCSTI, &c));
    CALL(o, C_TIOCSTI_HIGH, syscall(SYS_ioctl, slave, (unsigned long)TIOCSTI | (1UL << 32), &c));
    CALL(o, C_KEYCTL, syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING, 1));
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.map_type = BPF_MAP_TYPE_ARRAY;
    attr.key_size = 4;
    attr.value_size = 4;
    attr.max_entries = 1;
    CALL(o, C_BPF, syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr));
    struct io_uring_params up;
    memset(&up, 0, sizeof up);
    CALL(o, C_IO_URING, syscall(SYS_io_uring_setup, 1, &up));
    char src[8] = "corral", dst[8];
    struct iovec local = {dst, sizeof dst}, remote = {src, sizeof src};
    CALL(o, C_VM_READV, process_vm_readv(getpid(), &local, 1, &remote, 1, 0));
    CALL(o, C_PERS_NORAND, personality(ADDR_NO_RANDOMIZE));
    CALL(o, C_X32, syscall(__X32_SYSCALL_BIT | SYS_getpid));
    CALL(o, C_INT80, int80_getpid() == getpid() ? 0 : -1);
    CALL(o, C_UNSHARE_USER, unshare(CLONE_NEWUSER));
    CALL(o, C_PTRACE, ptrace(PTRACE_TRACEME, 0, 0, 0));
    CALL(o, C_DIES, raise(SIGUSR1));
    CALL(o, C_LAST_GETPID, syscall(SYS_getpid) > 0 ? 0 : -1);
}

/* Forks a child that optionally installs prog, runs every call and sends back what
 * happened. Returns 0 when the whole table arrived. */
static int run_child(const struct corral_bpf *prog, struct outcome *o, int *install_rc)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        struct outcome mine[C_COUNT];
        memset(mine, 0, sizeof mine);
        int rc = prog ? corral_seccomp_install(prog) : 0;
        if (write(p[1], &rc, sizeof rc) != sizeof rc) _exit(92);
        if (rc == 0) run_calls(mine);
        if (write(p[1], mine, sizeof mine) != sizeof mine) _exit(93);
        _exit(0);
    }
    close(p[1]);
    ssize_t a = read(p[0], install_rc, sizeof *install_rc);
    size_t got = 0;
    while (got < sizeof(struct outcome) * C_COUNT) {
        ssize_t n = read(p[0], (char *)o + got, sizeof(struct outcome) * C_COUNT - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "child status %#x\n", status);
    return a == sizeof *install_rc && got == sizeof(struct outcome) * C_COUNT &&
                   WIFEXITED(status) && WEXITSTATUS(status) == 0
               ? 0
               : -1;
}

static void expect(const struct outcome *o, enum call c, int want_err, const char *which)
{
    int ok = o[c].sig == 0 && (want_err ? (o[c].ret < 0 && o[c].err == want_err) : o[c].ret >= 0);
    if (!ok)
        fprintf(stderr, "  %s %s: ret %ld errno %d (%s) signal %d, wanted %s\n", which, names[c],
                o[c].ret, o[c].err, strerror(o[c].err), o[c].sig,
                want_err ? strerror(want_err) : "success");
    CHECK(ok);
}

/* int 0x80 enters the 32-bit ABI. Where the kernel has it (the control returns), the
 * filter must refuse it with EPERM. Where it has none (no IA32 emulation: the control
 * dies of SIGSEGV), no process can make the call at all, which is itself the protection:
 * the filtered row must then not succeed either. */
static void int80_row(const struct outcome *plain, const struct outcome *filtered)
{
    if (plain[C_INT80].sig == SIGSEGV) {
        printf("note: int 0x80: this kernel has no IA32 emulation (SIGSEGV without the "
               "filter); the 32-bit ABI is absent, so nothing can reach it\n");
        CHECK(filtered[C_INT80].ret < 0);
        CHECK(filtered[C_INT80].sig == SIGSEGV || filtered[C_INT80].err == EPERM);
        return;
    }
    expect(plain, C_INT80, 0, "plain");
    expect(filtered, C_INT80, EPERM, "filtered");
}

/* The table the confinement wrapper installs (generated at build time) is the program
 * libseccomp builds now: a stale table would fail here, not in the field. */
static void tty_table_is_current(void)
{
    struct corral_bpf fresh;
    CHECK(corral_seccomp_tty_program(&fresh) == 0);
    CHECK(fresh.len == sizeof corral_tty_filter / sizeof corral_tty_filter[0]);
    CHECK(fresh.insns && memcmp(fresh.insns, corral_tty_filter, sizeof corral_tty_filter) == 0);
    corral_bpf_free(&fresh);
    CHECK(corral_seccomp_noxattr_program(&fresh) == 0);
    CHECK(fresh.len == sizeof corral_noxattr_filter / sizeof corral_noxattr_filter[0]);
    CHECK(fresh.insns &&
          memcmp(fresh.insns, corral_noxattr_filter, sizeof corral_noxattr_filter) == 0);
    corral_bpf_free(&fresh);
    CHECK(corral_seccomp_tenant_program(&fresh) == 0);
    CHECK(fresh.len == sizeof corral_tenant_filter / sizeof corral_tenant_filter[0]);
    CHECK(fresh.insns &&
          memcmp(fresh.insns, corral_tenant_filter, sizeof corral_tenant_filter) == 0);
    corral_bpf_free(&fresh);
}

int main(void)
{
    struct corral_bpf prog;
    CHECK(corral_seccomp_tenant_program(&prog) == 0);
    CHECK(prog.len > 0 && prog.insns != NULL);
    tty_table_is_current();

    struct outcome plain[C_COUNT], filtered[C_COUNT];
    int rc_plain = -1, rc_filtered = -1;
    CHECK(run_child(NULL, plain, &rc_plain) == 0);
    CHECK(run_child(&prog, filtered, &rc_filtered) == 0);
    CHECK(rc_filtered == 0);

    /* Every row arrived, and the one made to die says so in both children. */
    for (int c = 0; c < C_COUNT; c++)
        CHECK(plain[c].arrived && filtered[c].arrived);
    CHECK(plain[C_DIES].sig == SIGUSR1 && filtered[C_DIES].sig == SIGUSR1);

    /* Allowed with and without the filter, the row after the death included. */
    for (int c = C_GETPID; c < C_MOUNT; c++) {
        expect(plain, c, 0, "plain");
        expect(filtered, c, 0, "filtered");
    }
    expect(plain, C_LAST_GETPID, 0, "plain");
    expect(filtered, C_LAST_GETPID, 0, "filtered");

    /* Control: without the filter each of these succeeds on this kernel (root). */
    for (int c = C_MOUNT; c < C_DIES; c++) {
        if (c == C_X32 || c == C_INT80) continue;
        expect(plain, c, 0, "plain");
    }
    /* No x32 ABI (CONFIG_X86_X32_ABI unset on common kernels): the control is ENOSYS,
     * so EPERM below can only come from the filter's bad-arch action. */
    CHECK(plain[C_X32].ret < 0 && plain[C_X32].sig == 0 && plain[C_X32].err != EPERM);

    for (int c = C_MOUNT; c < C_DIES; c++) {
        if (c == C_INT80) continue;
        expect(filtered, c, c == C_CLONE3 ? ENOSYS : EPERM, "filtered");
    }
    int80_row(plain, filtered);

    corral_bpf_free(&prog);
    CHECK(prog.insns == NULL && prog.len == 0);
    corral_bpf_free(&prog); /* idempotent */
    CHECK(corral_seccomp_install(&prog) == -EINVAL);
    return DONE();
}
