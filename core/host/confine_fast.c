/*
 * `corral confine --exec` without the Lua host (confine_fast.h): each step below is the
 * C form of the Lua code named beside it, and any case that code would refuse, warn
 * about or probe for is declined rather than decided here. Memory is not freed: the
 * process execs the wrapper, exits, or hands the line to the Lua path, all at once.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine.h"
#include "confine_fast.h"
#include "confine_fast_cache.h"
#include "confine_fast_plan.h"
#include "jsontext.h"
#include "path.h"
#include "rootplan.h"
#include "util.h"

extern char **environ;

int cf_decline(struct fast *f, const char *why)
{
    if (!f->why) f->why = why;
    return -1;
}

/* Set by any allocation that failed on the way: a list missing an entry (a protected
 * path) would be a weaker spec than Lua's, so the line is then declined. */
int cf_alloc_failed;

int cf_list_add(struct list *l, char *s)
{
    if (!s) return cf_alloc_failed = 1, -1;
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) return cf_alloc_failed = 1, -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    l->v[l->n] = NULL;
    return 0;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Adds s; returns 1 when it was there already (or cannot be added: cf_alloc_failed). */
int cf_set_add(struct set *t, char *s)
{
    if (2 * (t->n + 1) > t->cap) {
        struct set bigger = {calloc(t->cap ? t->cap * 2 : 64, sizeof(char *)),
                             t->cap ? t->cap * 2 : 64, 0};
        if (!bigger.slot) return cf_alloc_failed = 1;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slot[i]) cf_set_add(&bigger, t->slot[i]);
        free(t->slot);
        *t = bigger;
    }
    size_t i = hash(s) & (t->cap - 1);
    for (; t->slot[i]; i = (i + 1) & (t->cap - 1))
        if (strcmp(t->slot[i], s) == 0) return 1;
    t->slot[i] = s;
    t->n++;
    return 0;
}

int cf_set_has(const struct set *t, const char *s)
{
    if (!t->cap) return 0;
    for (size_t i = hash(s) & (t->cap - 1); t->slot[i]; i = (i + 1) & (t->cap - 1))
        if (strcmp(t->slot[i], s) == 0) return 1;
    return 0;
}

char *cf_concat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);
    if (!s) return cf_alloc_failed = 1, NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

int cf_compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ---- the command line (corral.cli.parse against confine's options) ------------------ */

static int parse_line(struct fast *f, int argc, char **argv)
{
    int i = 2;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) break;
        if (strcmp(a, "--exec") == 0) {
            f->exec = 1;
            continue;
        }
        int value = strcmp(a, "--permit") == 0 || strcmp(a, "--cd") == 0 ||
                    strcmp(a, "--extra") == 0 || strcmp(a, "--read-only") == 0 ||
                    strcmp(a, "--writable") == 0;
        /* --json, --broker, --layers, --help, --name=value, an operand before `--`... */
        if (!value) return cf_decline(f, "an option or operand it does not cover");
        if (i + 1 >= argc || strcmp(argv[i + 1], "--") == 0)
            return cf_decline(f, "an option without its value");
        const char *v = argv[++i];
        int r = 0;
        if (strcmp(a, "--permit") == 0 || strcmp(a, "--cd") == 0) {
            const char **slot = a[2] == 'p' ? &f->permit_arg : &f->cd_arg;
            if (*slot) return cf_decline(f, "an option given twice");
            *slot = v;
        } else {
            struct list *l = strcmp(a, "--extra") == 0       ? &f->extra_args
                             : strcmp(a, "--read-only") == 0 ? &f->ro_args
                                                             : &f->wr_args;
            r = cf_list_add(l, (char *)v);
        }
        if (r < 0) return cf_decline(f, "out of memory");
    }
    if (!f->exec) return cf_decline(f, "not --exec");
    if (!f->permit_arg) return cf_decline(f, "no --permit");
    if (i + 1 >= argc) return cf_decline(f, "no command");
    f->cmdv = argv + i + 1;
    f->cmdc = argc - i - 1;
    return 0;
}

