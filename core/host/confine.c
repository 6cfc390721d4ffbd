/*
 * `corral exec-confined`: the control-plane confinement wrapper.
 *
 *   corral exec-confined --permit DIR [--extra PATH]… [--read-only PATH]… [--cd DIR]
 *                        [--layers ns,landlock] -- CMD ARGS…
 *
 * Two layers, because neither alone holds:
 *  ns        a user (when not root) + mount + pid namespace whose root shows only the
 *            runtime read set (read-only), the boundary (read-write) and the command,
 *            with a fresh /proc. Outside files are absent, so chmod/chown/utime/xattr,
 *            unix-socket connects and device nodes outside cannot be named at all —
 *            the gaps Landlock leaves (see landlock.c).
 *  landlock  read+write+create beneath the boundary, read+execute on the runtime set,
 *            abstract-unix and signal scopes (ABI 6+). Closes what a namespace cannot:
 *            magic links (/proc/PID/root, /proc/self/fd/N) and directory fds that were
 *            open before the boundary.
 * Then every capability is dropped, no_new_privs set, and the command executed with the
 * environment untouched. The network is never unshared: egress is the control plane's.
 *
 * A layer that is asked for and cannot be built is fatal (exit 125, nothing executed):
 * the caller (lua/corral/confinement.lua) decides which layers hold on this host and
 * names them; this wrapper never quietly runs with less.
 *
 * Process shape with the ns layer: the wrapper (outside, waits and forwards signals) →
 * pid 1 of the new pid namespace (builds the root, applies Landlock, reaps, forwards) →
 * the command. pid 1 ignores signals it has no handler for, so the command must not be
 * pid 1 or SIGTERM from the caller would be lost.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "caps.h"
#include "confine.h"
#include "confine_bwrap.h"
#include "confine_readonly.h"
#include "landlock.h"
#include "mount.h"
#include "ns.h"
#include "path.h"
#include "reaper.h"
#include "rootplan.h"
#include "seccomp.h"
#include "seccomp_tables.h" /* generated, see core/gen/seccomp_tables.c */
#include "util.h"

#define MAX_EXTRAS 64

/* The root plan's tables (rootplan.h), fetched once: every user below is in this file. */
static const char *const *runtime_paths, *const *masked_paths, *const *device_paths;
static size_t n_runtime, n_masked, n_devices;

static void load_root_plan(void)
{
    runtime_paths = corral_rootplan_runtime(&n_runtime);
    masked_paths = corral_rootplan_masked(&n_masked);
    device_paths = corral_rootplan_devices(&n_devices);
}

/* What an --extra grants: a directory read-write, a file read-only, a socket to connect
 * to (EXTRA_NONE: anything else, refused). */
enum extra_kind { EXTRA_DIR, EXTRA_FILE, EXTRA_SOCKET, EXTRA_NONE };

struct confine_opts {
    char *permit;
    int permit_fd; /* O_PATH, taken when it was checked (see open_grant) */
    char *extras[MAX_EXTRAS];
    int extra_fds[MAX_EXTRAS];
    enum extra_kind extra_kinds[MAX_EXTRAS];
    size_t n_extras;
    char *home; /* resolved; a private tmpfs there (see plan_home), or NULL */
    char *cd;
    /* --read-only: paths beneath the boundary bound read-only (confine_readonly.h) */
    char *read_only[CORRAL_RO_MAX];
    int read_only_fds[CORRAL_RO_MAX];
    size_t n_read_only;
    struct corral_ro_bind ro[CORRAL_RO_MAX]; /* their plan */
    size_t n_ro;
    int layer_ns, layer_landlock, layer_bwrap;
    /* "DEV:INO" the permit, then each extra, must be (the bwrap layer's inner wrapper) */
    const char *identities[MAX_EXTRAS + 1];
    size_t n_identities;
    char *cmd;  /* resolved */
    int cmd_fd; /* O_PATH on it, opened symlink-free; -1 when not absolute or absent */
    char **argv;
};

/* --probe-cache FILE: the probe results the layers were chosen by. A wrapper that fails
 * drops them (the host no longer matches what was probed), through a directory fd opened
 * before any namespace or Landlock step, so the file is reached from wherever it fails. */
static int probe_cache_dir = -1;
static const char *probe_cache_name;

static void open_probe_cache(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (path[0] != '/' || !slash || slash[1] == '\0' ||
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) >= (int)sizeof dir)
        return;
    probe_cache_dir = open(dir[0] ? dir : "/", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    probe_cache_name = slash + 1;
}

/* Set when the failure diag reported was a resource running out (corral_errno_transient):
 * the wrapper then exits START_REFUSED, as a run does, not SETUP. */
static int ran_out;

__attribute__((format(printf, 2, 3))) static void diag(int err, const char *fmt, ...)
{
    /* The wrapper's only output: one line on stderr before it exits. A resource that ran
     * out says nothing of the host's layers: the probe cache stays. */
    if (err && corral_errno_transient(err))
        ran_out = 1;
    else if (probe_cache_dir >= 0)
        unlinkat(probe_cache_dir, probe_cache_name, 0);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "corral exec-confined: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (err) fprintf(stderr, ": %s", strerror(err < 0 ? -err : err));
    if (ran_out)
        fputs(" (a resource ran out for a moment; not a protection this host lacks)", stderr);
    fputc('\n', stderr);
}

