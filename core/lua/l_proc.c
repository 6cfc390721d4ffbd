/*
 * core.proc: this process — who it is (getpid, geteuid, uname), its environment, the
 * execve that ends a launch spec, where the `corral` executable is (the wrapper every
 * confined launch spec names), and how many files it may open:
 *
 *   core.proc.nofile()            -> soft, hard (RLIMIT_NOFILE; math.huge: unlimited)
 *   core.proc.set_nofile(soft)    -> true | nil, msg, errno (the hard limit unchanged)
 *   core.proc.limit(name, n)      -> true | nil, msg, errno: RLIMIT_FSIZE ("fsize") or
 *                                    RLIMIT_NOFILE ("nofile"), soft and hard both n
 *   core.proc.set_title(text)     -> true | nil, msg, errno: /proc/self/cmdline (what ps
 *                                    shows) becomes text, cut to the original's length;
 *                                    nothing of the original arguments stays
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "detach.h"
#include "envblock.h"
#include "lcorral.h"
#include "path.h"
#include "procscan.h"

static int push_if_executable(lua_State *L, const char *candidate)
{
    char *resolved = NULL;
    if (access(candidate, X_OK) != 0) return 0;
    if (corral_resolve_file(candidate, &resolved) < 0) return 0;
    lua_pushstring(L, resolved);
    free(resolved);
    return 1;
}

/* The host sets the registry field at start-up (core/host/main.c). Loaded as
 * corral/core.so into another interpreter, look beside the module: the build tree keeps
 * the host at ../build/corral-host, a LuaRocks or `make install` tree at ../../../../bin;
 * then PATH. */
static int l_host_executable(lua_State *L)
{
    if (lua_getfield(L, LUA_REGISTRYINDEX, "corral.host_executable") == LUA_TSTRING) return 1;
    lua_pop(L, 1);
    Dl_info info;
    if (dladdr((void *)l_host_executable, &info) && info.dli_fname) {
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s", info.dli_fname) < (int)sizeof dir) {
            char *slash = strrchr(dir, '/');
            if (slash) *slash = '\0';
            /* the host, which the front `corral` beside it hands its commands to; a build
             * without a front has only `corral` */
            static const char *const rel[] = {"/../build/corral-host", "/../build/corral",
                                              "/../../../../bin/corral-host",
                                              "/../../../../bin/corral"};
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
                char cand[PATH_MAX + 32];
                snprintf(cand, sizeof cand, "%s%s", slash ? dir : ".", rel[i]);
                if (push_if_executable(L, cand)) return 1;
            }
        }
    }
    static const char *const names[] = {"corral-host", "corral"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *found = NULL;
        if (corral_resolve_executable(names[i], getenv("PATH"), &found) == 0 && found[0] == '/') {
            int ok = push_if_executable(L, found);
            free(found);
            if (ok) return 1;
        } else {
            free(found);
        }
    }
    luaL_pushfail(L);
    lua_pushliteral(L, "the corral executable was not found beside corral/core.so or on PATH");
    return 2;
}

/* core.proc.uname() → sysname, release: chooses the confinement backend (Linux, Darwin). */
static int l_uname(lua_State *L)
{
    struct utsname u;
    if (uname(&u) < 0) return corral_pushfail(L, "uname", errno);
    lua_pushstring(L, u.sysname);
    lua_pushstring(L, u.release);
    return 2;
}

/* core.proc.environ() → {name = value}: the environment the CLI passes through. */
static int l_environ(lua_State *L)
{
    extern char **environ;
    lua_newtable(L);
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        lua_pushlstring(L, *e, (size_t)(eq - *e));
        lua_pushstring(L, eq + 1);
        lua_rawset(L, -3);
    }
    return 1;
}

static char **check_strings(lua_State *L, int arg, const char *what)
{
    luaL_checktype(L, arg, LUA_TTABLE);
    lua_Integer n = luaL_len(L, arg);
    char **v = (char **)lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, arg, i);
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (!s || strlen(s) != len) luaL_argerror(L, arg, what);
        v[i - 1] = (char *)s; /* kept alive by the table */
        lua_pop(L, 1);
    }
    v[n] = NULL;
    return v;
}