/* ---- what the Lua host would do before the command runs ----------------------------- */

/* Lua init code, a broker's client or boundary, an inherited directory on 0-2
 * (corral.confinement.cli): each is the Lua path's. */
static int check_process(struct fast *f)
{
    static const char *const lua_only[] = {"LUA_INIT_5_4", "LUA_INIT", "CORRAL_BROKER",
                                           "CORRAL_BROKER_BOUNDARY"};
    for (size_t i = 0; i < sizeof lua_only / sizeof lua_only[0]; i++)
        if (getenv(lua_only[i])) return cf_decline(f, "a variable the Lua host acts on is set");
    for (int fd = 0; fd <= 2; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
            return cf_decline(f, "a directory on a standard fd");
    }
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    size_t nx = strcspn(x, "="), ny = strcspn(y, "=");
    int c = memcmp(x, y, nx < ny ? nx : ny);
    return c ? c : (nx > ny) - (nx < ny);
}

/* The environment as the spec passes it: core.proc.environ()'s map, sorted by name
 * (corral.confinement's normalise_env). A repeated name (the map keeps one of them) or
 * an empty one (refused there) is the Lua path's. */
static int collect_env(struct fast *f)
{
    for (char **e = environ; e && *e; e++)
        if (strchr(*e, '=') && cf_list_add(&f->env, *e) < 0) return cf_decline(f, "out of memory");
    if (f->env.n) qsort(f->env.v, f->env.n, sizeof *f->env.v, compare_names);
    for (size_t i = 0; i < f->env.n; i++) {
        if (f->env.v[i][0] == '=') return cf_decline(f, "a variable with an empty name");
        if (i > 0 && compare_names(&f->env.v[i - 1], &f->env.v[i]) == 0)
            return cf_decline(f, "a variable set twice");
    }
    return 0;
}

/* ---- the wrapper program (corral.confine_wrapper) ------------------------------------ */

/* corral.confine_wrapper.beside(host): corral-exec-confined beside the host when it is
 * an executable file, else the host. */
static char *wrapper_beside(const char *host)
{
    const char *slash = strrchr(host, '/');
    char cand[PATH_MAX];
    if (snprintf(cand, sizeof cand, "%.*s/corral-exec-confined", (int)(slash - host), host) >=
        (int)sizeof cand)
        return strdup(host);
    char *program = NULL;
    struct stat st;
    if (corral_resolve_executable(cand, getenv("PATH"), &program) == 0 &&
        lstat(program, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111))
        return program;
    free(program);
    return strdup(host);
}

/* ---- the arguments (corral.confinement's check_opts) ---------------------------------- */

static int path_text_ok(const char *v)
{
    return v[0] == '/' && !strpbrk(v, "\n\r");
}

/* corral.state_dir.refusal: whether resolved is, or holds, the caller's host key or
 * root's (the environment has no repeated name here: getenv is the map's value). */
static int holds_host_key(const char *resolved)
{
    char dir[PATH_MAX];
    const char *v;
    if ((v = getenv("CORRAL_STATE_DIR")) && v[0])
        snprintf(dir, sizeof dir, "%s", v);
    else if (geteuid() == 0)
        snprintf(dir, sizeof dir, "/var/lib/corral");
    else if ((v = getenv("XDG_STATE_HOME")) && v[0] == '/')
        snprintf(dir, sizeof dir, "%s/corral", v);
    else
        snprintf(dir, sizeof dir, "%s/.local/state/corral",
                 getenv("HOME") ? getenv("HOME") : "/nonexistent");
    const char *keys[] = {dir, "/var/lib/corral"};
    for (size_t i = 0; i < 2; i++) {
        char *real = NULL, k[PATH_MAX];
        const char *parent = keys[i][0] ? keys[i] : "/";
        if (corral_resolve_dir(parent, &real) == 0)
            snprintf(k, sizeof k, "%s/key", strcmp(real, "/") == 0 ? "" : real);
        else
            snprintf(k, sizeof k, "%s/key", keys[i]);
        free(real);
        if (corral_is_beneath(k, resolved)) return 1;
    }
    return 0;
}