/* The status of a layer that could not be built: START_REFUSED when a resource ran out. */
static int setup_status(void)
{
    return ran_out ? CORRAL_EXIT_START_REFUSED : CORRAL_EXIT_SETUP;
}

/* A resolved path opened with no symlink anywhere on it (core/lib/path.c); binds and
 * Landlock rules then use this fd, not the path (docs/architecture.md, invariant 3).
 * Without openat2 (a wrapper run inside a confinement, whose filter answers ENOSYS) it
 * walks the path instead. */
static int open_no_symlinks(const char *path, int want_dir)
{
    return corral_open_no_symlinks(AT_FDCWD, path, O_PATH | (want_dir ? O_DIRECTORY : 0),
                                   CORRAL_OPEN_WALK);
}

/* The fd a grant is made from: the value itself, not its resolution, is opened. A launch
 * spec carries resolved paths, so a symlink on the way now means the path changed after
 * the spec was made. */
static int open_grant(const char *opt, const char *value, const char *resolved, int want_dir,
                      int *fd_out)
{
    *fd_out = open_no_symlinks(value, want_dir);
    if (*fd_out == -ELOOP || *fd_out == -EXDEV) {
        diag(0, "%s %s passes through a symlink; give the resolved path (%s)", opt, value,
             resolved);
        return -EINVAL;
    }
    if (*fd_out < 0) {
        diag(*fd_out, "%s %s changed while it was checked", opt, value);
        return *fd_out;
    }
    return 0;
}

static int check_line(const char *opt, const char *value)
{
    if (value[0] != '/') {
        diag(0, "%s must be an absolute path", opt);
        return -EINVAL;
    }
    if (strpbrk(value, "\n\r")) {
        diag(0, "%s must not contain a line break", opt);
        return -EINVAL;
    }
    return 0;
}

static int resolve_dir_arg(const char *opt, const char *value, char **out, int *fd_out)
{
    int r = check_line(opt, value);
    if (r < 0) return r;
    r = corral_resolve_dir(value, out);
    if (r < 0) {
        diag(r, "cannot resolve %s %s", opt, value);
        return r;
    }
    char why[PATH_MAX + 64];
    if (corral_rootplan_check_boundary(*out, why, sizeof why) != CORRAL_BOUNDARY_OK) {
        diag(0, "%s %s %s", opt, *out, why);
        return -EINVAL;
    }
    return fd_out ? open_grant(opt, value, *out, 1, fd_out) : 0;
}

/* --extra: a directory (read-write, as --permit), or one regular file (read-only) or
 * unix socket (to connect to) granted alone, so that an agent's ssh-agent socket can be
 * given without the directory of every other user's socket beside it. */
static int resolve_extra_arg(const char *value, char **out, int *fd_out, enum extra_kind *kind)
{
    const char *opt = "--extra";
    int r = check_line(opt, value);
    if (r < 0) return r;
    struct stat st;
    r = corral_resolve_file(value, out);
    if (r == 0 && stat(*out, &st) < 0) r = -errno;
    if (r < 0) {
        diag(r, "cannot resolve %s %s", opt, value);
        return r;
    }
    if (S_ISDIR(st.st_mode)) {
        *kind = EXTRA_DIR;
        free(*out);
        *out = NULL;
        return resolve_dir_arg(opt, value, out, fd_out);
    }
    *kind = S_ISREG(st.st_mode) ? EXTRA_FILE : S_ISSOCK(st.st_mode) ? EXTRA_SOCKET : EXTRA_NONE;
    if (*kind == EXTRA_NONE) {
        diag(0, "%s %s is neither a directory, a regular file nor a unix socket", opt, *out);
        return -EINVAL;
    }
    char why[PATH_MAX + 64];
    if (corral_rootplan_check_file(*out, why, sizeof why) != CORRAL_BOUNDARY_OK) {
        diag(0, "%s %s %s", opt, *out, why);
        return -EINVAL;
    }
    r = open_grant(opt, value, *out, 0, fd_out);
    if (r == 0 && (fstat(*fd_out, &st) < 0 ||
                   (st.st_mode & S_IFMT) != (*kind == EXTRA_FILE ? S_IFREG : S_IFSOCK))) {
        diag(0, "%s %s changed while it was checked", opt, value);
        r = -ESTALE;
    }
    return r;
}

/* --read-only: a file or directory beneath the boundary (checked once every boundary
 * directory is known, see plan_read_only), with one name if a file: another name of it
 * would stay writable. */
static int resolve_read_only_arg(const char *value, char **out, int *fd_out)
{
    const char *opt = "--read-only";
    int r = check_line(opt, value);
    if (r == 0 && (r = corral_resolve_file(value, out)) < 0)
        diag(r, "cannot resolve %s %s", opt, value);
    if (r == 0) r = open_grant(opt, value, *out, 0, fd_out);
    if (r < 0) return r;
    struct stat st;
    if (fstat(*fd_out, &st) < 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
        diag(0, "%s %s is neither a file nor a directory", opt, *out);
        return -EINVAL;
    }
    if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
        diag(0, "%s %s has %lu hard links: another of its names could still be written", opt, *out,
             (unsigned long)st.st_nlink);
        return -EINVAL;
    }
    return 0;
}

