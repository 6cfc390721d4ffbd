/* The tier S1 seccomp programs (see tier_seccomp.h), through libseccomp. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <sys/socket.h>

/* libseccomp's header through core/lib/seccomp.h (see there). */
#define CORRAL_SECCOMP_IMPL
#include <seccomp.h>

#include "tier_seccomp.h"

static int nr_of(const char *name)
{
    int nr = seccomp_syscall_resolve_name(name);
    return nr == __NR_SCMP_ERROR ? -EOPNOTSUPP : nr;
}

/* Adds one rule per named call (a call absent on this architecture is skipped; one this
 * libseccomp cannot name refuses the whole program, which would otherwise lack it). */
static int deny_each(scmp_filter_ctx ctx, uint32_t action, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int nr = nr_of(names[i]);
        if (nr == -EOPNOTSUPP) return nr;
        int rc = seccomp_rule_add(ctx, action, nr, 0);
        if (rc < 0) return rc;
    }
    return 0;
}

typedef int (*add_rules_fn)(scmp_filter_ctx ctx);

static int build(add_rules_fn add, struct corral_bpf *out)
{
    out->insns = NULL;
    out->len = 0;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) return -ENOMEM;
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM));
    if (rc == 0) rc = add(ctx);
    if (rc == 0) rc = corral_seccomp_export(ctx, out);
    seccomp_release(ctx);
    return rc;
}

static int nosubprocess_rules(scmp_filter_ctx ctx)
{
    static const char *const forks[] = {"fork", "vfork"};
    int rc = deny_each(ctx, SCMP_ACT_ERRNO(EPERM), forks, 2);
    static const char *const clone3[] = {"clone3"};
    if (rc == 0) rc = deny_each(ctx, SCMP_ACT_ERRNO(ENOSYS), clone3, 1);
    static const char *const execs[] = {"execve", "execveat"};
    if (rc == 0) rc = deny_each(ctx, SCMP_ACT_NOTIFY, execs, 2);
    if (rc < 0) return rc;
        /* A clone without CLONE_THREAD is a new process; with it (which the kernel only
         * accepts together with CLONE_VM and CLONE_SIGHAND) a thread of this one. */
#if defined(__s390__) || defined(__s390x__)
    return seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                            SCMP_A1(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
#else
    return seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                            SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
#endif
}

static int nonet_rules(scmp_filter_ctx ctx)
{
    static const char *const sockets[] = {"socket"};
    int rc = deny_each(ctx, SCMP_ACT_ERRNO(EPERM), sockets, 1);
    static const char *const rings[] = {"io_uring_setup", "io_uring_enter", "io_uring_register"};
    if (rc == 0) rc = deny_each(ctx, SCMP_ACT_ERRNO(ENOSYS), rings, 3);
    if (rc < 0) return rc;
    /* The whole 64-bit register is compared: a family with upper bits set, which the
     * kernel would truncate to AF_UNIX, is refused too. */
    return seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1,
                            SCMP_A0(SCMP_CMP_NE, AF_UNIX));
}

int corral_seccomp_nosubprocess_program(struct corral_bpf *out)
{
    return build(nosubprocess_rules, out);
}

int corral_seccomp_nonet_program(struct corral_bpf *out)
{
    return build(nonet_rules, out);
}
