/*
 * Resource cgroups for tenants, on cgroup v1, v2, or both (hybrid).
 *
 * Own subtree only (docs/architecture.md, invariant 7): a cgroup is always created as a
 * new directory beneath the cgroup this process already runs in, per hierarchy, as read
 * from /proc/self/cgroup; limits are written only into directories created here, and a
 * process is only ever moved into one of them.
 *
 * Fail closed: a limit that was asked for and cannot be written fails the creation;
 * corral_cgroup_held() reports exactly which limits are in force.
 */
#ifndef CORRAL_CGROUP_H
#define CORRAL_CGROUP_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Controller roles of a hierarchy, and limits held by a cgroup. */
#define CORRAL_CG_MEMORY 0x01u  /* memory cap, peak, OOM kill count */
#define CORRAL_CG_PIDS 0x02u    /* process-count cap */
#define CORRAL_CG_CPU 0x04u     /* CPU bandwidth cap */
#define CORRAL_CG_CPUACCT 0x08u /* CPU time accounting */
#define CORRAL_CG_MEMSW 0x10u   /* held: swap counted against (v1) or barred from (v2) the cap */
#define CORRAL_CG_KILL 0x20u    /* cgroup.kill (v2, Linux 5.14) */

#define CORRAL_CGROUP_V1 1
#define CORRAL_CGROUP_V2 2

#define CORRAL_CG_MAXHIER 5 /* memory, pids, cpu, cpuacct (v1) and the v2 hierarchy */

struct corral_cgroup_hier {
    char dir[PATH_MAX];   /* this process's own cgroup directory in the hierarchy */
    unsigned controllers; /* CORRAL_CG_* roles it serves */
    int version;          /* CORRAL_CGROUP_V1 or CORRAL_CGROUP_V2 */
};

struct corral_cgroup_info {
    int version;          /* CORRAL_CGROUP_V1 | CORRAL_CGROUP_V2 bits present */
    unsigned controllers; /* union of the hierarchies' roles */
    size_t n;
    struct corral_cgroup_hier hier[CORRAL_CG_MAXHIER];
};

/* Describes the hierarchies usable here: v1 hierarchies carrying memory, pids, cpu or
 * cpuacct, and the v2 hierarchy with the controllers its subtree_control hands to
 * children (cpu.stat accounting and cgroup.kill come with any v2 cgroup). Returns 0 or
 * -errno (-ENOENT: no cgroup hierarchy is mounted). */
int corral_cgroup_info(struct corral_cgroup_info *out);

/* CORRAL_CGROUP_V1 | CORRAL_CGROUP_V2 bits for the hierarchies corral can use, or
 * -errno. */
int corral_cgroup_version(void);

/* 0 means unlimited. cpu_period_us defaults to 100000 when a quota is set. */
struct corral_cgroup_limits {
    uint64_t memory_bytes;
    uint64_t pids;
    uint32_t cpu_quota_us;
    uint32_t cpu_period_us;
};

struct corral_cgroup;

/* Creates directory NAME (NULL: a unique "corral-<pid>-<n>"; no '/', not "." or "..")
 * mode 0755 beneath this process's cgroup in every usable hierarchy, opens each
 * cgroup.procs for the attach calls, and writes the limits. A limit whose controller is
 * missing is -EOPNOTSUPP; an existing directory is -EEXIST (never adopted). v1 memory
 * also caps memory+swap (memory.memsw.limit_in_bytes, when swap accounting exists) and
 * keeps the OOM killer enabled; v2 memory sets memory.swap.max to 0. On failure nothing
 * is left behind and *out is NULL. */
int corral_cgroup_create(const char *name, const struct corral_cgroup_limits *limits,
                         struct corral_cgroup **out);

/* Moves pid (a whole thread group) into the cgroup in every hierarchy. Returns 0 or
 * -errno; after a failure the process may be attached in some hierarchies only, so the
 * caller must not run it. */
int corral_cgroup_attach(struct corral_cgroup *cg, pid_t pid);

/* Moves the calling process in, through the cgroup.procs fds opened by create: only
 * write(2) calls, so it is async-signal-safe for a child forked from a multi-threaded
 * parent, right before exec. The fds are CLOEXEC: the exec'd program does not get them. */
int corral_cgroup_attach_self_fds(const struct corral_cgroup *cg);

struct corral_cgroup_usage {
    unsigned have;        /* CORRAL_CG_MEMORY, CORRAL_CG_PIDS, CORRAL_CG_CPUACCT: valid */
    uint64_t memory_peak; /* bytes; v2 kernels before 5.19 lack memory.peak: current */
    uint64_t memory_current;
    uint64_t oom_kills; /* processes killed by the cgroup's OOM killer */
    uint64_t pids_current;
    uint64_t cpu_ns;
};

int corral_cgroup_usage(const struct corral_cgroup *cg, struct corral_cgroup_usage *out);

/* Kills every process in the cgroup (v2: cgroup.kill; v1: SIGKILL to each listed pid
 * through a pidfd, so a recycled pid is never signalled) and waits, bounded (~2 s),
 * until no hierarchy lists a process. Returns 0, -EBUSY on timeout, -EDEADLK if the
 * calling process is inside. */
int corral_cgroup_kill(struct corral_cgroup *cg);

/* Kills, then removes every directory create made; idempotent, and accepts a
 * half-built object. The object stays valid (for a retry) until corral_cgroup_free. */
int corral_cgroup_remove(struct corral_cgroup *cg);

/* Closes the fds and frees the object (NULL is fine). Does not remove directories. */
void corral_cgroup_free(struct corral_cgroup *cg);

/* corral_cgroup_remove, then corral_cgroup_free whatever the outcome (NULL is fine).
 * Returns the remove result. */
int corral_cgroup_destroy(struct corral_cgroup *cg);

/* Limits in force (CORRAL_CG_MEMORY, CORRAL_CG_MEMSW, CORRAL_CG_PIDS, CORRAL_CG_CPU). */
unsigned corral_cgroup_held(const struct corral_cgroup *cg);

/* The directory created in hierarchy i (NULL past the end or once removed), and its
 * roles in *controllers when not NULL. */
const char *corral_cgroup_path(const struct corral_cgroup *cg, size_t i, unsigned *controllers);

#endif
