/*
 * core.spawn.start(plan) → process: the tenant spawn primitive (core/lib/spawn.c) from a Lua
 * table. Strings are used in place: they stay reachable from the plan table, which is on
 * the stack for the whole call, and pointer arrays live in scratch userdata also kept on
 * the stack, so nothing the child reads can be collected or moved.
 *
 * A failed step is nil, "spawn: <step>: strerror", errno: the step ("build root", "exec",
 * …, spawn.h) is the text between "spawn: " and the next ": ".
 *
 * A process userdata that is collected or closed before it was waited for is killed
 * (SIGKILL to its init takes the whole pid namespace with it): a sandbox never outlives
 * the object that owns it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lcorral.h"
#include "reaper.h"
#include "seccomp.h"
#include "seccomp_tables.h" /* generated */
#include "spawn.h"

#define PROC_TYPE "corral.process"

typedef struct {
    pid_t pid;
    int pidfd;
    int reaped;
    int code;     /* exit code of the sandbox's init (the tenant's status) */
    int signaled; /* init itself was killed (limit, stop): signal number */
    int job;      /* a command joined into a running sandbox, leading its own group: the
                     terminal's signals go to the group, as its init would forward them */
    int killed;   /* we sent it SIGKILL (kill, close) */
} process;

static void *scratch(lua_State *L, size_t size)
{
    void *p = lua_newuserdatauv(L, size ? size : 1, 0);
    memset(p, 0, size ? size : 1);
    return p;
}

static const char *opt_string(lua_State *L, int t, const char *field)
{
    lua_getfield(L, t, field);
    const char *s = NULL;
    if (!lua_isnil(L, -1)) {
        size_t len;
        s = lua_tolstring(L, -1, &len);
        if (!s || strlen(s) != len)
            luaL_argerror(L, 1, lua_pushfstring(L, "%s must be a string without NUL bytes", field));
    }
    lua_pop(L, 1); /* still referenced by the plan table */
    return s;
}

/* plan.meanwhile: the caller's function, run while the child builds its root. Its
 * errors stay its own (it keeps them: corral.run's housekeeping); one raised here is
 * dropped rather than thrown past the spawn's open descriptors. */
struct meanwhile {
    lua_State *L;
    int fn;
};

static void call_meanwhile(void *arg)
{
    struct meanwhile *m = arg;
    if (!lua_checkstack(m->L, 2)) return;
    lua_pushvalue(m->L, m->fn);
    if (lua_pcall(m->L, 0, 0, 0) != LUA_OK) lua_pop(m->L, 1);
}

static int opt_bool(lua_State *L, int t, const char *field)
{
    lua_getfield(L, t, field);
    int b = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return b;
}

static lua_Integer opt_int(lua_State *L, int t, const char *field, lua_Integer def)
{
    lua_getfield(L, t, field);
    lua_Integer v = def;
    if (!lua_isnil(L, -1)) {
        int ok;
        v = lua_tointegerx(L, -1, &ok);
        if (!ok) luaL_argerror(L, 1, lua_pushfstring(L, "%s must be an integer", field));
    }
    lua_pop(L, 1);
    return v;
}

/* A list of strings at plan[field] as a NULL-terminated array (scratch left on stack). */
static char **string_list(lua_State *L, int t, const char *field)
{
    if (lua_getfield(L, t, field) != LUA_TTABLE)
        luaL_argerror(L, 1, lua_pushfstring(L, "%s must be a list of strings", field));
    int list = lua_gettop(L);
    lua_Integer n = luaL_len(L, list);
    char **v = scratch(L, sizeof(char *) * (size_t)(n + 1));
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, list, i);
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (lua_type(L, -1) != LUA_TSTRING || strlen(s) != len)
            luaL_argerror(
                L, 1,
                lua_pushfstring(L, "%s[%d] must be a string without NUL bytes", field, (int)i));
        v[i - 1] = (char *)s;
        lua_pop(L, 1);
    }
    lua_remove(L, list); /* the scratch stays; the list is still in the plan */
    return v;
}

static int fd_of(lua_State *L, int idx)
{
    if (lua_isinteger(L, idx)) return (int)lua_tointeger(L, idx);
    corral_fd *f = luaL_testudata(L, idx, CORRAL_FD_TYPE);
    if (f) return f->fd;
    luaL_Stream *s = luaL_testudata(L, idx, LUA_FILEHANDLE);
    if (s && s->f) return fileno(s->f);
    luaL_argerror(L, 1, "expected an fd, a corral.fd or a Lua file");
    return -1;
}

