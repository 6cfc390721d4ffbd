/*
 * The seccomp programs of tier S1 (lua/corral/tier.lua), built with libseccomp at build
 * time (core/gen/seccomp_tables.c prints them) and stacked on the Landlock domain:
 *
 *  no-subprocess  fork and vfork EPERM, clone without CLONE_THREAD EPERM (threads stay),
 *                 clone3 ENOSYS (its flags are in memory a filter cannot read; glibc then
 *                 falls back to clone), execve and execveat handed to a supervisor
 *                 (SECCOMP_RET_USER_NOTIF) that lets the first through — the start of
 *                 the program itself — and answers every later one EPERM (core/lib/tier.c).
 *  no-net         socket EPERM whatever the family, socketpair EPERM for anything but
 *                 AF_UNIX, io_uring ENOSYS (IORING_OP_SOCKET makes sockets too).
 *
 * Both give every foreign architecture (i386 through int 0x80, x32) EPERM for every
 * call, and neither ever kills: a killed process looks like a denial and hides the bug
 * that killed it.
 */
#ifndef CORRAL_TIER_SECCOMP_H
#define CORRAL_TIER_SECCOMP_H

#include "seccomp.h"

/* Each builds its program for the native architecture into *out (released with
 * corral_bpf_free). Returns 0 or -errno; *out is left empty on failure. */
int corral_seccomp_nosubprocess_program(struct corral_bpf *out);
int corral_seccomp_nonet_program(struct corral_bpf *out);

#endif
