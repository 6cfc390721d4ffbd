#ifndef CORRAL_SPAWN_JOIN_H
#define CORRAL_SPAWN_JOIN_H

#include "spawn.h"

/*
 * The fast join (spawn_join.c): a command without a terminal, joined into the running
 * sandbox of p->join_pidfd in one clone that shares the caller's memory until its exec,
 * made the caller's child in the sandbox's pid namespace (out->job set). Needs the
 * privilege to point this thread's children at that pid namespace (root): -ENOTSUP
 * otherwise, or for a plan it does not take (ctty, plain, keep_fds), and then nothing was
 * done.
 * Else as corral_spawn: 0, or -errno with *step naming the failed step.
 */
int corral_spawn_join_direct(const struct corral_spawn_plan *p, struct corral_spawn_result *out,
                             const char **step);

#endif