/* resolve_dir: an absolute directory the wrapper's boundary rules accept. */
static char *resolve_dir(const char *v)
{
    char *out = NULL;
    if (!path_text_ok(v) || corral_resolve_dir(v, &out) < 0) return NULL;
    if (corral_rootplan_check_boundary(out, NULL, 0) != CORRAL_BOUNDARY_OK || holds_host_key(out)) {
        free(out);
        return NULL;
    }
    return out;
}

/* resolve_extra: a directory, or one file or socket granted alone. */
static char *resolve_extra(const char *v, const char **kind)
{
    char *out = NULL;
    struct stat st;
    if (!path_text_ok(v) || corral_resolve_file(v, &out) < 0 || lstat(out, &st) < 0) return NULL;
    if (S_ISDIR(st.st_mode)) {
        free(out);
        *kind = "dir";
        return resolve_dir(v);
    }
    *kind = S_ISREG(st.st_mode) ? "file" : "socket";
    if ((!S_ISREG(st.st_mode) && !S_ISSOCK(st.st_mode)) ||
        corral_rootplan_check_file(out, NULL, 0) != CORRAL_BOUNDARY_OK || holds_host_key(out) ||
        st.st_nlink > 1) {
        free(out);
        return NULL;
    }
    return out;
}

/* corral.confinement.protected.resolve: a --read-only (existing file or directory with
 * one name) or --writable (its parent resolved when missing) path strictly beneath a
 * boundary directory. */
static char *resolve_protected(const char *v, int must_exist, const struct list *roots)
{
    char *out = NULL;
    if (!path_text_ok(v)) return NULL;
    int r = corral_resolve_file(v, &out);
    if (r == -ENOENT && !must_exist) {
        const char *slash = strrchr(v, '/');
        const char *base = slash + 1;
        char *parent = strndup(v, (size_t)(slash - v));
        char *dir = NULL;
        if (!parent || !*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0 ||
            corral_resolve_dir(parent[0] ? parent : "/", &dir) < 0)
            return NULL;
        out = cf_concat3(strcmp(dir, "/") == 0 ? "" : dir, "/", base);
    } else if (r < 0) {
        return NULL;
    }
    if (!out) return NULL;
    int inside = 0;
    for (size_t i = 0; i < roots->n; i++) {
        if (strcmp(out, roots->v[i]) == 0) return NULL;
        inside |= corral_is_beneath(out, roots->v[i]);
    }
    if (!inside) return NULL;
    struct stat st;
    if (must_exist && (lstat(out, &st) < 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) ||
                       (S_ISREG(st.st_mode) && st.st_nlink > 1)))
        return NULL;
    return out;
}

static int check_opts(struct fast *f)
{
    if (!(f->permit = resolve_dir(f->permit_arg))) return cf_decline(f, "--permit is refused");
    for (size_t i = 0; i < f->extra_args.n; i++) {
        const char *kind = NULL;
        if (cf_list_add(&f->extras, resolve_extra(f->extra_args.v[i], &kind)) < 0)
            return cf_decline(f, "an --extra is refused");
        cf_list_add(&f->extra_kinds, (char *)kind);
    }
    cf_list_add(&f->roots, f->permit);
    for (size_t i = 0; i < f->extras.n; i++)
        if (strcmp(f->extra_kinds.v[i], "dir") == 0) cf_list_add(&f->roots, f->extras.v[i]);
    for (size_t i = 0; i < f->extras.n; i++) {
        if (strcmp(f->extra_kinds.v[i], "dir") == 0) continue;
        for (size_t k = 0; k < f->roots.n; k++)
            if (corral_is_beneath(f->extras.v[i], f->roots.v[k]))
                return cf_decline(f, "a file --extra inside the boundary");
    }
    for (size_t i = 0; i < f->ro_args.n; i++)
        if (cf_list_add(&f->read_only, resolve_protected(f->ro_args.v[i], 1, &f->roots)) < 0)
            return cf_decline(f, "a --read-only is refused");
    for (size_t i = 0; i < f->wr_args.n; i++)
        if (cf_list_add(&f->writable, resolve_protected(f->wr_args.v[i], 0, &f->roots)) < 0)
            return cf_decline(f, "a --writable is refused");
    f->cd = f->permit;
    if (f->cd_arg) {
        if (!(f->cd = resolve_dir(f->cd_arg))) return cf_decline(f, "--cd is refused");
        int inside = corral_is_beneath(f->cd, f->permit);
        for (size_t i = 0; i < f->extras.n; i++)
            inside |= corral_is_beneath(f->cd, f->extras.v[i]);
        if (!inside) return cf_decline(f, "--cd outside the boundary");
    }
    return 0;
}

