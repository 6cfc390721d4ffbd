/*
 * SBPL emission for the control-plane profile (see sbpl.h). SBPL applies the last
 * matching rule, so the grants follow (deny default): the runtime a process needs to
 * start, then the boundary, then the caller's extras. A deny-default profile without the
 * runtime's own reads exits 134 on every command, so each runtime allowance below says
 * which failure it prevents.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbpl.h"
#include "util.h"

struct buf {
    char *p;
    size_t len, cap;
    int err;
};

static void buf_reserve(struct buf *b, size_t n)
{
    if (b->err || b->len + n + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
        b->err = -ENOMEM;
        return;
    }
    b->p = np;
    b->cap = cap;
}

static void buf_add(struct buf *b, const char *s, size_t n)
{
    buf_reserve(b, n);
    if (b->err) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_puts(struct buf *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

/* An SBPL string literal: the reader is TinyScheme's, so `\` and `"` are the bytes a
 * path could use to close the literal and write its own rules (bazelbuild/bazel#29441).
 * Newlines never get here: corral_sbpl_check_path refuses them. */
static void buf_string(struct buf *b, const char *s)
{
    buf_add(b, "\"", 1);
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\') buf_add(b, "\\", 1);
        buf_add(b, c, 1);
    }
    buf_add(b, "\"", 1);
}

static void buf_rule(struct buf *b, const char *ops, const char *filter, const char *path)
{
    buf_puts(b, "(allow ");
    buf_puts(b, ops);
    buf_puts(b, " (");
    buf_puts(b, filter);
    buf_puts(b, " ");
    buf_string(b, path);
    buf_puts(b, "))\n");
}

/* (allow network-outbound (remote unix-socket (FILTER "path"))) */
static void buf_socket_rule(struct buf *b, const char *filter, const char *path)
{
    buf_puts(b, "(allow network-outbound (remote unix-socket (");
    buf_puts(b, filter);
    buf_puts(b, " ");
    buf_string(b, path);
    buf_puts(b, ")))\n");
}

int corral_sbpl_check_path(const char *path)
{
    if (!path || path[0] != '/') return -EINVAL;
    /* A newline or CR ends a line in the profile and would make the emitted text read
     * differently from what a reviewer sees; no resolved path needs one. */
    if (strpbrk(path, "\n\r")) return -EINVAL;
    /* The filters match resolved paths only, so a `.`/`..` component, `//` or a
     * trailing slash is a grant that could never match: refuse it rather than emit it. */
    for (const char *c = path; *c; c++) {
        if (c[0] != '/') continue;
        const char *n = c + 1;
        if (*n == '\0') {
            if (c != path) return -EINVAL; /* trailing slash; "/" itself is canonical */
            continue;
        }
        if (*n == '/') return -EINVAL;
        if (n[0] == '.' && (n[1] == '/' || n[1] == '\0')) return -EINVAL;
        if (n[0] == '.' && n[1] == '.' && (n[2] == '/' || n[2] == '\0')) return -EINVAL;
    }
    return 0;
}

/* Device nodes every program may touch: the random devices feed arc4random and TLS,
 * /dev/tty takes an interactive child's prompts, and dyld opens /dev/dtracehelper for
 * USDT-probed binaries (granting it keeps real denials readable in the log). */
static const char *const device_literals[] = {
    "/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/dtracehelper",
};

/* Mach services reached during ordinary startup and egress. Named, not a blanket
 * (allow mach-lookup): launchservicesd and its kind act on the caller's behalf outside
 * this sandbox. A service missing here fails only the call that looks it up. */
static const char *const mach_services[] = {
    "com.apple.system.logger",                        /* asl/os_log from libSystem */
    "com.apple.logd",                                 /* os_log */
    "com.apple.system.notification_center",           /* notify(3), used by libinfo/tz */
    "com.apple.system.opendirectoryd.libinfo",        /* getpwuid/getgrgid */
    "com.apple.system.opendirectoryd.membership",     /* group membership checks */
    "com.apple.SystemConfiguration.DNSConfiguration", /* resolver configuration */
    "com.apple.SystemConfiguration.configd",          /* network reachability */
    "com.apple.dnssd.service",                        /* getaddrinfo via mDNSResponder */
    "com.apple.trustd.agent",                         /* TLS certificate evaluation */
    "com.apple.trustd",                               /* (older name of the same) */
    "com.apple.ocspd",                                /* revocation checks during TLS */
    "com.apple.SecurityServer",                       /* Security.framework keychain reads */
    "com.apple.securityd.xpc",                        /* (the same, over XPC) */
    "com.apple.cfprefsd.daemon",                      /* CFPreferences (system domain) */
    "com.apple.cfprefsd.agent",                       /* CFPreferences (user domain) */
};

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Every proper ancestor of path, root excluded, gets file-read-metadata: getcwd and
 * the shell's PWD check stat their way up. Metadata only: no listing, no contents. */
static bool is_proper_ancestor(const char *dir, const char *path)
{
    return corral_is_beneath(path, dir) && strcmp(path, dir) != 0;
}

/* The permit path and extras[0..n_prev) had their ancestors emitted already. */
static void buf_ancestors(struct buf *b, const char *path, const char *permit,
                          const char *const *prev, size_t n_prev)
{
    size_t len = strlen(path);
    char *tmp = malloc(len + 1);
    if (!tmp) {
        b->err = -ENOMEM;
        return;
    }
    for (size_t i = 1; i < len; i++) {
        if (path[i] != '/') continue;
        memcpy(tmp, path, i);
        tmp[i] = '\0';
        bool dup = permit && is_proper_ancestor(tmp, permit);
        for (size_t k = 0; k < n_prev && !dup; k++)
            dup = is_proper_ancestor(tmp, prev[k]);
        if (!dup) buf_rule(b, "file-read-metadata", "literal", tmp);
    }
    free(tmp);
}