/* core.proc.execve(path, argv, envp, cd[, stdio]): replaces this process (a launch spec's
 * last step). argv and envp are lists of strings ("NAME=value" for envp); stdio, three
 * fds that become 0, 1 and 2 (a broker's child runs on its client's). Returns only on
 * failure. */
static int l_execve(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    /* Read before check_strings pushes its scratch space above the arguments. */
    const char *cd = luaL_optstring(L, 4, NULL);
    int stdio[3] = {-1, -1, -1};
    if (!lua_isnoneornil(L, 5)) {
        luaL_checktype(L, 5, LUA_TTABLE);
        for (int i = 0; i < 3; i++) {
            lua_geti(L, 5, i + 1);
            if (corral_getfd(L, -1, &stdio[i]) < 0 || stdio[i] < 0)
                return luaL_argerror(L, 5, "must hold three open fds");
            lua_pop(L, 1);
        }
    }
    char **argv = check_strings(L, 2, "argv must be a list of strings without NUL");
    char **envp = check_strings(L, 3, "envp must be a list of strings without NUL");
    if (cd && chdir(cd) < 0) return corral_pushfail(L, cd, errno);
    /* Moved above 2 first, so that one dup2 never overwrites another's source. */
    for (int i = 0; i < 3 && stdio[0] >= 0; i++)
        if (stdio[i] <= 2 && (stdio[i] = fcntl(stdio[i], F_DUPFD_CLOEXEC, 3)) < 0)
            return corral_pushfail(L, "dup", errno);
    for (int i = 0; i < 3 && stdio[0] >= 0; i++)
        if (dup2(stdio[i], i) < 0) return corral_pushfail(L, "dup2", errno);
    execve(path, argv, envp);
    return corral_pushfail(L, path, errno);
}

static int l_getpid(lua_State *L)
{
    lua_pushinteger(L, getpid());
    return 1;
}

static int l_geteuid(lua_State *L)
{
    lua_pushinteger(L, geteuid());
    return 1;
}

/* core.proc.unsetenv(name) → true: removes a variable from this process's own environment.
 * corral.run clears the credential-shaped ones once it has taken what the tenant is
 * given, so that nothing it loads or starts afterwards (a mechanism's os.execute) can
 * inherit them. */
static int l_unsetenv(lua_State *L)
{
    const char *name = corral_checkpath(L, 1);
    if (!name[0] || strchr(name, '=')) return luaL_argerror(L, 1, "not a variable name");
    if (unsetenv(name) < 0) return corral_pushfail(L, "unsetenv", errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.proc.replace_environ({"NAME=value", ...}) → true: this process's environment
 * becomes exactly these variables, and the block /proc/PID/environ shows is overwritten
 * with them (core/lib/envblock.h). corral.run keeps only what it passes on before a
 * mechanism is loaded: unsetenv alone leaves every original string readable there. */
static int l_replace_environ(lua_State *L)
{
    char **keep = check_strings(L, 1, "must be a list of NAME=value strings without NUL");
    size_t n = 0;
    while (keep[n])
        n++;
    return corral_result(L, corral_environ_replace((const char *const *)keep, n),
                         "replace_environ");
}

/* core.proc.exit(status): ends this process at once, without finalizers or atexit (a
 * watched child from core.spawn.fork, whose objects are the parent's copies). */
static int l_exit_now(lua_State *L)
{
    _exit((int)luaL_optinteger(L, 1, 0));
}

/* core.proc.detach() → "caller", fd | "detached", fd | nil, msg, errno: a process that
 * outlives this one (core/lib/detach.h); the caller's fd reads what the detached one
 * writes to its own. Lua's buffered output is flushed first, or both would write it. */
static int l_detach(lua_State *L)
{
    fflush(NULL);
    corral_fd *f = corral_newfd(L);
    int r = corral_detach(&f->fd);
    if (r < 0) return corral_pushfail(L, "detach", r);
    lua_pushstring(L, r ? "caller" : "detached");
    lua_insert(L, -2);
    return 2;
}

/* The bounds of this process's argument area: /proc/self/stat's fields 48 and 49. */
static int argument_area(unsigned long *start, unsigned long *end)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int err = errno;
    close(fd);
    if (n <= 0) return n < 0 ? -err : -EIO;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    for (int field = 2; p && field < 48; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p, " %lu %lu", start, end) != 2 || *end <= *start) return -EIO;
    return 0;
}