static const struct {
    const char *name;
    int resource;
} rlimit_names[] = {{"nofile", RLIMIT_NOFILE}, {"fsize", RLIMIT_FSIZE},    {"nproc", RLIMIT_NPROC},
                    {"core", RLIMIT_CORE},     {"as", RLIMIT_AS},          {"stack", RLIMIT_STACK},
                    {"cpu", RLIMIT_CPU},       {"memlock", RLIMIT_MEMLOCK}};

static int process_new(lua_State *L, pid_t pid, int pidfd, int job)
{
    process *p = lua_newuserdatauv(L, sizeof *p, 0);
    *p = (process){.pid = pid, .pidfd = pidfd, .job = job};
    luaL_setmetatable(L, PROC_TYPE);
    return 1;
}

static int l_spawn(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    struct corral_spawn_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.path = opt_string(L, 1, "path");
    if (!plan.path) return luaL_argerror(L, 1, "plan.path is required");
    plan.argv = string_list(L, 1, "argv");
    plan.envp = string_list(L, 1, "env");
    plan.cwd = opt_string(L, 1, "cwd");
    plan.hostname = opt_string(L, 1, "hostname");
    plan.new_net = opt_bool(L, 1, "new_net");
    plan.plain = opt_bool(L, 1, "plain");
    plan.plain_ids = opt_bool(L, 1, "plain_ids");
    plan.plain_pidns = opt_bool(L, 1, "plain_pidns");
    plan.plain_session = opt_bool(L, 1, "new_session");
    plan.plain_net_admin = opt_bool(L, 1, "net_admin");
    plan.ctty = opt_bool(L, 1, "ctty");
    plan.netns_fd = -1;
    plan.join_pidfd = -1;
    /* a process of a sandbox a helper built (bubblewrap's pid 1 inside), pinned by a
     * pidfd opened just before the spawn: never signalled nor reaped as a child of ours */
    lua_Integer join_pid = 0;
    if (lua_getfield(L, 1, "join") != LUA_TNIL) {
        if (lua_isinteger(L, -1)) {
            join_pid = lua_tointeger(L, -1);
            if (join_pid <= 0 || join_pid > INT_MAX)
                return luaL_argerror(L, 1, "join pid out of range");
        } else {
            process *j = luaL_testudata(L, -1, PROC_TYPE);
            if (!j || j->reaped || j->pidfd < 0)
                return luaL_argerror(L, 1, "join must be a running corral.process or a pid");
            plan.join_pidfd = j->pidfd;
        }
    }
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "netns") != LUA_TNIL) plan.netns_fd = fd_of(L, -1);
    lua_pop(L, 1);
    plan.outside_uid = (uid_t)opt_int(L, 1, "uid", 65534);
    plan.outside_gid = (gid_t)opt_int(L, 1, "gid", 65534);

    size_t nb = 0, ns = 0;
    if (lua_getfield(L, 1, "binds") == LUA_TTABLE) nb = (size_t)luaL_len(L, -1);
    int binds_t = lua_gettop(L);
    struct corral_bind *binds = scratch(L, sizeof *binds * nb);
    for (size_t i = 0; i < nb; i++) {
        lua_geti(L, binds_t, (lua_Integer)i + 1);
        int b = lua_gettop(L);
        if (!lua_istable(L, b))
            return luaL_argerror(L, 1, lua_pushfstring(L, "binds[%d] must be a table", (int)i + 1));
        binds[i].src = opt_string(L, b, "src");
        binds[i].dest = opt_string(L, b, "dest");
        if (!binds[i].src || !binds[i].dest || binds[i].dest[0] != '/')
            return luaL_argerror(
                L, 1, lua_pushfstring(L, "binds[%d] needs src and an absolute dest", (int)i + 1));
        binds[i].flags = (opt_bool(L, b, "rw") ? CORRAL_BIND_RW : 0) |
                         (opt_bool(L, b, "optional") ? CORRAL_BIND_OPTIONAL : 0) |
                         (opt_bool(L, b, "devices") ? CORRAL_BIND_DEVICES : 0);
        binds[i].src_fd = -1;
        /* tree: a detached mount (core.idmap.tree) moved in as it is, attributes and all */
        if (lua_getfield(L, b, "tree") != LUA_TNIL) {
            binds[i].src_fd = fd_of(L, -1);
            binds[i].flags |= CORRAL_BIND_TREE;
        }
        lua_pop(L, 2);
    }
    /* attach = {{tree = fd, path = host path}, …}: with plain, detached mounts placed over
     * those paths in the helper's own mount namespace, before it starts */
    size_t na = 0;
    if (lua_getfield(L, 1, "attach") == LUA_TTABLE) na = (size_t)luaL_len(L, -1);
    int attach_t = lua_gettop(L);
    struct corral_attach *attach = scratch(L, sizeof *attach * na);
    for (size_t i = 0; i < na; i++) {
        lua_geti(L, attach_t, (lua_Integer)i + 1);
        if (!lua_istable(L, -1) || lua_getfield(L, -1, "tree") == LUA_TNIL)
            return luaL_argerror(L, 1,
                                 lua_pushfstring(L, "attach[%d] needs tree and path", (int)i + 1));
        attach[i].fd = fd_of(L, -1);
        lua_pop(L, 1);
        attach[i].path = opt_string(L, -1, "path");
        if (!attach[i].path || attach[i].path[0] != '/')
            return luaL_argerror(
                L, 1, lua_pushfstring(L, "attach[%d] needs an absolute path", (int)i + 1));
        lua_pop(L, 1);
    }
    plan.attach = attach;
    plan.n_attach = na;
    if (lua_getfield(L, 1, "symlinks") == LUA_TTABLE) ns = (size_t)luaL_len(L, -1);
    int links_t = lua_gettop(L);
    struct corral_symlink *links = scratch(L, sizeof *links * ns);
    for (size_t i = 0; i < ns; i++) {
        lua_geti(L, links_t, (lua_Integer)i + 1);
        links[i].target = opt_string(L, -1, "target");
        links[i].linkpath = opt_string(L, -1, "path");
        if (!links[i].target || !links[i].linkpath)
            return luaL_argerror(
                L, 1, lua_pushfstring(L, "symlinks[%d] needs target and path", (int)i + 1));
        lua_pop(L, 1);
    }
    plan.root = (struct corral_root_plan){.binds = binds,
                                          .n_binds = nb,
                                          .symlinks = links,
                                          .n_symlinks = ns,
                                          .proc = opt_bool(L, 1, "proc"),
                                          .dev = opt_bool(L, 1, "dev"),
                                          .tmp_mib = (unsigned long)opt_int(L, 1, "tmp_mib", 0)};

    /* rlimits = {nofile = {cur, max} | n, …} */
    struct corral_rlimit *rl =
        scratch(L, sizeof *rl * (sizeof rlimit_names / sizeof rlimit_names[0]));
    size_t nrl = 0;
    if (lua_getfield(L, 1, "rlimits") == LUA_TTABLE) {
        for (size_t i = 0; i < sizeof rlimit_names / sizeof rlimit_names[0]; i++) {
            int ty = lua_getfield(L, -1, rlimit_names[i].name);
            if (ty == LUA_TNUMBER) {
                rl[nrl++] =
                    (struct corral_rlimit){rlimit_names[i].resource, (rlim_t)lua_tointeger(L, -1),
                                           (rlim_t)lua_tointeger(L, -1)};
            } else if (ty == LUA_TTABLE) {
                int isc = 0, ism = 0;
                lua_geti(L, -1, 1);
                lua_geti(L, -2, 2);
                lua_Integer cur = lua_tointegerx(L, -2, &isc), max = lua_tointegerx(L, -1, &ism);
                lua_pop(L, 2);
                if (!isc || !ism || cur < 0 || max < cur)
                    return luaL_argerror(
                        L, 1,
                        lua_pushfstring(L, "rlimits.%s must be {cur, max}, cur <= max",
                                        rlimit_names[i].name));
                rl[nrl++] =
                    (struct corral_rlimit){rlimit_names[i].resource, (rlim_t)cur, (rlim_t)max};
            } else if (ty != LUA_TNIL) {
                return luaL_argerror(
                    L, 1, lua_pushfstring(L, "rlimits.%s must be a number", rlimit_names[i].name));
            }
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    plan.rlimits = rl;
    plan.n_rlimits = nrl;

    /* keep_fds = {fd, …}: inherited unchanged beyond 0-2 (everything else closes). */
    size_t nkeep = 0;
    if (lua_getfield(L, 1, "keep_fds") == LUA_TTABLE) nkeep = (size_t)luaL_len(L, -1);
    int keep_t = lua_gettop(L);
    int *keep = scratch(L, sizeof(int) * (nkeep ? nkeep : 1));
    for (size_t i = 0; i < nkeep; i++) {
        lua_geti(L, keep_t, (lua_Integer)i + 1);
        keep[i] = fd_of(L, -1);
        lua_pop(L, 1);
    }
    plan.keep_fds = keep;
    plan.n_keep_fds = nkeep;

    plan.stdio[0] = plan.stdio[1] = plan.stdio[2] = -1;
    static const char *const stdio_names[] = {"stdin", "stdout", "stderr"};
    for (int i = 0; i < 3; i++) {
        if (lua_getfield(L, 1, stdio_names[i]) != LUA_TNIL) plan.stdio[i] = fd_of(L, -1);
        lua_pop(L, 1);
    }

    /* cgroup.procs paths the parent writes the pid into before the child proceeds. */
    size_t ncg = 0;
    if (lua_getfield(L, 1, "cgroup_procs") == LUA_TTABLE) ncg = (size_t)luaL_len(L, -1);
    int cg_t = lua_gettop(L);
    int *cgfds = scratch(L, sizeof(int) * (ncg ? ncg : 1));
    for (size_t i = 0; i < ncg; i++)
        cgfds[i] = -1;
    for (size_t i = 0; i < ncg; i++) {
        lua_geti(L, cg_t, (lua_Integer)i + 1);
        const char *path = lua_tostring(L, -1);
        int fd = path ? open(path, O_WRONLY | O_CLOEXEC) : -1;
        int err = errno;
        lua_pop(L, 1);
        if (fd < 0) {
            for (size_t j = 0; j < i; j++)
                close(cgfds[j]);
            return corral_pushfail(L, path ? path : "cgroup_procs", err);
        }
        cgfds[i] = fd;
    }
    plan.cgroup_procs_fds = cgfds;
    plan.n_cgroup_fds = ncg;

    /* The tenant program as built at build time (core/gen/seccomp_tables.c). */
    struct corral_bpf bpf = {(struct sock_filter *)corral_tenant_filter,
                             sizeof corral_tenant_filter / sizeof corral_tenant_filter[0]};
    int r = 0;
    if (opt_bool(L, 1, "seccomp")) plan.seccomp = &bpf;

    struct meanwhile mw = {L, 0};
    if (lua_getfield(L, 1, "meanwhile") == LUA_TFUNCTION) {
        mw.fn = lua_gettop(L);
        plan.meanwhile = call_meanwhile;
        plan.meanwhile_arg = &mw;
    }

    struct corral_spawn_result res;
    const char *step = "";
    int join_own = -1;
    if (join_pid > 0) {
        join_own = (int)syscall(SYS_pidfd_open, (pid_t)join_pid, 0);
        if (join_own < 0) {
            int err = errno;
            for (size_t i = 0; i < ncg; i++)
                close(cgfds[i]);
            return corral_pushfail(L, "join: pidfd_open", err);
        }
        plan.join_pidfd = join_own;
    }
    r = corral_spawn(&plan, &res, &step);
    if (join_own >= 0) close(join_own);
    for (size_t i = 0; i < ncg; i++)
        close(cgfds[i]);
    if (r < 0) return corral_pushfail(L, lua_pushfstring(L, "spawn: %s", step), r);
    return process_new(L, res.pid, res.pidfd, res.job);
}

static process *checkproc(lua_State *L)
{
    return luaL_checkudata(L, 1, PROC_TYPE);
}

static void reap(process *p, int flags)
{
    if (p->reaped) return;
    int ws;
    pid_t r;
    do
        r = waitpid(p->pid, &ws, flags);
    while (r < 0 && errno == EINTR);
    if (r != p->pid) return;
    p->reaped = 1;
    /* A job's end reads as the init that used to wait for it reported it (an exit with
     * 128+N, reaper.h), unless it was we who killed it, as we killed that init. */
    if (WIFSIGNALED(ws) && p->job && !p->killed) {
        p->code = corral_status_code(ws);
    } else if (WIFSIGNALED(ws)) {
        p->signaled = WTERMSIG(ws);
        p->code = 128 + p->signaled;
    } else {
        p->code = corral_status_code(ws);
    }
    if (p->pidfd >= 0) {
        close(p->pidfd);
        p->pidfd = -1;
    }
}

/* p:wait([timeout_seconds]) → code, how ("exited" | "killed"[, signal]) |
 * nil, "wait: strerror(ETIMEDOUT)", ETIMEDOUT while it still runs. */
static int l_wait(lua_State *L)
{
    process *p = checkproc(L);
    if (!p->reaped) {
        if (!lua_isnoneornil(L, 2) && p->pidfd >= 0) {
            double t = luaL_checknumber(L, 2);
            struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
            int n;
            do
                n = poll(&pfd, 1, t < 0 ? -1 : (int)(t * 1000));
            while (n < 0 && errno == EINTR);
            if (n == 0) return corral_pushfail(L, "wait", ETIMEDOUT);
        }
        reap(p, 0);
    }
    lua_pushinteger(L, p->code);
    lua_pushstring(L, p->signaled ? "killed" : "exited");
    if (p->signaled) {
        lua_pushinteger(L, p->signaled);
        return 3;
    }
    return 2;
}

static int l_kill(lua_State *L)
{
    process *p = checkproc(L);
    int sig = (int)luaL_optinteger(L, 2, SIGKILL);
    if (p->reaped) return corral_pushfail(L, "kill", ESRCH);
    /* A job's group, while its unreaped leader holds the group's id (reaper.c's forward). */
    if (p->job && corral_is_terminal_signal(sig) && kill(-p->pid, sig) == 0) {
        lua_pushboolean(L, 1);
        return 1;
    }
    /* Through the pidfd: a recycled pid can never be hit. */
    if (sig == SIGKILL) p->killed = 1;
    if ((sig = corral_pidfd_signal(p->pidfd, sig)) < 0) return corral_pushfail(L, "kill", sig);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_pid(lua_State *L)
{
    lua_pushinteger(L, checkproc(L)->pid);
    return 1;
}

static int l_running(lua_State *L)
{
    process *p = checkproc(L);
    reap(p, WNOHANG);
    lua_pushboolean(L, !p->reaped);
    return 1;
}

static int l_close(lua_State *L)
{
    process *p = checkproc(L);
    if (!p->reaped && p->pid > 0) {
        p->killed = 1;
        if (p->pidfd >= 0) corral_pidfd_signal(p->pidfd, SIGKILL);
        reap(p, 0);
    }
    if (p->pidfd >= 0) {
        close(p->pidfd);
        p->pidfd = -1;
    }
    return 0;
}

/* The pidfd: readable once the sandbox's init has exited (for core.io.poll). */
static int l_fileno(lua_State *L)
{
    process *p = checkproc(L);
    lua_pushinteger(L, p->pidfd);
    return 1;
}

static int process_fd(void *ud)
{
    return ((process *)ud)->pidfd;
}

static const corral_fd_reader process_fd_reader = {process_fd};

static int l_tostring(lua_State *L)
{
    process *p = checkproc(L);
    lua_pushfstring(L, "corral.process (pid %d, %s)", (int)p->pid,
                    p->reaped ? "exited" : "running");
    return 1;
}

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* core.spawn.fork() → process, fd (in the parent) | false, fd (in the child): the host's
 * watched child. corral.run runs a custom mechanism's exec in one, so that --wall and
 * the forwarded signals bound whatever that mechanism's code does (an os.execute blocks
 * a Lua state where no hook can reach it). The fd is a pipe: the child's end writes
 * (its result), the parent's reads, and reads end-of-file once the child is gone.
 * The child starts with default dispositions and nothing blocked (the host's signalfd
 * choices are not the mechanism's), dies with the host (PDEATHSIG), and is a subreaper,
 * so that what it starts stays beneath it however it detaches. The child must end with
 * core.proc.exit: the parent's objects are copies there, and finalizers would release them. */
static int l_fork(lua_State *L)
{
    process *p = (process *)lua_newuserdatauv(L, sizeof *p, 0);
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->pidfd = -1;
    luaL_setmetatable(L, PROC_TYPE);
    corral_fd *rd, *wr;
    int err = corral_newpipe(L, &rd, &wr);
    if (err) return corral_pushfail(L, "pipe", err);
    pid_t parent = getpid();
    fflush(NULL); /* Lua's io buffers are stdio's: a copy in the child is written twice */
    pid_t pid = fork();
    if (pid < 0) return corral_pushfail(L, "fork", errno);
    if (pid == 0) {
        static const int reset[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
        for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++)
            signal(reset[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(CORRAL_EXIT_NOTFOUND); /* the host died before PDEATHSIG was armed */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        close(rd->fd);
        rd->fd = -1;
        lua_pushboolean(L, 0);
        lua_insert(L, -2);
        return 2; /* false, the write end */
    }
    close(wr->fd);
    wr->fd = -1;
    lua_pop(L, 1);
    p->pid = pid;
    p->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    return 2; /* the process, the read end */
}

int corral_open_spawn(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"wait", l_wait},     {"kill", l_kill},   {"pid", l_pid}, {"running", l_running},
        {"fileno", l_fileno}, {"close", l_close}, {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", l_close},
                                    {"__close", l_close},
                                    {"__tostring", l_tostring},
                                    {"__index", NULL},
                                    {NULL, NULL}};
    if (luaL_newmetatable(L, PROC_TYPE)) {
        luaL_setfuncs(L, meta, 0);
        corral_set_fd_reader(L, &process_fd_reader);
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_spawn);
    lua_setfield(L, -2, "start");
    lua_pushcfunction(L, l_fork);
    lua_setfield(L, -2, "fork");
    return 0;
}
