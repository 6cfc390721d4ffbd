/*
 * Tier S1 on Linux: one native program run under a Landlock domain and stacked seccomp
 * programs (tier_seccomp.h), no namespace, so it holds where user namespaces are
 * restricted. The same runner without either is S0, the bare child the ladder compares
 * against. lua/corral/tier.lua derives the rules from a step's grants and decides which
 * tier a host has earned; this file only applies what it is given.
 *
 * Process shape: the child (no namespaces) applies stdio, cwd and no_new_privs, drops
 * every capability (a root caller's child would keep CAP_SYS_MODULE, CAP_NET_ADMIN …,
 * which no file rule touches), then Landlock and the seccomp programs, passing the
 * supervised one's listener back before it execs. The caller's thread supervises until
 * the child exits (tier.c) and reaps it with its resource usage. A failed step never
 * execs: the child reports {step, errno} over a CLOEXEC pipe and exits 127.
 */
#ifndef CORRAL_TIER_H
#define CORRAL_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "seccomp.h"

struct corral_tier_rule {
    const char *path; /* resolved */
    uint64_t rights;  /* CORRAL_LL_* */
    int optional;     /* a path that does not exist is skipped */
};

/* Builds a Landlock ruleset at `abi` from the rules. Returns a CLOEXEC ruleset fd, or
 * -errno with *failed set to the index of the rule that failed (n when the ruleset could
 * not be created). */
int corral_tier_ruleset(int abi, const struct corral_tier_rule *rules, size_t n, size_t *failed);

#define CORRAL_TIER_MAX_FILTERS 4

struct corral_tier_plan {
    const char *path;  /* resolved executable */
    char *const *argv; /* NULL-terminated */
    char *const *envp; /* NULL-terminated, exactly what the program gets */
    const char *cwd;   /* NULL: the caller's */
    void *empty_caps;  /* from corral_caps_empty(): every capability dropped (and the
                          securebits locked) before Landlock; NULL: kept, as S0 does */
    int netns_fd;      /* >= 0: a network namespace joined first, while the child still
                          holds the capability to (its owner's user namespace is the
                          caller's, where the program then holds none; or one of the
                          caller's own, joined first, every capability it grants then
                          dropped); -1: the caller's */
    int ruleset_fd;    /* >= 0: enforced (Landlock) before the filters; -1: none */
    const struct corral_bpf *filters[CORRAL_TIER_MAX_FILTERS]; /* installed in order */
    size_t n_filters;
    const struct corral_bpf *supervised; /* NULL, or a program whose SECCOMP_RET_USER_NOTIF
                                            calls are execs: the first passes, later EPERM */
    int stdio[3];                        /* -1: inherit */
    int timeout_ms;                      /* > 0: SIGKILL after this long */
};

struct corral_tier_result {
    int status;            /* exit code, or 128+N when killed by signal N */
    int timed_out;         /* the timeout killed it */
    unsigned execs_denied; /* execs the supervisor answered EPERM */
    double wall_s, cpu_s;  /* wall clock from clone to reap; user+system CPU */
    long max_rss_kb;       /* ru_maxrss: a high-water mark exec carries over from the
                              copy of the caller the child started as */
};

/* Runs the plan to completion. Returns 0 with *out filled, or -errno with *step naming
 * the failed step (a static string); nothing is left running either way. The caller's
 * thread blocks; it may be one thread of many (the child makes only async-signal-safe
 * calls). */
int corral_tier_run(const struct corral_tier_plan *plan, struct corral_tier_result *out,
                    const char **step);

#endif