static int parse_layers(const char *s, struct confine_opts *o)
{
    o->layer_ns = o->layer_landlock = o->layer_bwrap = 0;
    int checks = 0;
    char buf[64];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return -EINVAL;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "ns") == 0)
            o->layer_ns = 1;
        else if (strcmp(t, "landlock") == 0)
            o->layer_landlock = 1;
        else if (strcmp(t, "bwrap") == 0)
            o->layer_bwrap = 1;
        else if (strcmp(t, "checks") == 0)
            checks = 1; /* the bwrap layer's inner wrapper without Landlock */
        else
            return -EINVAL;
    }
    if (o->layer_ns && o->layer_bwrap) return -EINVAL; /* one namespace layer */
    if (checks) return o->layer_ns || o->layer_landlock || o->layer_bwrap ? -EINVAL : 0;
    return o->layer_ns || o->layer_landlock || o->layer_bwrap ? 0 : -EINVAL;
}

/* Whether path is the boundary or beneath it: --permit or a directory --extra. */
static int inside_boundary(const struct confine_opts *o, const char *path)
{
    int inside = corral_is_beneath(path, o->permit);
    for (size_t i = 0; i < o->n_extras; i++)
        inside |= o->extra_kinds[i] == EXTRA_DIR && corral_is_beneath(path, o->extras[i]);
    return inside;
}

/* A file or socket inside a granted directory is granted already; bound alone over
 * itself it would only turn read-only, or fail on a socket that cannot be opened. */
static int check_file_extras(const struct confine_opts *o)
{
    for (size_t i = 0; i < o->n_extras; i++) {
        if (o->extra_kinds[i] == EXTRA_DIR || !inside_boundary(o, o->extras[i])) continue;
        diag(0, "--extra %s is inside the boundary (--permit or a directory --extra) already",
             o->extras[i]);
        return -EINVAL;
    }
    return 0;
}

/* The binds of the --read-only paths: each strictly beneath a boundary directory, and
 * only with a layer that has a mount namespace to bind them in (ns, bwrap, or the bwrap
 * layer's inner wrapper, which reads them back). */
static int plan_read_only(struct confine_opts *o)
{
    if (o->n_read_only == 0) return 0;
    if (!o->layer_ns && !o->layer_bwrap && o->n_identities == 0) {
        diag(0, "--read-only needs the ns or bwrap layer: Landlock alone cannot take a path "
                "out of the tree it grants");
        return -EINVAL;
    }
    const char *roots[1 + MAX_EXTRAS];
    size_t n_roots = 0;
    roots[n_roots++] = o->permit;
    for (size_t i = 0; i < o->n_extras; i++)
        if (o->extra_kinds[i] == EXTRA_DIR) roots[n_roots++] = o->extras[i];
    const char *bad = "";
    int n =
        corral_ro_plan(roots, n_roots, o->read_only, o->read_only_fds, o->n_read_only, o->ro, &bad);
    if (n == -EINVAL)
        diag(0, "--read-only %s is not beneath the boundary (--permit or a directory --extra)",
             bad);
    else if (n < 0)
        diag(n, "--read-only %s", bad);
    if (n < 0) return n;
    o->n_ro = (size_t)n;
    return 0;
}

static int parse(int argc, char **argv, struct confine_opts *o)
{
    o->layer_ns = o->layer_landlock = 1;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc) {
            diag(0, "%s needs a value", a);
            return -EINVAL;
        }
        const char *v = argv[++i];
        int r = 0;
        if (strcmp(a, "--permit") == 0) {
            if (o->permit) {
                diag(0, "%s given twice", a);
                return -EINVAL;
            }
            r = resolve_dir_arg(a, v, &o->permit, &o->permit_fd);
        } else if (strcmp(a, "--extra") == 0) {
            if (o->n_extras == MAX_EXTRAS) {
                diag(0, "too many %s", a);
                return -E2BIG;
            }
            r = resolve_extra_arg(v, &o->extras[o->n_extras], &o->extra_fds[o->n_extras],
                                  &o->extra_kinds[o->n_extras]);
            o->n_extras++;
        } else if (strcmp(a, "--cd") == 0) {
            r = resolve_dir_arg(a, v, &o->cd, NULL);
        } else if (strcmp(a, "--read-only") == 0) {
            if (o->n_read_only == CORRAL_RO_MAX) {
                diag(0, "too many %s", a);
                return -E2BIG;
            }
            r = resolve_read_only_arg(v, &o->read_only[o->n_read_only],
                                      &o->read_only_fds[o->n_read_only]);
            o->n_read_only++;
        } else if (strcmp(a, "--identity") == 0) {
            if (o->n_identities == MAX_EXTRAS + 1) {
                diag(0, "too many %s", a);
                return -E2BIG;
            }
            o->identities[o->n_identities++] = v;
        } else if (strcmp(a, "--probe-cache") == 0) {
            open_probe_cache(v);
        } else if (strcmp(a, "--layers") == 0) {
            r = parse_layers(v, o);
            if (r < 0)
                diag(0, "--layers takes ns or bwrap, and/or landlock (e.g. ns,landlock), not %s",
                     v);
        } else {
            diag(0, "unknown option %s", a);
            return -EINVAL;
        }
        if (r < 0) return r;
    }
    if (!o->permit) {
        diag(0, "%s is required", "--permit");
        return -EINVAL;
    }
    if (i >= argc) {
        diag(0, "no command after %s", "--");
        return -EINVAL;
    }
    int r = corral_resolve_executable(argv[i], getenv("PATH"), &o->cmd);
    if (r < 0) {
        diag(r, "cannot resolve %s", argv[i]);
        return r;
    }
    o->argv = &argv[i];
    if (!o->cd) o->cd = o->permit;
    if ((r = check_file_extras(o)) < 0) return r;
    if ((r = plan_read_only(o)) < 0) return r;
    /* The command's grant (its bind and its Landlock rule) comes from this fd, so a
     * symlink swapped in after resolution cannot widen it to a directory. */
    o->cmd_fd = -1;
    if (o->cmd[0] == '/') {
        o->cmd_fd = open_no_symlinks(o->cmd, 0);
        struct stat st;
        if (o->cmd_fd >= 0 && (fstat(o->cmd_fd, &st) < 0 || !S_ISREG(st.st_mode))) {
            diag(0, "%s is not a regular file", o->cmd);
            return -EINVAL;
        }
        if (o->cmd_fd < 0 && o->cmd_fd != -ENOENT) {
            diag(o->cmd_fd, "%s changed after it was resolved", o->cmd);
            return o->cmd_fd;
        }
    }
    return 0;
}

