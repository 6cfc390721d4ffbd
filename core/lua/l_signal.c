/*
 * core.signal.fd(names) → fd: blocks the named signals in this process and returns a
 * signalfd for them, so a Lua loop can poll them beside its other fds (a `corral run`
 * forwards SIGINT/SIGTERM/SIGHUP to the sandbox and still cleans up, instead of dying
 * and leaving its cgroup behind). core.signal.read(fd) → signal number, whether a
 * terminal sent it (to its whole process group: a forwarder that also forwards it would
 * deliver it twice) | nil.
 * core.signal.unblock(names) unblocks them again once the fd is closed: closing it does
 * not, and a caller that lives on (the REPL, a script) would keep Ctrl-C blocked.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "lcorral.h"

static const struct {
    const char *name;
    int sig;
} names[] = {{"INT", SIGINT},   {"TERM", SIGTERM}, {"HUP", SIGHUP},
             {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};

/* The set named by the list at arg 1; raises on an unknown name. */
static void check_set(lua_State *L, sigset_t *set)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    sigemptyset(set);
    lua_Integer n = luaL_len(L, 1);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        const char *s = luaL_checkstring(L, -1);
        int found = 0;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            if (strcmp(s, names[k].name) == 0) {
                sigaddset(set, names[k].sig);
                found = 1;
            }
        }
        if (!found) luaL_argerror(L, 1, lua_pushfstring(L, "unknown signal %s", s));
        lua_pop(L, 1);
    }
}

static int l_signal_fd(lua_State *L)
{
    sigset_t set;
    check_set(L, &set);
    corral_fd *f = corral_newfd(L);
    int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd < 0) return corral_pushfail(L, "signalfd", errno);
    sigprocmask(SIG_BLOCK, &set, NULL);
    f->fd = fd;
    return 1;
}

static int l_signal_read(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    struct signalfd_siginfo si;
    ssize_t r = read(fd, &si, sizeof si);
    if (r != (ssize_t)sizeof si) return corral_pushfail(L, "signal_read", r < 0 ? errno : EAGAIN);
    lua_pushinteger(L, (lua_Integer)si.ssi_signo);
    lua_pushboolean(L, si.ssi_code == SI_KERNEL); /* a terminal's, sent to its whole group */
    return 2;
}

static int l_signal_unblock(lua_State *L)
{
    sigset_t set;
    check_set(L, &set);
    if (sigprocmask(SIG_UNBLOCK, &set, NULL) < 0) return corral_pushfail(L, "sigprocmask", errno);
    lua_pushboolean(L, 1);
    return 1;
}

int corral_open_signal(lua_State *L)
{
    lua_pushcfunction(L, l_signal_fd);
    lua_setfield(L, -2, "fd");
    lua_pushcfunction(L, l_signal_read);
    lua_setfield(L, -2, "read");
    lua_pushcfunction(L, l_signal_unblock);
    lua_setfield(L, -2, "unblock");
    return 0;
}
