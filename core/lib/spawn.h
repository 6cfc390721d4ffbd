/*
 * Spawning a tenant: one clone3 into new user, mount, pid, ipc, uts (and net, or a
 * pre-made netns) namespaces, a setup plan run in the child, then exec. A failed step
 * never execs: the child reports {step, errno} over a CLOEXEC pipe and exits, and the
 * parent returns that error.
 *
 * Process shape: the cloned child is pid 1 of the new pid namespace. It builds the root,
 * drops everything, installs the seccomp filter, then forks the tenant (pid 2) and stays
 * as its init: it reaps orphans and forwards SIGTERM/SIGINT/SIGHUP, which pid 1 would
 * otherwise ignore. Its exit takes every process of the namespace with it.
 */
#ifndef CORRAL_SPAWN_H
#define CORRAL_SPAWN_H

#include "exitcodes.h"

#include <stddef.h>
#include <sys/resource.h>
#include <stdint.h>
#include <sys/types.h>

#include "mount.h"
#include "seccomp.h"

struct corral_rlimit {
    int resource; /* RLIMIT_* */
    rlim_t cur, max;
};

/* A detached mount (mount.h, CORRAL_BIND_TREE) placed over a host path. */
struct corral_attach {
    int fd;
    const char *path;
};

struct corral_spawn_plan {
    const char *path;  /* resolved executable, as seen inside the new root */
    char *const *argv; /* NULL-terminated */
    char *const *envp; /* NULL-terminated, exactly what the tenant gets */
    const char *cwd;   /* inside the new root */
    const char *hostname;
    int new_net;       /* 1: a fresh empty netns (only lo, down) */
    int netns_fd;      /* >= 0: join this netns before the user ns exists (one owned by
                          another user namespace, of the caller's own: from inside it, and
                          the user ns is made beneath it) */
    uid_t outside_uid; /* host ids the tenant's root maps to */
    gid_t outside_gid;
    struct corral_root_plan root;
    const struct corral_bpf *seccomp; /* installed last; NULL: none */
    const struct corral_rlimit *rlimits;
    size_t n_rlimits;
    const int *cgroup_procs_fds; /* "cgroup.procs" files the parent writes the pid into */
    size_t n_cgroup_fds;
    int stdio[3];        /* -1: inherit */
    const int *keep_fds; /* inherited unchanged beyond 0-2 */
    size_t n_keep_fds;
    int plain;           /* 1: no namespaces, no root, no drops: join netns_fd (if >= 0), set stdio,
                            close fds but keep_fds, exec — for a helper that builds its own sandbox
                            (bubblewrap), still placed in a cgroup and a host-made netns */
    int plain_ids;       /* with plain: apply rlimits, then become outside_uid/gid (no groups)
                            before exec, the parent-death signal re-armed after */
    int plain_pidns;     /* with plain: in a new pid namespace whose init (this child) forks the
                            helper, so every process the helper makes dies with that init: a
                            helper's own die-with-parent comes too late when the spawner is
                            killed during the helper's start */
    int plain_session;   /* with plain: a new session (setsid), so a terminal's Ctrl-C, sent to
                            the caller's process group, does not reach the helper: the caller
                            decides what it forwards. Its stdin may still be the terminal (no
                            job control applies to a session's non-controlling terminal) */
    int plain_net_admin; /* with plain and a netns owned by a user namespace of the caller's
                            own: CAP_NET_ADMIN there kept across exec (ambient), for a host
                            tool that reads the netns's ruleset (`nft list ruleset`); a
                            process joining that user namespace is no root in it, and would
                            exec without any capability */
    const struct corral_attach *attach; /* with plain: the child unshares a mount
                        namespace of its own (private) and moves each detached mount over
                        its path there, while still privileged, so the helper sees them
                        where it expects its sources (an idmapped storage, a disk) and the
                        host's mount table never holds them */
    size_t n_attach;
    /* NULL, or called once in the parent after the child is released and before its
       report is awaited: the caller's own work done while the child builds the root
       (never on the path that joins a running sandbox directly) */
    void (*meanwhile)(void *arg);
    void *meanwhile_arg;
    int ctty;       /* 1: fd 0 (a pty's slave) becomes the controlling terminal of the
                       command's new session, and the command its foreground job */
    int join_pidfd; /* >= 0: run inside the namespaces of this running sandbox's init
                       (user, mount, pid, ipc, uts, net, cgroup) instead of new ones;
                       root, hostname and maps are then that sandbox's */
};

struct corral_spawn_result {
    pid_t pid; /* pid 1 of the sandbox, in the host's pid namespace; joined (join_pidfd):
                  the command itself, the leader of its own process group (a job) */
    int pidfd; /* CLOEXEC pidfd of that process */
    int job;   /* 1: pid is a job, whose group gets the terminal's signals (reaper.h) */
};

/* Spawns per plan. Returns 0, or -errno with *step naming the failed step (a static
 * string). On failure nothing is left running. */
int corral_spawn(const struct corral_spawn_plan *plan, struct corral_spawn_result *out,
                 const char **step);

/* The signals whose disposition here is not the default (caught or ignored; bit sig - 1),
 * from one read of /proc/self/status; all of them when it cannot be read. Only system
 * calls and stack memory: a spawn's child may call it. */
uint64_t corral_signals_set_aside(void);

/* Signals a process through its pidfd (a recycled pid can never be hit). 0 or -errno. */
int corral_pidfd_signal(int pidfd, int sig);

/* The exit status of a spawn child whose setup failed before exec (exitcodes.h). A
 * tenant's init otherwise reports the tenant's own status, or 128+N when it was killed
 * by signal N. */
#define CORRAL_SPAWN_EXEC_FAILED CORRAL_EXIT_NOTFOUND

#endif
