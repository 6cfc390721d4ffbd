/*
 * core.tier: the S1/S0 runner of core/lib/tier.h for lua/corral/tier.lua.
 *
 * core.tier.run{path =, argv =, env = {"NAME=value", ...}, cwd =, rules =, filters =,
 *               supervised =, drop_caps =, netns =, stdin =, stdout =, stderr =,
 *               timeout = seconds}
 *   rules: nil (no Landlock at all) or {{path =, access = "r"|"w"|"x"|"d" letters,
 *   optional = bool}, ...} enforced at the best ABI; filters: names of plain seccomp
 *   programs ("tty", "nonet"); supervised: "nosubprocess" or nil; drop_caps: every
 *   capability dropped first; netns: a network namespace (fd) the step joins first.
 *   Returns {status =, timed_out =, execs_denied =, wall_s =, cpu_s =, max_rss_kb =,
 *   abi =}, or nil, "step: strerror", errno (nothing ran).
 * core.tier.programs(): {name = the program's bytes} for every program run() takes, so
 *   that a commitment covers the exact filters (built at build time).
 * core.tier.attempt(kind[, arg]): one attempt a probe makes from inside a confined
 *   process; true, or nil, msg, errno. kind: "fork" (the child exits at once), "thread"
 *   (a thread is created and joined), "socket" (an AF_INET stream socket),
 *   "connect" (to 127.0.0.1:arg), "socketpair" (AF_UNIX, one byte through it),
 *   "capabilities" (succeeds while any capability is effective, EPERM once none is).
 * core.tier.start(plan): as run, but the step is supervised by a process of its own and
 *   the call returns at once: a handle whose :fileno() becomes readable when the step is
 *   over and whose :result() then returns what run would have (closing the handle
 *   kills the step).

 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "caps.h"
#include "exitcodes.h"
#include "landlock.h"
#include "lcorral.h"
#include "seccomp_tables.h" /* generated, see core/gen/seccomp_tables.c */
#include "tier.h"

#define TABLE_BPF(t)                                                                               \
    {                                                                                              \
        (struct sock_filter *)t, sizeof t / sizeof t[0]                                            \
    }
static const struct {
    const char *name;
    struct corral_bpf prog;
} programs[] = {
    {"tty", TABLE_BPF(corral_tty_filter)},
    {"nonet", TABLE_BPF(corral_nonet_filter)},
    {"nosubprocess", TABLE_BPF(corral_nosubprocess_filter)},
};
#define N_PROGRAMS (sizeof programs / sizeof programs[0])

static const struct corral_bpf *program_named(lua_State *L, const char *name)
{
    for (size_t i = 0; i < N_PROGRAMS; i++)
        if (strcmp(programs[i].name, name) == 0) return &programs[i].prog;
    luaL_argerror(L, 1, lua_pushfstring(L, "no seccomp program %s", name));
    return NULL;
}

/* plan[field] as a NULL-terminated string array kept in a scratch userdata on the
 * stack (the strings stay alive in the plan). */
static char **strings_at(lua_State *L, const char *field)
{
    if (lua_getfield(L, 1, field) != LUA_TTABLE)
        luaL_argerror(L, 1, lua_pushfstring(L, "%s must be a list", field));
    lua_Integer n = luaL_len(L, -1);
    char **v = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
    for (lua_Integer i = 1; i <= n; i++) {
        size_t len;
        lua_geti(L, -2, i);
        const char *s = lua_tolstring(L, -1, &len);
        if (lua_type(L, -1) != LUA_TSTRING || strlen(s) != len)
            luaL_argerror(L, 1,
                          lua_pushfstring(L, "%s[%d] must be a string without NUL", field, (int)i));
        v[i - 1] = (char *)s;
        lua_pop(L, 1);
    }
    v[n] = NULL;
    lua_remove(L, -2);
    return v;
}