/* Inherited stdio that is a directory would let the command list and fchmod it
 * without any path lookup, past both layers: refuse rather than run. */
static int check_stdio(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
            char what[16];
            snprintf(what, sizeof what, "fd %d", fd);
            diag(0, "%s is a directory; an inherited directory would lead out of the boundary",
                 what);
            return -EBADF;
        }
    }
    return 0;
}

static int same_identity(int fd, const char *want)
{
    struct stat st;
    char got[64];
    if (fstat(fd, &st) < 0) return 0;
    snprintf(got, sizeof got, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return strcmp(got, want) == 0;
}

/* With --identity, the permit and each extra must be the very directories the outer
 * wrapper checked (see confine_bwrap.c): a swap bubblewrap followed is refused here. */
static int check_identities(const struct confine_opts *o)
{
    if (o->n_identities == 0) return 0;
    if (o->n_identities != 1 + o->n_extras) {
        diag(0, "--identity must be given for --permit and each --extra (%zu, not %zu)",
             1 + o->n_extras, o->n_identities);
        return -EINVAL;
    }
    for (size_t i = 0; i < o->n_identities; i++) {
        int fd = i == 0 ? o->permit_fd : o->extra_fds[i - 1];
        if (!same_identity(fd, o->identities[i])) {
            diag(0, "%s changed after it was checked (not the directory %s)",
                 i == 0 ? o->permit : o->extras[i - 1], o->identities[i]);
            return -ESTALE;
        }
    }
    return 0;
}

/* Set when the command runs as uid 0 of a user namespace whose uid 0 is the host's
 * root (a root caller's ns layer): it then keeps CAP_SETFCAP there, see below. */
static int keep_setfcap;

/* Namespaces for the ns layer: a user namespace mapping the caller's own ids, so files
 * in the boundary keep their owner, with a mount, pid and IPC namespace.
 *
 * A root caller gets one too, mapping uid and gid 0 alone, so that a sandbox nested
 * inside can map ids: the kernel lets a user namespace map its parent's uid 0 only for a
 * creator holding CAP_SETFCAP in the parent (Linux 5.12), and the host's namespace may
 * keep no capability. A file capability written with CAP_SETFCAP would still be owned by
 * host root, so the command also gets a filter refusing every extended attribute
 * (corral_seccomp_noxattr_program), as the setuid bit is refused. Root unable to make a
 * user namespace gets the other three alone, and nesting then stops at the id map. */
static int enter_namespaces(void)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    /* An IPC namespace too: SysV shared memory and message queues are not files, so
     * neither layer would keep a host segment from being read or removed. */
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC;
    if (unshare(CLONE_NEWUSER | flags) < 0) {
        if (uid == 0 && unshare(flags) == 0) return 0;
        return -errno;
    }
    /* setgroups first: a kernel before 3.19 has no such file (ENOENT), and once "deny"
     * is written the gid map is taken without a retry. */
    int r = corral_write_file("/proc/self/setgroups", "deny", 4);
    if (r < 0 && r != -ENOENT) return r;
    struct corral_id_map u = {uid, uid, 1}, g = {gid, gid, 1};
    r = corral_ns_write_maps(0, &u, 1, &g, 1);
    keep_setfcap = r == 0 && uid == 0;
    return r;
}

/* HOME is writable inside, whatever layer builds the root, and its writes never reach
 * the host's HOME (which holds the caller's keys and configuration):
 *  - HOME inside the boundary: left as it is;
 *  - with a mount namespace (ns, bwrap): a private tmpfs at HOME's resolved path, empty
 *    at each start and gone at exit (HOME is set to that path where it went through a
 *    symlink, as the link may not exist inside);
 *  - otherwise (Landlock alone, which cannot mount, or a HOME that is missing, "/", or
 *    inside the runtime or system paths): HOME is set to DIR/.corral-home, made 0700 in
 *    the --permit directory and kept between runs (left as it was where DIR is not
 *    writable, or the name is taken by anything but a directory).
 * An unset or relative HOME is left alone. */
#define FALLBACK_HOME ".corral-home"