static int l_set_title(lua_State *L)
{
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    unsigned long start, end;
    int r = argument_area(&start, &end);
    if (r < 0) return corral_pushfail(L, "set_title", -r);
    size_t room = end - start;
    if (len >= room) len = room - 1;
    memset((void *)start, 0, room);
    memcpy((void *)start, text, len);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.proc.kill(pid, [sig]) → true: a signal (default SIGKILL) by pid, for the
 * processes of a watched child's tree, which the host holds no pidfd for. A process
 * stopped before it is signalled cannot exit, so its pid cannot be recycled. */
static void push_rlim(lua_State *L, rlim_t v)
{
    if (v == RLIM_INFINITY || v > (rlim_t)LUA_MAXINTEGER)
        lua_pushnumber(L, HUGE_VAL);
    else
        lua_pushinteger(L, (lua_Integer)v);
}

static int l_nofile(lua_State *L)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return corral_pushfail(L, "getrlimit", errno);
    push_rlim(L, rl.rlim_cur);
    push_rlim(L, rl.rlim_max);
    return 2;
}

static int l_set_nofile(lua_State *L)
{
    lua_Integer soft = luaL_checkinteger(L, 1);
    luaL_argcheck(L, soft >= 0, 1, "must be non-negative");
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return corral_pushfail(L, "getrlimit", errno);
    rl.rlim_cur = (rlim_t)soft;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) return corral_pushfail(L, "setrlimit", errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* Both soft and hard: what the caller then runs cannot raise it again. */
static int l_limit(lua_State *L)
{
    static const char *const names[] = {"fsize", "nofile", NULL};
    static const int resources[] = {RLIMIT_FSIZE, RLIMIT_NOFILE};
    int which = luaL_checkoption(L, 1, NULL, names);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0, 2, "must be non-negative");
    struct rlimit rl = {(rlim_t)n, (rlim_t)n};
    if (setrlimit(resources[which], &rl) < 0) return corral_pushfail(L, "setrlimit", errno);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_kill_pid(lua_State *L)
{
    lua_Integer pid = luaL_checkinteger(L, 1);
    if (pid <= 1) return luaL_argerror(L, 1, "must be a process id above 1");
    if (kill((pid_t)pid, (int)luaL_optinteger(L, 2, SIGKILL)) < 0)
        return corral_pushfail(L, "kill", errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* proc.find_owned(uid) → the pid of a live process running as uid, or nil (nil, msg,
 * errno when /proc cannot be read). */
static int l_find_owned(lua_State *L)
{
    lua_Integer uid = luaL_checkinteger(L, 1);
    if (uid < 0 || uid > 0xfffffffe) return luaL_argerror(L, 1, "must be a uid");
    pid_t pid;
    int r = corral_proc_find_owned((uid_t)uid, &pid);
    if (r < 0) return corral_pushfail(L, "/proc", -r);
    if (r == 0) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushinteger(L, pid);
    return 1;
}

int corral_open_proc(lua_State *L)
{
    static const luaL_Reg fns[] = {{"uname", l_uname},       {"getpid", l_getpid},
                                   {"geteuid", l_geteuid},   {"environ", l_environ},
                                   {"execve", l_execve},     {"host_executable", l_host_executable},
                                   {"unsetenv", l_unsetenv}, {"exit", l_exit_now},
                                   {"detach", l_detach},     {"replace_environ", l_replace_environ},
                                   {"kill", l_kill_pid},     {"find_owned", l_find_owned},
                                   {"nofile", l_nofile},     {"set_nofile", l_set_nofile},
                                   {"limit", l_limit},       {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    lua_pushcfunction(L, l_set_title);
    lua_setfield(L, -2, "set_title");
    return 0;
}