static uint64_t rights_of(lua_State *L, const char *access)
{
    uint64_t r = 0;
    for (const char *c = access; *c; c++) {
        if (*c == 'r')
            r |= CORRAL_LL_READ_FILE | CORRAL_LL_READ_DIR;
        else if (*c == 'x')
            r |= CORRAL_LL_EXECUTE | CORRAL_LL_READ_FILE;
        else if (*c == 'w')
            /* Everything that changes a tree but device nodes (which no grant makes). */
            r |= CORRAL_LL_WRITE_FILE | CORRAL_LL_REMOVE_DIR | CORRAL_LL_REMOVE_FILE |
                 CORRAL_LL_MAKE_DIR | CORRAL_LL_MAKE_REG | CORRAL_LL_MAKE_SOCK |
                 CORRAL_LL_MAKE_FIFO | CORRAL_LL_MAKE_SYM | CORRAL_LL_REFER | CORRAL_LL_TRUNCATE;
        else if (*c == 'd')
            r |= CORRAL_LL_READ_FILE | CORRAL_LL_WRITE_FILE | CORRAL_LL_IOCTL_DEV;
        else
            luaL_argerror(L, 1,
                          lua_pushfstring(L, "access letters are r, w, x, d, not %s", access));
    }
    return r;
}

/* The Landlock ruleset from plan.rules; returns its fd and the ABI, or pushes the
 * failure (3 values) and returns -1. */
static int ruleset_from(lua_State *L, int *abi_out)
{
    int t = lua_gettop(L);
    lua_Integer n = luaL_len(L, t);
    struct corral_tier_rule *rules = lua_newuserdatauv(L, sizeof *rules * (size_t)(n ? n : 1), 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, t, i);
        lua_getfield(L, -1, "path");
        lua_getfield(L, -2, "access");
        lua_getfield(L, -3, "optional");
        rules[i - 1] = (struct corral_tier_rule){
            corral_checkpath(L, -3), rights_of(L, luaL_checkstring(L, -2)), lua_toboolean(L, -1)};
        lua_pop(L, 4); /* the path stays alive in plan.rules */
    }
    int abi = corral_landlock_abi();
    if (abi < 1) return corral_pushfail(L, "landlock", abi < 0 ? abi : -EOPNOTSUPP), -1;
    size_t failed;
    int rs = corral_tier_ruleset(abi, rules, (size_t)n, &failed);
    if (rs < 0) {
        corral_pushfail(L, failed < (size_t)n ? rules[failed].path : "landlock ruleset", rs);
        return -1;
    }
    *abi_out = abi;
    return rs;
}

static int fd_of(lua_State *L, int idx)
{
    if (lua_isinteger(L, idx)) return (int)lua_tointeger(L, idx);
    luaL_Stream *s = luaL_testudata(L, idx, LUA_FILEHANDLE);
    if (s && s->f) return fileno(s->f);
    return corral_checkfd(L, idx);
}