static int plan_home(struct confine_opts *o, int private_mounts)
{
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') return 0;
    char *resolved = NULL;
    if (!strpbrk(home, "\n\r") && corral_resolve_dir(home, &resolved) == 0) {
        if (inside_boundary(o, resolved)) {
            free(resolved);
            return 0;
        }
        if (private_mounts &&
            corral_rootplan_check_boundary(resolved, NULL, 0) == CORRAL_BOUNDARY_OK) {
            o->home = resolved;
            return strcmp(resolved, home) == 0 || setenv("HOME", resolved, 1) == 0 ? 0 : -errno;
        }
        free(resolved);
    }
    /* Made through the checked fd: a symlink planted at the name is refused, not followed.
     * Where none can be made (a read-only DIR), HOME stays as it was: no protection rests
     * on it, and Landlock keeps the caller's HOME out either way. */
    if (mkdirat(o->permit_fd, FALLBACK_HOME, 0700) < 0 && errno != EEXIST) return 0;
    int fd = openat(o->permit_fd, FALLBACK_HOME, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    close(fd);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", o->permit, FALLBACK_HOME) >= (int)sizeof path)
        return -ENAMETOOLONG;
    return setenv("HOME", path, 1) == 0 ? 0 : -errno;
}

/* The private tmpfs instances a root with a mount namespace gets: the scratch
 * directories not inside the boundary, then HOME (rootplan.h). Returns how many. */
static size_t private_tmpfs(const struct confine_opts *o, struct corral_tmpfs *out)
{
    size_t n_scratch, n = 0;
    const struct corral_tmpfs *scratch = corral_rootplan_scratch(&n_scratch);
    for (size_t i = 0; i < n_scratch; i++)
        if (!inside_boundary(o, scratch[i].path)) out[n++] = scratch[i];
    if (o->home) out[n++] = (struct corral_tmpfs){o->home, corral_rootplan_home_options()};
    return n;
}

#define MAX_TMPFS 8

static int covered_by_runtime(const char *path)
{
    for (size_t i = 0; i < n_runtime; i++)
        if (corral_is_beneath(path, runtime_paths[i])) return 1;
    return 0;
}

static int build_root(const struct confine_opts *o)
{
    struct corral_bind binds[CORRAL_ROOTPLAN_RUNTIME_MAX + MAX_EXTRAS + CORRAL_RO_MAX + 3];
    struct corral_symlink links[CORRAL_ROOTPLAN_RUNTIME_MAX];
    char targets[CORRAL_ROOTPLAN_RUNTIME_MAX][PATH_MAX];
    size_t nb = 0, nl = 0;
    for (size_t i = 0; i < n_runtime; i++) {
        /* Merged-/usr hosts have /bin -> usr/bin: recreate the link, not a second copy. */
        ssize_t n = readlink(runtime_paths[i], targets[nl], PATH_MAX - 1);
        if (n > 0) {
            targets[nl][n] = '\0';
            links[nl].target = targets[nl];
            links[nl].linkpath = runtime_paths[i];
            nl++;
            continue;
        }
        binds[nb++] =
            (struct corral_bind){runtime_paths[i], runtime_paths[i], CORRAL_BIND_OPTIONAL, -1};
    }
    binds[nb++] = (struct corral_bind){o->permit, o->permit, CORRAL_BIND_RW | CORRAL_BIND_FROM_FD,
                                       o->permit_fd};
    /* A file is shown read-only; a socket too, which connect(2) does not mind: it asks
     * for write permission on the inode, which a read-only mount does not take away. */
    for (size_t i = 0; i < o->n_extras; i++)
        binds[nb++] = (struct corral_bind){
            o->extras[i], o->extras[i],
            CORRAL_BIND_FROM_FD | (o->extra_kinds[i] == EXTRA_DIR ? CORRAL_BIND_RW : 0),
            o->extra_fds[i]};
    /* Parents first (the plan is sorted), each over the boundary bound above. */
    for (size_t i = 0; i < o->n_ro; i++)
        binds[nb++] = (struct corral_bind){o->ro[i].path, o->ro[i].path,
                                           CORRAL_BIND_FROM_FD | (o->ro[i].rw ? CORRAL_BIND_RW : 0),
                                           o->ro[i].fd};
    /* The command the caller named is granted read+execute even outside the runtime
     * set: it is the one file the caller asked to run. */
    int cmd_inside = corral_is_beneath(o->cmd, o->permit);
    for (size_t i = 0; i < o->n_extras; i++)
        cmd_inside |= corral_is_beneath(o->cmd, o->extras[i]);
    /* Bound on its own only when nothing bound already shows it: a bind over a file in
     * a writable extra fails (ETXTBSY) while the command runs there. */

    if (!covered_by_runtime(o->cmd) && !cmd_inside && o->cmd_fd >= 0)
        binds[nb++] = (struct corral_bind){o->cmd, o->cmd, CORRAL_BIND_FROM_FD, o->cmd_fd};
    /* /etc/resolv.conf is often a link out of /etc; egress needs it. */
    char *resolv = NULL;
    if (corral_resolve_file("/etc/resolv.conf", &resolv) == 0 && !covered_by_runtime(resolv))
        binds[nb++] = (struct corral_bind){resolv, resolv, CORRAL_BIND_OPTIONAL, -1};

    struct corral_tmpfs tmpfs[MAX_TMPFS];
    struct corral_root_plan plan = {.binds = binds,
                                    .n_binds = nb,
                                    .tmpfs = tmpfs,
                                    .n_tmpfs = private_tmpfs(o, tmpfs),
                                    .symlinks = links,
                                    .n_symlinks = nl,
                                    .proc = 1,
                                    .dev = 1,
                                    .masks = masked_paths,
                                    .n_masks = n_masked};
    const char *step = "";
    int r = corral_root_build(&plan, &step);
    if (r < 0) diag(r, "namespace layer: %s", step);
    free(resolv);
    return r;
}

static int is_masked(const char *path)
{
    for (size_t i = 0; i < n_masked; i++)
        if (strcmp(path, masked_paths[i]) == 0) return 1;
    return 0;
}

static int holds_masked(const char *dir)
{
    for (size_t i = 0; i < n_masked; i++)
        if (corral_is_beneath(masked_paths[i], dir) && strcmp(masked_paths[i], dir) != 0) return 1;
    return 0;
}

/* Grants read+execute on every entry of dir but the masked ones, descending only into
 * directories that hold one. Symlinks are skipped, as a grant on the whole directory
 * would not have covered their targets either. Entries are opened relative to the
 * directory fd, one component each, as /etc alone holds a few hundred. */
static int allow_around_masks(int rs, int abi, const char *dir, int depth)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return errno == ENOENT ? 0 : -errno;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -errno;
    }
    int r = 0;
    struct dirent *e;
    char path[PATH_MAX];
    while (r == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (e->d_type == DT_LNK) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (is_masked(path)) continue;
        if (depth < 4 && holds_masked(path)) {
            r = allow_around_masks(rs, abi, path, depth + 1);
            continue;
        }
        int fd = openat(dfd, e->d_name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue; /* gone, or unreadable: stays ungranted */
        r = corral_landlock_allow_fd(rs, abi, fd, CORRAL_LL_READ_EXEC);
        close(fd);
    }
    closedir(d);
    return r;
}