/* ---- the spec (corral.confinement's linux_spec) ---------------------------------------- */

/* corral.cli.missing_command: a command the shell would not find or could not run is
 * reported by the Lua path. */
static int command_runnable(const char *cmd)
{
    char *real = NULL;
    struct stat st;
    int ok;
    if (!strchr(cmd, '/'))
        ok = corral_resolve_executable(cmd, getenv("PATH"), &real) == 0 && strchr(real, '/');
    else
        ok = corral_resolve_file(cmd, &real) == 0 && lstat(real, &st) == 0 &&
             !S_ISDIR(st.st_mode) && (st.st_mode & 0111);
    free(real);
    return ok;
}

static int wrapper_args(struct fast *f, struct list *args)
{
    static char *const fixed[] = {"exec-confined", "--layers", "ns,landlock", "--permit"};
    for (size_t i = 0; i < 4; i++)
        cf_list_add(args, fixed[i]);
    cf_list_add(args, f->permit);
    for (size_t i = 0; i < f->extras.n; i++) {
        cf_list_add(args, "--extra");
        cf_list_add(args, f->extras.v[i]);
    }
    for (size_t i = 0; i < f->paths.n; i++) {
        cf_list_add(args, "--read-only");
        cf_list_add(args, f->paths.v[i]);
    }
    cf_list_add(args, "--cd");
    cf_list_add(args, f->cd);
    cf_list_add(args, "--probe-cache");
    cf_list_add(args, f->cache_path);
    cf_list_add(args, "--");
    cf_list_add(args, f->cmd);
    for (int i = 1; i < f->cmdc; i++)
        cf_list_add(args, f->cmdv[i]);
    return cf_alloc_failed ? -1 : 0;
}

static void json_list(struct corral_textbuf *b, const char *name, const struct list *l)
{
    corral_textbuf_addstr(b, "\"");
    corral_textbuf_addstr(b, name);
    corral_textbuf_addstr(b, "\":[");
    for (size_t i = 0; i < l->n; i++) {
        if (i) corral_textbuf_addstr(b, ",");
        corral_json_add_string(b, l->v[i], strlen(l->v[i]));
    }
    corral_textbuf_addstr(b, "]");
}

