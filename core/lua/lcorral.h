/*
 * Shared helpers for the bindings in core/lua: the error convention, the fd userdata,
 * and the list of binding modules that luaopen_corral_core registers.
 *
 * Convention (liolib.c): an OS failure returns `nil, "what: strerror", errno`; a bad
 * argument raises through luaL_argerror. An fd is a userdata allocated *before* the
 * syscall that creates it, so a failed allocation can never leak the fd.
 */
#ifndef CORRAL_LCORRAL_H
#define CORRAL_LCORRAL_H

#include <lua.h>
#include <lauxlib.h>

#define CORRAL_FD_TYPE "corral.fd"

typedef struct corral_fd {
    int fd; /* -1 once closed or released */
} corral_fd;

/* Pushes nil, "what: strerror(err)", err (err positive or negative); returns 3. */
int corral_pushfail(lua_State *L, const char *what, int err);

/* Allocates a closed fd userdata (fd = -1) with its metatable; the caller stores the fd. */
corral_fd *corral_newfd(lua_State *L);

/* Checks that argument arg is an open corral.fd and returns its descriptor. */
int corral_checkfd(lua_State *L, int arg);

/* Checks that argument arg is a string without embedded NUL bytes. */
const char *corral_checkpath(lua_State *L, int arg);

/*
 * Every binding module: CORRAL_MODULE(name) declares `int corral_open_<name>(lua_State *L)`,
 * which stores its functions into the table on top of the stack. Add one line per module.
 */
#define CORRAL_MODULES(X)                                                                          \
    X(fd)                                                                                          \
    X(path)                                                                                        \
    X(sbpl)                                                                                        \
    X(landlock)                                                                                    \
    X(confine)                                                                                     \
    X(rootplan)                                                                                    \
    X(caps)                                                                                        \
    X(seccomp)                                                                                     \
    X(cgroup)                                                                                      \
    X(ns)                                                                                          \
    X(dns)                                                                                         \
    X(sni)                                                                                         \
    X(nft)                                                                                         \
    X(rtnl)                                                                                        \
    X(spawn)                                                                                       \
    X(sock)                                                                                        \
    X(listen)                                                                                      \
    X(relay)                                                                                       \
    X(netio)                                                                                       \
    X(inet)                                                                                        \
    X(signal)                                                                                      \
    X(fs)                                                                                          \
    X(tty)                                                                                         \
    X(digest)                                                                                      \
    X(tier)                                                                                        \
    X(vm)

#define CORRAL_DECLARE_OPEN(name) int corral_open_##name(lua_State *L);
CORRAL_MODULES(CORRAL_DECLARE_OPEN)
#undef CORRAL_DECLARE_OPEN

#endif