/* /proc: read everywhere, and write where a nested sandbox needs it, as a tool that
 * builds one (unshare -Ur, bubblewrap) writes its own uid_map, gid_map and setgroups. A
 * fresh /proc of our pid namespace (the ns layer, or bubblewrap's --proc) shows only the
 * sandbox's processes, its knobs mounted read-only (mount.c protect_proc), so it is
 * writable whole. On the host's /proc (Landlock alone) that would reach every same-uid
 * process's oom_score_adj and, as root, the kernel's knobs: there only this process's
 * own three files are writable. */

static int allow_proc(int rs, int abi, const struct confine_opts *o)
{
    int fresh = o->layer_ns || o->n_identities > 0;
    uint64_t rights = CORRAL_LL_READ_FILE | CORRAL_LL_READ_DIR;
    uint64_t write = CORRAL_LL_WRITE_FILE | CORRAL_LL_TRUNCATE; /* O_TRUNC, as a shell's > */
    int r = corral_landlock_allow_path(rs, abi, "/proc", rights | (fresh ? write : 0), 0);
    static const char *const own[] = {"/proc/self/uid_map", "/proc/self/gid_map",
                                      "/proc/self/setgroups"};
    for (size_t i = 0; r == 0 && !fresh && i < sizeof own / sizeof own[0]; i++)
        r = corral_landlock_allow_path(rs, abi, own[i], CORRAL_LL_READ_FILE | write, 1);
    return r;
}

/* Whether no masked path can be opened now: a Landlock domain (an outer corral's) already
 * keeps every one of them closed, and as domains stack by intersection, a grant of /etc
 * whole in ours cannot reopen them. */
