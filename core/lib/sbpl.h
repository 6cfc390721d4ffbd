/*
 * SBPL emission: the text of a macOS sandbox-exec profile for the control-plane
 * confinement (a trusted process, egress permitted, one data boundary). Text only;
 * sandbox-exec compiles it on macOS, never here.
 */
#ifndef CORRAL_SBPL_H
#define CORRAL_SBPL_H

#include <stddef.h>

struct corral_sbpl_spec {
    const char *permit_path;   /* resolved, absolute */
    const char *const *extras; /* resolved, absolute; emitted after the deny */
    size_t n_extras;
    const char *const *runtime_reads; /* what a process needs to start (read-only) */
    size_t n_runtime_reads;
    const char *const *files; /* resolved regular files, each granted alone, read-only */
    size_t n_files;
    const char *const *sockets; /* resolved unix sockets, each granted alone to connect to */
    size_t n_sockets;
};

/* Returns 0 and a malloc'd NUL-terminated profile in *out, or -EINVAL when a path is
 * relative or contains a NUL or a newline, -ENOMEM. */
int corral_sbpl_emit(const struct corral_sbpl_spec *spec, char **out);

/* The per-path test corral_sbpl_emit applies to every path it is given, exposed so a
 * binding can name the offending argument: absolute, no newline or CR, and canonical
 * (no `.`/`..` component, no `//`, no trailing slash), since the filters only ever
 * match resolved paths. Returns 0 or -EINVAL. */
int corral_sbpl_check_path(const char *path);

#endif
