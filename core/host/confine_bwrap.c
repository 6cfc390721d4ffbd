/*
 * exec-confined's bubblewrap layer (see confine_bwrap.h). Argument vector only: nothing
 * here runs bubblewrap through a shell.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine_bwrap.h"
#include "path.h"
#include "rootplan.h"
#include "util.h"

/* Room for every read-only bind (3 words each) and its read-back (2) besides the rest. */
#define MAX_ARGS (512 + 5 * CORRAL_RO_MAX)

struct args {
    const char *v[MAX_ARGS];
    size_t n;
    int overflow;
};

static void add(struct args *a, const char *s)
{
    if (a->n + 1 >= MAX_ARGS) {
        a->overflow = 1;
        return;
    }
    a->v[a->n++] = s;
}

int corral_confine_bwrap_exec(const struct corral_bwrap_layer *l)
{
    static char links[CORRAL_ROOTPLAN_RUNTIME_MAX][PATH_MAX];
    static char self[PATH_MAX];
    struct args a = {.n = 0};
    char *bwrap = NULL;
    int r = corral_resolve_executable("bwrap", getenv("PATH"), &bwrap);
    if (r < 0) return r;
    if (bwrap[0] != '/') return -ENOENT;
    add(&a, bwrap);
    add(&a, "--die-with-parent");
    add(&a, "--unshare-pid");
    add(&a, "--unshare-ipc");
    add(&a, "--cap-drop");
    add(&a, "ALL");
    /* As root, a user namespace mapping uid and gid 0 alone, holding CAP_SETFCAP there:
     * what a sandbox nested inside needs to map its own uid 0 (see core/host/confine.c
     * enter_namespaces, which does the same for the native layer). */
    if (geteuid() == 0) {
        static const char *const as_root[] = {"--unshare-user", "--uid",      "0", "--gid", "0",
                                              "--cap-add",      "CAP_SETFCAP"};
        for (size_t i = 0; i < sizeof as_root / sizeof as_root[0]; i++)
            add(&a, as_root[i]);
    }
    size_t n_runtime;
    const char *const *runtime = corral_rootplan_runtime(&n_runtime);
    int cmd_covered = 0, self_covered = 0;
    ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sn <= 0) return -errno;
    self[sn] = '\0';
    for (size_t i = 0; i < n_runtime; i++) {
        ssize_t k = readlink(runtime[i], links[i], PATH_MAX - 1);
        if (k > 0) {
            links[i][k] = '\0';
            add(&a, "--symlink");
            add(&a, links[i]);
            add(&a, runtime[i]);
        } else {
            add(&a, "--ro-bind-try");
            add(&a, runtime[i]);
            add(&a, runtime[i]);
        }
        cmd_covered |= corral_is_beneath(l->cmd, runtime[i]);
        self_covered |= corral_is_beneath(self, runtime[i]);
    }
    static char modes[8][8];
    for (size_t i = 0; i < l->n_tmpfs && i < sizeof modes / sizeof modes[0]; i++) {
        const char *m = strstr(l->tmpfs[i].options, "mode=");
        if (m) {
            snprintf(modes[i], sizeof modes[i], "%.*s", (int)strcspn(m + 5, ","), m + 5);
            add(&a, "--perms");
            add(&a, modes[i]);
        }
        add(&a, "--tmpfs");
        add(&a, l->tmpfs[i].path);
    }
    if (l->n_tmpfs > sizeof modes / sizeof modes[0]) return -E2BIG;
    add(&a, "--bind");
    add(&a, l->permit_src ? l->permit_src : l->permit);
    add(&a, l->permit);
    for (size_t i = 0; i < l->n_extras; i++) {
        add(&a, l->extra_rw[i] ? "--bind" : "--ro-bind");
        add(&a, l->extra_srcs ? l->extra_srcs[i] : l->extras[i]);
        add(&a, l->extras[i]);
    }
    for (size_t i = 0; i < l->n_ro; i++) {
        add(&a, l->ro[i].rw ? "--bind" : "--ro-bind");
        add(&a, l->ro_srcs[i]);
        add(&a, l->ro[i].path);
    }
    /* Credential stores: an empty directory over a directory, /dev/null over a file. */
    for (size_t i = 0; i < l->n_masks; i++) {
        struct stat st;
        if (lstat(l->masks[i], &st) < 0) continue;
        if (S_ISDIR(st.st_mode)) {
            add(&a, "--tmpfs");
            add(&a, l->masks[i]);
        } else if (S_ISREG(st.st_mode)) {
            add(&a, "--ro-bind");
            add(&a, "/dev/null");
            add(&a, l->masks[i]);
        }
    }
    if (!cmd_covered && l->cmd[0] == '/' && !corral_is_beneath(l->cmd, l->permit)) {
        add(&a, "--ro-bind-try");
        add(&a, l->cmd);
        add(&a, l->cmd);
    }
    if (!self_covered) {
        add(&a, "--ro-bind");
        add(&a, self);
        add(&a, self);
    }
    add(&a, "--proc");
    add(&a, "/proc");
    /* The kernel's knobs read-only, as in the native layer (see mount.c protect_proc). */
    static const char *const knobs[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq",
                                        "/proc/bus"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        add(&a, "--ro-bind-try");
        add(&a, knobs[i]);
        add(&a, knobs[i]);
    }
    add(&a, "--dev");
    add(&a, "/dev");
    add(&a, "--chdir");
    add(&a, l->cd);
    add(&a, "--");
    /* Always our own wrapper inside: bubblewrap turns the /proc/self/fd source back into
     * a path and binds whatever is there when it mounts, a window a symlink swap can win,
     * so the inner wrapper checks that each bound directory is the one checked outside

     * (--identity), then adds Landlock when asked, and the terminal filter either way. */
    {
        add(&a, self);
        add(&a, "exec-confined");
        add(&a, "--layers");
        add(&a, l->with_landlock ? "landlock" : "checks");
        for (size_t i = 0; i < 1 + l->n_extras; i++) {
            add(&a, "--identity");
            add(&a, l->identities[i]);
        }
        add(&a, "--permit");
        add(&a, l->permit);
        for (size_t i = 0; i < l->n_extras; i++) {
            add(&a, "--extra");
            add(&a, l->extras[i]);
        }
        for (size_t i = 0; i < l->n_ro; i++) {
            if (l->ro[i].rw) continue;
            add(&a, "--read-only");
            add(&a, l->ro[i].path);
        }
        add(&a, "--cd");
        add(&a, l->cd);
        add(&a, "--");
    }
    add(&a, l->cmd);
    for (size_t i = 1; l->argv[i]; i++)
        add(&a, l->argv[i]);
    if (a.overflow) return -E2BIG;
    a.v[a.n] = NULL;
    extern char **environ;
    execve(bwrap, (char *const *)a.v, environ);
    r = -errno;
    free(bwrap);
    return r;
}