static int masks_closed_already(void)
{
    for (size_t i = 0; i < n_masked; i++) {
        int fd = open(masked_paths[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (errno != EACCES && errno != ENOENT && errno != ENOTDIR) return 0;
    }
    return 1;
}

/* /etc around the masks; nested inside a confinement that lets no one list /etc (an
 * outer Landlock layer granting it entry by entry), /etc whole when that confinement
 * already keeps each mask closed. */
static int allow_etc(int rs, int abi)
{
    int r = allow_around_masks(rs, abi, "/etc", 0);
    if (r == -EACCES && masks_closed_already())
        r = corral_landlock_allow_path(rs, abi, "/etc", CORRAL_LL_READ_EXEC, 1);
    return r;
}

static int apply_landlock(const struct confine_opts *o)
{
    int abi = corral_landlock_abi();
    if (abi < 1) {
        diag(abi, "landlock layer: %s", "not available");
        return abi < 0 ? abi : -EOPNOTSUPP;
    }
    int rs = corral_landlock_create(abi);
    if (rs < 0) {
        diag(rs, "landlock layer: %s", "create ruleset");
        return rs;
    }
    int r = corral_landlock_allow_fd(rs, abi, o->permit_fd, CORRAL_LL_FS_ALL);
    for (size_t i = 0; r == 0 && i < o->n_extras; i++) {
        /* A socket gets no rule: up to ABI 8 no right covers connect(2) to a pathname
         * socket (LANDLOCK_ACCESS_FS_RESOLVE_UNIX came later), so Landlock neither
         * grants it nor keeps its siblings out; the namespace layer does both. */
        if (o->extra_kinds[i] == EXTRA_SOCKET) continue;
        r = corral_landlock_allow_fd(rs, abi, o->extra_fds[i],
                                     o->extra_kinds[i] == EXTRA_DIR ? CORRAL_LL_FS_ALL
                                                                    : CORRAL_LL_READ_FILE);
    }
    /* The private tmpfs instances of a root with a mount namespace (ours, or bubblewrap's
     * around an inner wrapper): Landlock alone has none, and the host's would be shared. */
    struct corral_tmpfs tmpfs[MAX_TMPFS];
    size_t n_tmpfs = o->layer_ns || o->n_identities > 0 ? private_tmpfs(o, tmpfs) : 0;
    for (size_t i = 0; r == 0 && i < n_tmpfs; i++)
        r = corral_landlock_allow_path(rs, abi, tmpfs[i].path, CORRAL_LL_FS_ALL, 0);
    for (size_t i = 0; r == 0 && i < n_runtime; i++) {
        /* With the namespace layer the credential stores are covered already; without
         * it, Landlock alone must leave them out. */
        if (!o->layer_ns && strcmp(runtime_paths[i], "/etc") == 0)
            r = allow_etc(rs, abi);
        else
            r = corral_landlock_allow_path(rs, abi, runtime_paths[i], CORRAL_LL_READ_EXEC, 1);
    }
    for (size_t i = 0; r == 0 && i < n_devices; i++)
        r = corral_landlock_allow_path(
            rs, abi, device_paths[i],
            CORRAL_LL_READ_FILE | CORRAL_LL_WRITE_FILE | CORRAL_LL_IOCTL_DEV, 1);
    if (r == 0) r = allow_proc(rs, abi, o);
    if (r == 0 && o->cmd_fd >= 0)
        r = corral_landlock_allow_fd(rs, abi, o->cmd_fd, CORRAL_LL_READ_EXEC);
    char *resolv = NULL;
    if (r == 0 && corral_resolve_file("/etc/resolv.conf", &resolv) == 0)
        r = corral_landlock_allow_path(rs, abi, resolv, CORRAL_LL_READ_FILE, 1);
    free(resolv);
    if (r == 0) r = corral_landlock_restrict(rs);
    close(rs);
    if (r < 0) diag(r, "landlock layer: %s", "rules");
    return r;
}

static int exec_command(const struct confine_opts *o, const sigset_t *old)
{
    sigprocmask(SIG_SETMASK, old, NULL);
    extern char **environ;
    execve(o->cmd, o->argv, environ);
    int err = errno;
    diag(err, "exec %s", o->cmd);
    return err == ENOENT ? CORRAL_EXIT_NOTFOUND : CORRAL_EXIT_NOEXEC;
}

/* Whether this process is uid 0 of a user namespace of its own holding CAP_SETFCAP
 * there: the bwrap layer's inner wrapper as root (confine_bwrap.c). The host's
 * namespace maps every id; a child one made for us maps uid 0 alone. */
static int root_of_child_userns(void)
{
    if (geteuid() != 0 || corral_caps_have(CAP_SETFCAP) != 1) return 0;
    char buf[128];
    int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    unsigned long inner, outer, count;
    return sscanf(buf, "%lu %lu %lu", &inner, &outer, &count) == 3 && inner == 0 && outer == 0 &&
           count == 1;
}

/* The read-only paths read back where the command will see them: each a mount point,
 * each read-only path on a read-only mount (by our binds, or bubblewrap's). */
static int check_read_only(const struct confine_opts *o)
{
    const char *bad = NULL;
    int r = corral_ro_check(o->ro, o->n_ro, &bad);
    if (r == -EPERM)
        diag(0, "--read-only %s is writable inside", bad);
    else if (r == -ENOTBLK)
        diag(0, "--read-only: %s is not a mount point inside", bad);
    else if (r < 0)
        diag(r, "--read-only %s", bad);
    return r;
}

/* Runs in pid 1 of the new namespaces (or in the wrapper itself without the ns layer). */
static int confine_and_run(const struct confine_opts *o, const sigset_t *mask, const sigset_t *old)
{
    if (o->layer_ns && build_root(o) < 0) return setup_status();
    if (check_read_only(o) < 0) return setup_status();
    if (chdir(o->cd) < 0) {
        /* the spec always passes --cd: by default the --permit directory itself */
        diag(errno, "cannot enter the working directory %s (--cd; by default --permit)", o->cd);
        return setup_status();
    }
    if (o->layer_landlock && apply_landlock(o) < 0) return setup_status();
    if (o->n_identities > 0) keep_setfcap = root_of_child_userns();
    int r = keep_setfcap ? corral_caps_drop_all_but(CAP_SETFCAP) : corral_caps_drop_all();
    if (r < 0) {
        diag(r, "%s", "dropping capabilities");
        return setup_status();
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        diag(errno, "%s", "no_new_privs");
        return setup_status();
    }
    /* The command may share the caller's terminal: TIOCSTI (where
     * dev.tty.legacy_tiocsti=1) would type commands into the caller's shell, which runs
     * them unconfined. A new session would also stop it but would take the terminal from
     * an interactive command; the filter takes only the ioctl. */

    struct corral_bpf tty = {(struct sock_filter *)corral_tty_filter,
                             sizeof corral_tty_filter / sizeof corral_tty_filter[0]};
    r = corral_seccomp_install(&tty); /* only reads the table */
    if (r < 0) {
        diag(r, "%s", "seccomp (terminal ioctls)");
        return setup_status();
    }
    if (keep_setfcap) {
        /* CAP_SETFCAP is kept for nested id maps only: no file capability with it */
        struct corral_bpf noxattr = {(struct sock_filter *)corral_noxattr_filter,
                                     sizeof corral_noxattr_filter /
                                         sizeof corral_noxattr_filter[0]};
        r = corral_seccomp_install(&noxattr);
        if (r < 0) {
            diag(r, "%s", "seccomp (extended attributes)");
            return setup_status();
        }
    }
    if (!o->layer_ns) return exec_command(o, old);
    pid_t child = fork();
    if (child < 0) {
        diag(errno, "%s", "fork");
        return setup_status();
    }
    if (child == 0) _exit(exec_command(o, old));
    return corral_reaper_wait(child, mask);
}

int corral_exec_confined_main(int argc, char **argv)
{
    /* Nothing but 0-2 crosses into the boundary; closed before anything is opened. */
    if (syscall(SYS_close_range, 3, ~0U, 0) < 0) {
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    }
    load_root_plan();
    struct confine_opts o = {.permit_fd = -1};
    if (parse(argc, argv, &o) < 0) return setup_status();
    if (!inside_boundary(&o, o.cd)) {
        diag(0, "--cd %s is outside the boundary", o.cd);
        return setup_status();
    }
    if (check_stdio() < 0) return setup_status();
    if (check_identities(&o) < 0) return setup_status();
    if (plan_home(&o, o.layer_ns || o.layer_bwrap || o.n_identities > 0) < 0) return setup_status();

    if (o.layer_bwrap) {
        /* bubblewrap binds from paths: hand it the checked directories themselves
         * through /proc/self/fd, inherited for that one exec. */
        static char permit_src[32], extra_src[MAX_EXTRAS][32];
        static const char *extra_srcs[MAX_EXTRAS];
        snprintf(permit_src, sizeof permit_src, "/proc/self/fd/%d", o.permit_fd);
        fcntl(o.permit_fd, F_SETFD, 0);
        for (size_t i = 0; i < o.n_extras; i++) {
            snprintf(extra_src[i], sizeof extra_src[i], "/proc/self/fd/%d", o.extra_fds[i]);
            fcntl(o.extra_fds[i], F_SETFD, 0);
            extra_srcs[i] = extra_src[i];
        }
        static char ro_src[CORRAL_RO_MAX][32];
        static const char *ro_srcs[CORRAL_RO_MAX];
        for (size_t i = 0; i < o.n_ro; i++) {
            snprintf(ro_src[i], sizeof ro_src[i], "/proc/self/fd/%d", o.ro[i].fd);
            fcntl(o.ro[i].fd, F_SETFD, 0);
            ro_srcs[i] = ro_src[i];
        }
        static int extra_rw[MAX_EXTRAS];
        for (size_t i = 0; i < o.n_extras; i++)
            extra_rw[i] = o.extra_kinds[i] == EXTRA_DIR;
        static struct corral_tmpfs tmpfs[MAX_TMPFS];
        static char ids[MAX_EXTRAS + 1][64];
        static const char *id_ptrs[MAX_EXTRAS + 1];
        for (size_t i = 0; i < 1 + o.n_extras; i++) {
            struct stat st;
            int fd = i == 0 ? o.permit_fd : o.extra_fds[i - 1];
            if (fstat(fd, &st) < 0) {
                diag(errno, "%s", "fstat boundary");
                return setup_status();
            }
            snprintf(ids[i], sizeof ids[i], "%llu:%llu", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino);
            id_ptrs[i] = ids[i];
        }
        struct corral_bwrap_layer l = {.identities = id_ptrs,
                                       .permit_src = permit_src,
                                       .extra_srcs = extra_srcs,
                                       .masks = masked_paths,
                                       .n_masks = n_masked,
                                       .permit = o.permit,
                                       .extras = o.extras,
                                       .extra_rw = extra_rw,
                                       .n_extras = o.n_extras,
                                       .ro = o.ro,
                                       .ro_srcs = ro_srcs,
                                       .n_ro = o.n_ro,
                                       .tmpfs = tmpfs,
                                       .n_tmpfs = private_tmpfs(&o, tmpfs),
                                       .cd = o.cd,
                                       .cmd = o.cmd,
                                       .argv = o.argv,
                                       .with_landlock = o.layer_landlock};
        int br = corral_confine_bwrap_exec(&l);
        diag(br, "%s", "bwrap layer");
        return setup_status();
    }

    sigset_t mask, old;
    corral_reaper_block(&mask, &old);
    if (!o.layer_ns) return confine_and_run(&o, &mask, &old);

    int r = enter_namespaces();
    if (r < 0) {
        diag(r, "namespace layer: %s", "unshare");
        return setup_status();
    }
    /* A pidfd on ourselves lets pid 1 see whether we died before its death signal was
     * armed: the parent lives outside its pid namespace, so getppid() reads 0. */
    int self = (int)syscall(SYS_pidfd_open, getpid(), 0);
    pid_t init = fork();
    if (init < 0) {
        diag(errno, "%s", "fork");
        return setup_status();
    }
    if (init == 0) {
        /* The tree dies with the wrapper: pid 1's death kills the whole namespace. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (self >= 0) {
            struct pollfd p = {.fd = self, .events = POLLIN};
            if (poll(&p, 1, 0) > 0) _exit(setup_status());
            close(self);
        }
        _exit(confine_and_run(&o, &mask, &old));
    }
    if (self >= 0) close(self);
    return corral_reaper_wait(init, &mask);
}