static void set_number(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* Fills plan from the table at index 1 (kept on the stack below the scratch values it
 * leaves). Returns 0, or the number of failure values pushed (nothing to release then).
 * On 0 the ruleset fd and empty_caps are the caller's to release. */
static int plan_from(lua_State *L, struct corral_tier_plan *plan, int *abi)
{
    memset(plan, 0, sizeof *plan);
    plan->ruleset_fd = -1;
    plan->netns_fd = -1;
    lua_getfield(L, 1, "path");
    plan->path = corral_checkpath(L, -1);
    plan->argv = strings_at(L, "argv");
    plan->envp = strings_at(L, "env");
    lua_getfield(L, 1, "cwd");
    plan->cwd = lua_tostring(L, -1);
    static const char *const stdio_names[] = {"stdin", "stdout", "stderr"};
    for (int i = 0; i < 3; i++) {
        plan->stdio[i] = lua_getfield(L, 1, stdio_names[i]) == LUA_TNIL ? -1 : fd_of(L, -1);
        lua_pop(L, 1);
    }
    if (lua_getfield(L, 1, "netns") != LUA_TNIL) plan->netns_fd = fd_of(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 1, "timeout");
    plan->timeout_ms = (int)(luaL_optnumber(L, -1, 0) * 1000);
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "filters") == LUA_TTABLE) {
        lua_Integer n = luaL_len(L, -1);
        if (n > CORRAL_TIER_MAX_FILTERS)
            luaL_argerror(L, 1, lua_pushfstring(L, "at most %d filters", CORRAL_TIER_MAX_FILTERS));
        for (lua_Integer i = 1; i <= n; i++) {
            lua_geti(L, -1, i);
            plan->filters[plan->n_filters++] = program_named(L, luaL_checkstring(L, -1));
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    if (lua_getfield(L, 1, "supervised") != LUA_TNIL)
        plan->supervised = program_named(L, luaL_checkstring(L, -1));
    lua_pop(L, 1);
    *abi = 0;
    if (lua_getfield(L, 1, "rules") == LUA_TTABLE) {
        plan->ruleset_fd = ruleset_from(L, abi);
        if (plan->ruleset_fd < 0) return 3;
    }
    /* Nothing below raises until both are released. */
    if (lua_getfield(L, 1, "drop_caps") != LUA_TNIL && lua_toboolean(L, -1)) {
        plan->empty_caps = corral_caps_empty();
        if (!plan->empty_caps) {
            if (plan->ruleset_fd >= 0) close(plan->ruleset_fd);
            return corral_pushfail(L, "capabilities", ENOMEM);
        }
    }
    return 0;
}

static void plan_release(struct corral_tier_plan *plan)
{
    if (plan->ruleset_fd >= 0) close(plan->ruleset_fd);
    if (plan->empty_caps) corral_caps_free(plan->empty_caps);
}

static int push_result(lua_State *L, int r, const char *step, const struct corral_tier_result *res,
                       int abi)
{
    if (r < 0) return corral_pushfail(L, step, r);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, res->status);
    lua_setfield(L, -2, "status");
    lua_pushboolean(L, res->timed_out);
    lua_setfield(L, -2, "timed_out");
    lua_pushinteger(L, res->execs_denied);
    lua_setfield(L, -2, "execs_denied");
    set_number(L, "wall_s", res->wall_s);
    set_number(L, "cpu_s", res->cpu_s);
    lua_pushinteger(L, res->max_rss_kb);
    lua_setfield(L, -2, "max_rss_kb");
    lua_pushinteger(L, abi);
    lua_setfield(L, -2, "abi");
    return 1;
}

static int l_run(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    struct corral_tier_plan plan;
    int abi, n = plan_from(L, &plan, &abi);
    if (n) return n;
    struct corral_tier_result res;
    const char *step = "";
    int r = corral_tier_run(&plan, &res, &step);
    plan_release(&plan);
    return push_result(L, r, step, &res, abi);
}

/* A step run by a supervisor process of its own (core.tier.start), so that the caller's
 * thread stays free to serve the egress loop the step's network depends on. */
#define RUNNING_MT "corral.tier.running"

struct running {
    pid_t pid; /* the supervisor; -1 once reaped */
    int fd;    /* read end: one struct outcome when the step is over */
    int abi;
};

struct outcome {
    int r;
    const char *step; /* a static string of tier.c: the same address after fork */
    struct corral_tier_result res;
};

static int running_close(lua_State *L)
{
    struct running *s = luaL_checkudata(L, 1, RUNNING_MT);
    if (s->pid > 0) {
        /* The step's own child has PDEATHSIG set to SIGKILL: it goes with it. */
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
            ;
        s->pid = -1;
    }
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    return 0;
}

static int running_fileno(lua_State *L)
{
    struct running *s = luaL_checkudata(L, 1, RUNNING_MT);
    lua_pushinteger(L, s->fd);
    return 1;
}

static int running_fd(void *ud)
{
    return ((struct running *)ud)->fd;
}

static const corral_fd_reader running_fd_reader = {running_fd};

/* :result() blocks until the step is over; returns what core.tier.run would have. */
static int running_result(lua_State *L)
{
    struct running *s = luaL_checkudata(L, 1, RUNNING_MT);
    if (s->fd < 0) return luaL_error(L, "tier.start: result already taken");
    struct outcome o;
    ssize_t n;
    do
        n = read(s->fd, &o, sizeof o);
    while (n < 0 && errno == EINTR);
    int abi = s->abi;
    lua_settop(L, 1);
    running_close(L);
    if (n != (ssize_t)sizeof o) return corral_pushfail(L, "supervisor", n < 0 ? errno : EPIPE);
    return push_result(L, o.r, o.step, &o.res, abi);
}

