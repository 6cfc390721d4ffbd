/*
 * The tenant seccomp deny-list, built with libseccomp (never hand-written BPF) and
 * exported to a plain sock_filter array (see seccomp.h). libseccomp 2.5 has no
 * seccomp_export_bpf_mem, so the program is exported into a memfd and read back.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Found as core/lib/seccomp.h through -Icore/lib, which then pulls libseccomp's header
 * with #include_next (a quoted include would make #include_next find this file again). */
#define CORRAL_SECCOMP_IMPL
#include <seccomp.h>

#ifndef CLONE_NEWUSER
#define CLONE_NEWUSER 0x10000000
#endif

/* Denied outright with EPERM. Mount and the new mount API rearrange the tenant's view;
 * the rest reach the kernel or other processes (ptrace family, pidfd_getfd), load code
 * into the kernel (modules, kexec, bpf), widen the kernel attack surface with little
 * legitimate tenant use (io_uring, userfaultfd, perf, keyrings, file handles), or change
 * host-wide state (clock, swap, reboot, accounting, quota, syslog), or enter namespaces
 * (setns). */
static const char *const deny_eperm[] = {
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "vhangup",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "setns",
};

static int resolve(const char *name)
{
    int nr = seccomp_syscall_resolve_name(name);
    /* A name this libseccomp does not know cannot be denied: refuse a filter that
     * silently lacks it (another negative number means absent on this architecture). */
    return nr == __NR_SCMP_ERROR ? -EOPNOTSUPP : nr;
}

/* No setuid or setgid bit is ever set, whether by chmod or at creation (open, creat,
 * mknod with a mode): a file a sandbox leaves on the host must not run as its owner.
 * A setuid copy of a shell in a tenant's storage would let any host user act as the id
 * that owns the tenant's user namespace. Each bit is a rule of its own (libseccomp
 * allows one comparison per argument and rule). */
struct mode_call {
    const char *name;
    unsigned arg;  /* the mode */
    int flags_arg; /* open/openat: the flags, for O_CREAT / O_TMPFILE; -1: none */
    int nr;        /* used when libseccomp cannot name the call (fchmodat2, Linux 6.6) */
};

static int deny_special_modes(scmp_filter_ctx ctx)
{
    static const struct mode_call calls[] = {
        {"chmod", 1, -1, -1},      {"fchmod", 1, -1, -1}, {"fchmodat", 2, -1, -1},
        {"fchmodat2", 2, -1, 452}, {"open", 2, 1, -1},    {"openat", 3, 2, -1},
        {"creat", 1, -1, -1},      {"mknod", 1, -1, -1},  {"mknodat", 2, -1, -1}};
    /* openat2 carries its mode in memory (struct open_how), out of a filter's reach:
     * refused as absent (ENOSYS), so callers fall back to openat, which is checked. */
    int openat2 = seccomp_syscall_resolve_name("openat2");
    if (openat2 == __NR_SCMP_ERROR) openat2 = 437; /* the same number on every arch */
    int rc0 = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), openat2, 0);
    if (rc0 < 0) return rc0;
    static const uint64_t bits[] = {S_ISUID, S_ISGID};
    /* The mode of open is read only with these flags; others pass what happens to be
     * in the register, which must not be refused. */
    static const uint64_t creating[] = {O_CREAT, O_TMPFILE};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        int nr = seccomp_syscall_resolve_name(calls[i].name);
        if (nr == __NR_SCMP_ERROR) nr = calls[i].nr;
        if (nr == __NR_SCMP_ERROR || nr < 0) continue; /* absent on this architecture */
        for (size_t b = 0; b < 2; b++) {
            struct scmp_arg_cmp cmp[2] = {{calls[i].arg, SCMP_CMP_MASKED_EQ, bits[b], bits[b]}};
            int rc = 0;
            if (calls[i].flags_arg < 0) {
                rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, cmp);
            } else {
                for (size_t f = 0; rc == 0 && f < 2; f++) {
                    cmp[1] = (struct scmp_arg_cmp){(unsigned)calls[i].flags_arg, SCMP_CMP_MASKED_EQ,
                                                   creating[f], creating[f]};
                    rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO(EPERM), nr, 2, cmp);
                }
            }
            if (rc < 0) return rc;
        }
    }
    return 0;
}

/* Sockets of the families a tenant has use for: unix, IPv4, IPv6, netlink. The rest are
 * refused with EAFNOSUPPORT; AF_VSOCK above all, which no network namespace scopes: its
 * ports are the whole VM's, beside the hypervisor's. The kernel reads the family as an
 * int, so any upper bits set make the value >= 17 and land in the first rule. */
