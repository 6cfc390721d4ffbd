/*
 * The root plan: what a confined process's root shows of the host, and what may never
 * be a boundary in it. One table each, read by exec-confined's native and bubblewrap
 * layers (core/host/confine.c, confine_bwrap.c) and, through core.rootplan, by the tenant
 * mechanisms, the Lua side of confinement and tier S1's policy.
 */
#ifndef CORRAL_ROOTPLAN_H
#define CORRAL_ROOTPLAN_H

#include <stddef.h>

#include "mount.h"

/* The runtime read set: what a process needs to start, shown read-only (and granted
 * read+execute) to a confined process. At most CORRAL_ROOTPLAN_RUNTIME_MAX entries, so
 * a caller can size its arrays at compile time. */
#define CORRAL_ROOTPLAN_RUNTIME_MAX 16
const char *const *corral_rootplan_runtime(size_t *n);

/* The system's programs and libraries: the runtime read set without /etc. */
const char *const *corral_rootplan_programs(size_t *n);

/* The files of /etc a dynamic program reads to start, and those a program that uses
 * the network reads besides: for a grant that shows /etc file by file (tier S1). */
const char *const *corral_rootplan_startup_files(size_t *n);
const char *const *corral_rootplan_network_files(size_t *n);

/* The name-service files a tenant sandbox sees of its own over the runtime's /etc (its
 * hosts file, resolv.conf, nsswitch.conf, host.conf), so every name it looks up reaches
 * its own responder. */
const char *const *corral_rootplan_name_files(size_t *n);

/* Credential stores inside the runtime read set, covered in a confined root (an empty
 * directory over a directory, /dev/null over a file) or left out of its Landlock grant. */
const char *const *corral_rootplan_masked(size_t *n);

/* The kernel's and the devices' interfaces: never a boundary. */
const char *const *corral_rootplan_system(size_t *n);

/* The device nodes a confined process may read, write and ioctl: the data devices
 * (null, zero, full, random, urandom) and the controlling terminal. */
const char *const *corral_rootplan_devices(size_t *n);

/* The data devices alone, for a process that must not reach the operator's terminal
 * (tier S1: its stdio is inherited, /dev/tty is not granted). */
const char *const *corral_rootplan_data_devices(size_t *n);

/* The scratch directories a confined root with a mount namespace gets as private
 * tmpfs instances (/tmp, /var/tmp, /run), each with its mode and size cap: programs
 * expect them writable, and the host's would be shared with every other process. */
const struct corral_tmpfs *corral_rootplan_scratch(size_t *n);

/* The tmpfs options of a private HOME (mode 0700, capped as the scratch ones). */
const char *corral_rootplan_home_options(void);

/* Why a resolved path may not be a boundary (--permit, --extra, --cd), or a single file
 * granted alone (--extra FILE). */
enum corral_boundary {
    CORRAL_BOUNDARY_OK = 0,
    CORRAL_BOUNDARY_ROOT,    /* "/" itself */
    CORRAL_BOUNDARY_SYSTEM,  /* beneath a system path */
    CORRAL_BOUNDARY_RUNTIME, /* beneath a runtime path, which stays read-only */
    CORRAL_BOUNDARY_MASKED,  /* a credential store (or beneath one), which stays covered */
};

/* Checks a resolved absolute path against the boundary rules: not "/", not beneath a
 * system path, not beneath a runtime path. Returns the verdict; when it is not OK and
 * why is not NULL, writes the reason as a phrase that follows the path ("would confine
 * nothing", "is inside the runtime read set (/etc), which stays read-only") into why
 * (truncated to len). */
enum corral_boundary corral_rootplan_check_boundary(const char *resolved, char *why, size_t len);

/* Checks a resolved file (a regular file or a socket, granted alone) the same way: not
 * a masked credential store nor beneath one, not beneath a system path, not beneath a
 * runtime path (shown read-only already: a grant there adds nothing). Writes the reason
 * as check_boundary does. */
enum corral_boundary corral_rootplan_check_file(const char *resolved, char *why, size_t len);

/* "ok", "root", "system", "runtime" or "masked". */
const char *corral_boundary_name(enum corral_boundary b);

#endif