static int l_start(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    struct running *s = lua_newuserdatauv(L, sizeof *s, 0);
    s->pid = -1;
    s->fd = -1;
    luaL_setmetatable(L, RUNNING_MT); /* at 2, above the plan */
    struct corral_tier_plan plan;
    int n = plan_from(L, &plan, &s->abi);
    if (n) return n;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        int err = errno;
        plan_release(&plan);
        return corral_pushfail(L, "supervisor", err);
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Only system calls from here (the caller may have threads): tier.c's runner is
         * written for that already. */
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(CORRAL_EXIT_NOTFOUND);
        struct outcome o;
        memset(&o, 0, sizeof o);
        o.step = "";
        o.r = corral_tier_run(&plan, &o.res, &o.step);
        ssize_t w = write(p[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    int err = errno;
    close(p[1]);
    plan_release(&plan);
    if (pid < 0) {
        close(p[0]);
        return corral_pushfail(L, "supervisor", err);
    }
    s->pid = pid;
    s->fd = p[0];
    lua_pushvalue(L, 2);
    return 1;
}

static int l_programs(lua_State *L)
{
    lua_createtable(L, 0, (int)N_PROGRAMS);
    for (size_t i = 0; i < N_PROGRAMS; i++) {
        lua_pushlstring(L, (const char *)programs[i].prog.insns,
                        programs[i].prog.len * sizeof(struct sock_filter));
        lua_setfield(L, -2, programs[i].name);
    }
    return 1;
}

static void *thread_main(void *arg)
{
    return arg;
}

static int attempt_connect(int port)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = connect(s, (struct sockaddr *)&sa, sizeof sa) < 0 ? -errno : 0;
    close(s);
    return r;
}

static int attempt_socketpair(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -errno;
    char c = 'x', got = 0;
    int r = write(sv[0], &c, 1) == 1 && read(sv[1], &got, 1) == 1 && got == 'x' ? 0 : -EIO;
    close(sv[0]);
    close(sv[1]);
    return r;
}

static int l_attempt(lua_State *L)
{
    const char *kind = luaL_checkstring(L, 1);
    int r;
    if (strcmp(kind, "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        r = pid < 0 ? -errno : 0;
        if (pid > 0) waitpid(pid, NULL, 0);
    } else if (strcmp(kind, "thread") == 0) {
        pthread_t t;
        r = -pthread_create(&t, NULL, thread_main, NULL);
        if (r == 0) pthread_join(t, NULL);
    } else if (strcmp(kind, "socket") == 0) {
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        r = s < 0 ? -errno : 0;
        if (s >= 0) close(s);
    } else if (strcmp(kind, "connect") == 0) {
        r = attempt_connect((int)luaL_checkinteger(L, 2));
    } else if (strcmp(kind, "socketpair") == 0) {
        r = attempt_socketpair();
    } else if (strcmp(kind, "capabilities") == 0) {
        /* Succeeds while any capability is effective; EPERM once none is left. */
        char text[1024];
        r = corral_caps_text(text, sizeof text);
        if (r == 0 && strcmp(text, "=") == 0) r = -EPERM;
    } else {
        return luaL_argerror(L, 1, "fork, thread, socket, connect, socketpair or capabilities");
    }
    return corral_result(L, r, kind);
}

int corral_open_tier(lua_State *L)
{
    static const luaL_Reg fns[] = {{"run", l_run},
                                   {"start", l_start},
                                   {"programs", l_programs},
                                   {"attempt", l_attempt},
                                   {NULL, NULL}};
    static const luaL_Reg methods[] = {{"result", running_result},
                                       {"fileno", running_fileno},
                                       {"close", running_close},
                                       {NULL, NULL}};
    luaL_newmetatable(L, RUNNING_MT);
    corral_set_fd_reader(L, &running_fd_reader);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, running_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, running_close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
    luaL_setfuncs(L, fns, 0);
    return 0;
}