/* The spec as `corral confine --json` prints it. */
static int print_spec(struct fast *f, const struct list *args)
{
    struct corral_textbuf b = {0};
    struct list layers = {0}, names = {0};
    cf_list_add(&layers, "ns");
    cf_list_add(&layers, "landlock");
    for (size_t i = 0; i < f->env.n; i++)
        cf_list_add(&names, strndup(f->env.v[i], strcspn(f->env.v[i], "=")));
    const char *cmd = f->wrapper;
    corral_textbuf_addstr(&b, "{");
    json_list(&b, "args", args);
    corral_textbuf_addstr(&b, ",\"cd\":");
    corral_json_add_string(&b, f->cd, strlen(f->cd));
    corral_textbuf_addstr(&b, ",\"cmd\":");
    corral_json_add_string(&b, cmd, strlen(cmd));
    corral_textbuf_addstr(&b, ",");
    json_list(&b, "env_names", &names);
    corral_textbuf_addstr(&b, ",");
    json_list(&b, "layers", &layers);
    corral_textbuf_addstr(&b, ",\"read_only\":{");
    json_list(&b, "absent", &f->absent);
    corral_textbuf_addstr(&b, ",\"by\":\"ns\",\"held\":true,");
    json_list(&b, "paths", &f->paths);
    corral_textbuf_addstr(&b, f->stopped ? ",\"stopped\":true" : ",\"stopped\":false");
    corral_textbuf_addstr(&b, ",\"unprotected\":[");
    for (size_t i = 0; i < f->unprotected.n; i++) {
        corral_textbuf_addstr(&b, i ? ",{\"path\":" : "{\"path\":");
        corral_json_add_string(&b, f->unprotected.v[i], strlen(f->unprotected.v[i]));
        corral_textbuf_addstr(&b, ",\"why\":");
        corral_json_add_string(&b, f->unprotected_why.v[i], strlen(f->unprotected_why.v[i]));
        corral_textbuf_addstr(&b, "}");
    }
    corral_textbuf_addstr(&b, "]}}\n");
    if (b.failed) return 1;
    fputs(b.data, stdout);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* core.proc.host_executable(): the host whose Lua path the line would otherwise take (its
 * identity and path name the probe cache): `named` (a front's corral-host), else this
 * executable. */
static char *host_executable(const char *named)
{
    if (named) return strdup(named);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    return strdup(exe);
}

static int build(struct fast *f, int argc, char **argv, const char *host, struct list *args)
{
    if (parse_line(f, argc, argv) < 0 || check_process(f) < 0 || collect_env(f) < 0) return -1;
    if (!(f->host = host_executable(host))) return cf_decline(f, "/proc/self/exe cannot be read");
    const char *why = NULL;
    f->wrapper = wrapper_beside(f->host);
    if (!f->wrapper) return cf_decline(f, "out of memory");
    if (!(f->cache_path = corral_fast_probe_cache(f->host, f->wrapper, &why)))
        return cf_decline(f, why);
    if (check_opts(f) < 0) return -1;
    if (corral_resolve_executable(f->cmdv[0], getenv("PATH"), &f->cmd) < 0)
        return cf_decline(f, "the command cannot be resolved");
    if (cf_plan_read_only(f) < 0) return -1;
    if (!command_runnable(f->cmdv[0])) return cf_decline(f, "the command cannot be run");
    if (wrapper_args(f, args) < 0 || cf_alloc_failed) return cf_decline(f, "out of memory");
    return 0;
}

int confine_fast_main(int argc, char **argv, const char *host)
{
    struct fast f = {0};
    struct list args = {0};
    const char *debug = getenv(CORRAL_CONFINE_FAST_DEBUG);
    int show = debug && strcmp(debug, "spec") == 0;
    int announce = debug && strcmp(debug, "run") == 0;
    if (argc < 2 || strcmp(argv[1], "confine") != 0) return CORRAL_CONFINE_FAST_DECLINE;
    if (build(&f, argc, argv, host, &args) < 0) {
        if (!show || !f.exec) return CORRAL_CONFINE_FAST_DECLINE;
        fprintf(stderr, "corral confine: fast path declined: %s\n", f.why);
        return CORRAL_CONFINE_FAST_DECLINED_EXIT;
    }
    if (show) return print_spec(&f, &args);
    if (announce) fputs("corral confine: fast path\n", stderr);
    /* as corral.confinement.exec would become the wrapper: its directory, this
     * environment, SIGINT as the host found it */
    if (chdir(f.cd) < 0) return CORRAL_CONFINE_FAST_DECLINE;
    environ = f.env.v;
    signal(SIGINT, SIG_DFL);
    fflush(NULL);
    _exit(corral_exec_confined_main((int)args.n, args.v));
}
