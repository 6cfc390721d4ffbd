/*
 * The tenant seccomp filter: a deny-list built with libseccomp in the parent, exported
 * to a plain classic-BPF array, and installed in the child right before exec without
 * allocating (the parent may be multi-threaded, so the forked child may only make
 * async-signal-safe calls).
 *
 * Every denial returns an errno (EPERM; ENOSYS for clone3) and never kills: a killed
 * process looks like a denial and hides the bug that killed it.
 */
#ifndef CORRAL_SECCOMP_H
#define CORRAL_SECCOMP_H

#include <linux/filter.h>
#include <stddef.h>

/* -Icore/lib makes <seccomp.h> name this file; seccomp.c reaches libseccomp's header,
 * the next one on the include path, through here. */
#ifdef CORRAL_SECCOMP_IMPL
#include_next <seccomp.h>
#endif

/* A classic-BPF program as the kernel takes it (struct sock_fprog's contents). */
struct corral_bpf {
    struct sock_filter *insns; /* malloc'd; NULL when empty */
    unsigned short len;        /* number of instructions */
};

/* Builds the tenant deny-list for the native architecture and exports it into *out
 * (which the caller later releases with corral_bpf_free). Foreign architectures (i386
 * through int 0x80, x32 on x86_64) get EPERM for every syscall. Returns 0 or -errno;
 * *out is left empty on failure. */
int corral_seccomp_tenant_program(struct corral_bpf *out);

/* The control-plane filter (corral confine): allows everything but the terminal
 * ioctls that push input into a terminal the process shares with its caller (TIOCSTI,
 * TIOCLINUX), in the native and compat architectures. Returns 0 or -errno. */
int corral_seccomp_tty_program(struct corral_bpf *out);

/* Stacked on the control-plane filter when a root caller's command keeps CAP_SETFCAP
 * (core/host/confine.c): every call that sets an extended attribute fails with EOPNOTSUPP, as on
 * a filesystem without them. A seccomp filter cannot read the attribute's name, and
 * security.capability written there would carry host root as its owner: a file that
 * gives its capabilities to whoever runs it on the host. Returns 0 or -errno. */
int corral_seccomp_noxattr_program(struct corral_bpf *out);

/* Sets no_new_privs and installs prog on the calling thread, synchronised to every
 * other thread of the process (SECCOMP_FILTER_FLAG_TSYNC). Async-signal-safe: no
 * allocation, no locks, so it may run in a child forked from a multi-threaded parent.
 * Returns 0, -errno, or -EBUSY when another thread could not be synchronised. */
int corral_seccomp_install(const struct corral_bpf *prog);

/* Releases the instructions; accepts an empty or already-freed program. */
void corral_bpf_free(struct corral_bpf *prog);

#ifdef CORRAL_SECCOMP_IMPL
/* Exports a libseccomp filter into *out as a plain classic-BPF array, for every program
 * corral builds with libseccomp (here and in tier_seccomp.c). Returns 0 or -errno; *out
 * is left empty on failure. */
int corral_seccomp_export(scmp_filter_ctx ctx, struct corral_bpf *out);
#endif

#endif
