/*
 * The namespace layer of `corral exec-confined`, built by the system's bubblewrap for
 * hosts where corral cannot build it itself (e.g. user namespaces reserved to a setuid
 * bwrap). The same root as the native layer: runtime read-only, the boundary read-write,
 * the command, resolv.conf's target, a fresh /proc, a minimal /dev, a pid namespace; the
 * network and the environment are left as they are. With Landlock asked for as well, the
 * command inside bubblewrap is `corral exec-confined --layers landlock …`, so Landlock
 * is applied on top, inside the namespace.
 */
#ifndef CORRAL_CONFINE_BWRAP_H
#define CORRAL_CONFINE_BWRAP_H

#include <stddef.h>

#include "confine_readonly.h"
#include "mount.h"

struct corral_bwrap_layer {
    const char *permit_src;        /* where bubblewrap reads the boundary from (an fd path) */
    const char *const *extra_srcs; /* the same for each extra */
    const char *const *masks;      /* paths covered inside (see corral_root_plan.masks) */
    size_t n_masks;
    const char *const *identities; /* "DEV:INO" of the permit, then of each extra */
    const char *permit;
    char *const *extras;
    const int *extra_rw; /* per extra: a directory, bound read-write; else a file or a
                            socket, bound read-only */
    size_t n_extras;
    /* the read-only plan (confine_readonly.h), each bound from ro_srcs[i] (an fd path);
       the inner wrapper reads each back */
    const struct corral_ro_bind *ro;
    const char *const *ro_srcs;
    size_t n_ro;
    const struct corral_tmpfs *tmpfs; /* private, before the binds; bubblewrap takes
                                         the mode and no size cap before 0.9 */
    size_t n_tmpfs;
    const char *cd;
    const char *cmd;   /* resolved */
    char *const *argv; /* argv[0] .. NULL */
    int with_landlock;
};

/* Execs bubblewrap; returns only on failure (-errno). */
int corral_confine_bwrap_exec(const struct corral_bwrap_layer *l);

#endif