static int allow_socket_families(scmp_filter_ctx ctx)
{
    const uint32_t refuse = SCMP_ACT_ERRNO(EAFNOSUPPORT);
    static const char *const calls[] = {"socket", "socketpair"};
    for (size_t i = 0; i < 2; i++) {
        int nr = seccomp_syscall_resolve_name(calls[i]);
        if (nr == __NR_SCMP_ERROR) return -EOPNOTSUPP;
        int rc = seccomp_rule_add(ctx, refuse, nr, 1, SCMP_A0(SCMP_CMP_GE, AF_NETLINK + 1));
        for (uint64_t fam = 0; rc == 0 && fam < AF_NETLINK; fam++) {
            if (fam == AF_UNIX || fam == AF_INET || fam == AF_INET6) continue;
            rc = seccomp_rule_add(ctx, refuse, nr, 1, SCMP_A0(SCMP_CMP_EQ, fam));
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static int add_rules(scmp_filter_ctx ctx)
{
    const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    int rc;

    for (size_t i = 0; i < sizeof deny_eperm / sizeof deny_eperm[0]; i++) {
        int nr = resolve(deny_eperm[i]);
        if (nr == -EOPNOTSUPP) return nr;
        rc = seccomp_rule_add(ctx, eperm, nr, 0);
        if (rc < 0) return rc;
    }

    /* clone3 keeps its flags in memory that a filter cannot read; ENOSYS makes glibc
     * fall back to clone, whose flags are a register the rule below inspects. */
    int nr = resolve("clone3");
    if (nr == -EOPNOTSUPP) return nr;
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    if (rc < 0) return rc;

    /* A user namespace gives the tenant every capability over the namespaces it then
     * creates (docs/architecture.md, invariant 4). */
    rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(unshare), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    if (rc < 0) return rc;
#if defined(__s390__) || defined(__s390x__)
    /* s390 swaps clone's first two arguments. */
    rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
#else
    rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
#endif
    if (rc < 0) return rc;

    /* TIOCSTI pushes input into a terminal the tenant shares with its operator;
     * TIOCLINUX can do the same on a virtual console. The kernel takes the request as an
     * unsigned int, so only the low 32 bits are compared: a caller setting upper bits
     * reaches the same ioctl. */
    static const unsigned long tty_requests[] = {TIOCSTI, TIOCLINUX};
    for (size_t i = 0; i < 2; i++) {
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, tty_requests[i]));
        if (rc < 0) return rc;
    }

    if ((rc = deny_special_modes(ctx)) < 0) return rc;
    if ((rc = allow_socket_families(ctx)) < 0) return rc;

    /* personality: only 0 (PER_LINUX) and the 0xffffffff query pass. libseccomp allows
     * one comparison per argument in a rule, so "neither all-zero nor all-one" is spelt
     * as 32 rules: any other 32-bit value has some bit i set whose cyclic neighbour
     * i+1 is clear. The kernel reads the argument as an unsigned int, so upper bits are
     * ignored here as well. */
    for (unsigned i = 0; i < 32; i++) {
        uint64_t bit = 1ULL << i, next = 1ULL << ((i + 1) % 32);
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(personality), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, bit | next, bit));
        if (rc < 0) return rc;
    }
    return 0;
}

int corral_seccomp_export(scmp_filter_ctx ctx, struct corral_bpf *out)
{
    int fd = memfd_create("corral-seccomp", MFD_CLOEXEC);
    if (fd < 0) return -errno;

    int rc = seccomp_export_bpf(ctx, fd);
    struct stat st;
    if (rc == 0 && fstat(fd, &st) < 0) rc = -errno;
    if (rc == 0) {
        size_t size = (size_t)st.st_size;
        if (size == 0 || size % sizeof(struct sock_filter) != 0 ||
            size / sizeof(struct sock_filter) > BPF_MAXINSNS)
            rc = -EINVAL;
        else if (!(out->insns = malloc(size)))
            rc = -ENOMEM;
        else {
            size_t got = 0;
            while (got < size) {
                ssize_t n = pread(fd, (char *)out->insns + got, size - got, (off_t)got);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    rc = n < 0 ? -errno : -EIO;
                    break;
                }
                got += (size_t)n;
            }
            out->len = (unsigned short)(size / sizeof(struct sock_filter));
        }
    }
    close(fd);
    if (rc < 0) corral_bpf_free(out);
    return rc;
}