static int check_spec(const struct corral_sbpl_spec *s)
{
    if (!s || corral_sbpl_check_path(s->permit_path)) return -EINVAL;
    if (s->n_extras && !s->extras) return -EINVAL;
    if (s->n_runtime_reads && !s->runtime_reads) return -EINVAL;
    for (size_t i = 0; i < s->n_extras; i++)
        if (corral_sbpl_check_path(s->extras[i])) return -EINVAL;
    for (size_t i = 0; i < s->n_runtime_reads; i++)
        if (corral_sbpl_check_path(s->runtime_reads[i])) return -EINVAL;
    if ((s->n_files && !s->files) || (s->n_sockets && !s->sockets)) return -EINVAL;
    for (size_t i = 0; i < s->n_files; i++)
        if (corral_sbpl_check_path(s->files[i])) return -EINVAL;
    for (size_t i = 0; i < s->n_sockets; i++)
        if (corral_sbpl_check_path(s->sockets[i])) return -EINVAL;
    return 0;
}

int corral_sbpl_emit(const struct corral_sbpl_spec *spec, char **out)
{
    if (!out) return -EINVAL;
    *out = NULL;
    int err = check_spec(spec);
    if (err) return err;

    struct buf b = {0};
    buf_puts(&b, "(version 1)\n"
                 "(deny default)\n"
                 "; runtime: what a process needs to start and to reach the network\n"
                 "(allow process-exec)\n"
                 "(allow process-fork)\n"
                 /* Job control and shutdown inside its own tree, nothing outside it. */
                 "(allow signal (target same-sandbox))\n"
                 /* Runtimes read hw.* and kern.* while they start; sysctl-write stays
                  * denied. */
                 "(allow sysctl-read)\n");
    buf_puts(&b, "(allow mach-lookup");
    for (size_t i = 0; i < N_ELEMS(mach_services); i++) {
        buf_puts(&b, "\n  (global-name ");
        buf_string(&b, mach_services[i]);
        buf_puts(&b, ")");
    }
    buf_puts(&b, ")\n");
    buf_puts(&b,
             /* notify(3) maps the notification center's state through POSIX shm, and
              * Python's multiprocessing uses shm and semaphores. */
             "(allow ipc-posix-shm)\n"
             "(allow ipc-posix-sem)\n"
             /* The control plane holds the credential and talks to the service. */
             "(allow network*)\n"
             /* A pathname unix socket is a door to whoever listens on it (the Docker
              * daemon, another user's agent): connected to only inside the boundary
              * or where the caller names one. */
             "(deny network-outbound (remote unix-socket))\n");
    buf_socket_rule(&b, "subpath", spec->permit_path);
    for (size_t i = 0; i < spec->n_extras; i++)
        buf_socket_rule(&b, "subpath", spec->extras[i]);
    for (size_t i = 0; i < spec->n_sockets; i++)
        buf_socket_rule(&b, "path-literal", spec->sockets[i]);
    /* getaddrinfo asks mDNSResponder over this socket: egress needs it. Both spellings,
     * /var being a link into /private. */
    buf_socket_rule(&b, "path-literal", "/private/var/run/mDNSResponder");
    buf_socket_rule(&b, "path-literal", "/var/run/mDNSResponder");
    /* No iokit-open: a command-line process needs no IOKit user client. */

    /* dyld reads the root node itself: without it every dynamically linked process
     * aborts with 134 before main (akitaonrails/ai-jail#77). A literal, not a subpath:
     * the names under / become listable, nothing below them. */
    buf_rule(&b, "file-read*", "literal", "/");
    for (size_t i = 0; i < spec->n_runtime_reads; i++)
        buf_rule(&b, "file-read*", "subpath", spec->runtime_reads[i]);
    for (size_t i = 0; i < N_ELEMS(device_literals); i++)
        buf_rule(&b, "file-read* file-write* file-ioctl", "literal", device_literals[i]);
    /* /dev/fd/N reopens a descriptor the process already holds (/dev/stdout is a link
     * to it): no new object becomes reachable. */
    buf_rule(&b, "file-read* file-write*", "subpath", "/dev/fd");
    buf_ancestors(&b, spec->permit_path, NULL, NULL, 0);
    for (size_t i = 0; i < spec->n_extras; i++)
        buf_ancestors(&b, spec->extras[i], spec->permit_path, spec->extras, i);
    for (size_t i = 0; i < spec->n_files; i++)
        buf_ancestors(&b, spec->files[i], spec->permit_path, spec->extras, spec->n_extras);
    for (size_t i = 0; i < spec->n_sockets; i++)
        buf_ancestors(&b, spec->sockets[i], spec->permit_path, spec->extras, spec->n_extras);

    buf_puts(&b, "; boundary\n");
    buf_rule(&b, "file-read* file-write*", "subpath", spec->permit_path);
    if (spec->n_extras) buf_puts(&b, "; permit_extra_subpaths, written down by the caller\n");
    for (size_t i = 0; i < spec->n_extras; i++)
        buf_rule(&b, "file-read* file-write*", "subpath", spec->extras[i]);
    if (spec->n_files) buf_puts(&b, "; files granted alone, read-only\n");
    for (size_t i = 0; i < spec->n_files; i++)
        buf_rule(&b, "file-read*", "literal", spec->files[i]);

    if (b.err) {
        free(b.p);
        return b.err;
    }
    *out = b.p;
    return 0;
}