int corral_seccomp_tenant_program(struct corral_bpf *out)
{
    out->insns = NULL;
    out->len = 0;

    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -ENOMEM;

    /* A filter for the native architecture only: anything else (i386 through int 0x80,
     * and on x86_64 the x32 numbers >= 0x40000000, which libseccomp rejects in the
     * native branch) takes the bad-arch action, and that is EPERM, not libseccomp's
     * default kill. */
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM));
    if (rc == 0) rc = add_rules(ctx);
    if (rc == 0) rc = corral_seccomp_export(ctx, out);
    seccomp_release(ctx);
    return rc;
}

/* The compat architectures a native process can also enter (int 0x80, x32, AArch32):
 * the terminal rules must hold in every one of them. */
static int add_compat_arches(scmp_filter_ctx ctx)
{
#if defined(__x86_64__)
    static const uint32_t arches[] = {SCMP_ARCH_X86, SCMP_ARCH_X32};
#elif defined(__aarch64__)
    static const uint32_t arches[] = {SCMP_ARCH_ARM};
#else
    static const uint32_t arches[] = {0};
#endif
    for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++) {
        if (!arches[i]) continue;
        int rc = seccomp_arch_add(ctx, arches[i]);
        if (rc < 0 && rc != -EEXIST) return rc;
    }
    return 0;
}

int corral_seccomp_tty_program(struct corral_bpf *out)
{
    out->insns = NULL;
    out->len = 0;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -ENOMEM;
    /* An architecture the filter does not know gets EPERM for everything: no way
     * around the rules below, and still no kill. */
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM));
    if (rc == 0) rc = add_compat_arches(ctx);
    static const unsigned long tty_requests[] = {TIOCSTI, TIOCLINUX};
    for (size_t i = 0; rc == 0 && i < 2; i++)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, tty_requests[i]));
    /* Kernel keyrings are not files, so neither layer covers the caller's session
     * keyring; io_uring's open requests carry their mode where the setuid rules below
     * cannot see it. ENOSYS, as on a kernel without them, so programs fall back. */
    static const char *const key_calls[] = {"keyctl",         "add_key",
                                            "request_key",    "io_uring_setup",
                                            "io_uring_enter", "io_uring_register"};
    for (size_t i = 0; rc == 0 && i < sizeof key_calls / sizeof key_calls[0]; i++) {
        int nr = seccomp_syscall_resolve_name(key_calls[i]);
        rc = nr == __NR_SCMP_ERROR ? -EOPNOTSUPP
                                   : seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    }
    /* No setuid or setgid bit either: where Landlock stands alone it does not cover
     * chmod, and a root caller's command could make a host binary setuid root. */
    if (rc == 0) rc = deny_special_modes(ctx);
    if (rc == 0) rc = corral_seccomp_export(ctx, out);
    seccomp_release(ctx);
    return rc;
}

int corral_seccomp_noxattr_program(struct corral_bpf *out)
{
    out->insns = NULL;
    out->len = 0;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -ENOMEM;
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM));
#if defined(__x86_64__)
    /* setxattrat (Linux 6.13) is newer than this libseccomp, so it goes in by number
     * before the compat arches, where libseccomp cannot translate it: native only. */
    if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EOPNOTSUPP), 463, 0);
#endif
    if (rc == 0) rc = add_compat_arches(ctx);
    static const char *const calls[] = {"setxattr", "lsetxattr", "fsetxattr"};
    for (size_t i = 0; rc == 0 && i < sizeof calls / sizeof calls[0]; i++) {
        int nr = seccomp_syscall_resolve_name(calls[i]);
        rc = nr == __NR_SCMP_ERROR ? -EOPNOTSUPP
                                   : seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EOPNOTSUPP), nr, 0);
    }
    if (rc == 0) rc = corral_seccomp_export(ctx, out);
    seccomp_release(ctx);
    return rc;
}

int corral_seccomp_install(const struct corral_bpf *prog)
{
    if (!prog || !prog->insns || prog->len == 0) return -EINVAL;
    struct sock_fprog fprog = {.len = prog->len, .filter = prog->insns};

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -errno;
    long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog);
    if (r < 0) return -errno;
    /* With TSYNC a positive result is the id of a thread that could not be synchronised;
     * nothing was installed. */
    if (r > 0) return -EBUSY;
    return 0;
}

void corral_bpf_free(struct corral_bpf *prog)
{
    if (!prog) return;
    free(prog->insns);
    prog->insns = NULL;
    prog->len = 0;
}
