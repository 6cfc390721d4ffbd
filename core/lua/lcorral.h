/*
 * Shared helpers for the bindings in core/lua: the error convention, the fd userdata,
 * and the list of binding modules that luaopen_corral_core registers.
 *
 * Convention (liolib.c): an OS failure returns `nil, "what: strerror", errno` (always
 * three values, through corral_pushfail or corral_result); a bad argument raises through
 * luaL_argerror. A lookup that finds nothing (core.inet.unmap, core.dns.error_rcode) is a
 * plain nil, and a verdict (core.rootplan.check_boundary) is nil, reason, kind. An fd is
 * a userdata allocated *before* the syscall that creates it, so a failed allocation can
 * never leak the fd.
 */
#ifndef CORRAL_LCORRAL_H
#define CORRAL_LCORRAL_H

#include <lua.h>
#include <lauxlib.h>

#define CORRAL_FD_TYPE "corral.fd"

typedef struct corral_fd {
    int fd; /* -1 once closed or released */
} corral_fd;

/* THE failure result of every binding: pushes nil, "what: strerror(err)", err (err
 * positive or negative, errno style); returns 3. */
int corral_pushfail(lua_State *L, const char *what, int err);

/* The result of a core/lib call that returns 0 or -errno and has nothing else to say:
 * true, or corral_pushfail(what, rc). Returns the number of values pushed. */
int corral_result(lua_State *L, int rc, const char *what);

/* Allocates a closed fd userdata (fd = -1) with its metatable; the caller stores the fd. */
corral_fd *corral_newfd(lua_State *L);

/* Pushes two fd userdata, then fills them with a CLOEXEC pipe: *rd the read end (pushed
 * first), *wr the write end. Returns 0, or -errno with both left closed. */
int corral_newpipe(lua_State *L, corral_fd **rd, corral_fd **wr);

/* Checks that argument arg is an open corral.fd and returns its descriptor. */
int corral_checkfd(lua_State *L, int arg);

/* A userdata type other than corral.fd that holds a pollable fd (a process's pidfd, a
 * relay loop's epoll fd, a running tier step's pipe) names the C function that reads it
 * in its metatable, so that core.io.poll reads the fd without calling back into Lua. */
typedef struct corral_fd_reader {
    int (*fd)(void *ud); /* the fd, or -1 once closed */
} corral_fd_reader;

/* Stores reader (static storage) in the metatable on top of the stack. */
void corral_set_fd_reader(lua_State *L, const corral_fd_reader *reader);

/* The fd of the value at idx: an integer, a corral.fd or a userdata with a reader (-1
 * when it is closed). Returns 0, or -1 when the value holds no fd (the caller raises). */
int corral_getfd(lua_State *L, int idx, int *fd);

/* A poll list for core.io.poll and a relay loop's poll: the fds of the list (a table,
 * argument arg, at most CORRAL_POLL_MAX entries, each as corral_getfd reads it) into pfd,
 * each asked for POLLIN; returns how many. Raises naming the argument and the entry. */
#define CORRAL_POLL_MAX 256
struct pollfd;
int corral_check_poll_list(lua_State *L, int arg, struct pollfd *pfd);

/* Pushes the list of the indices (from 1) of pfd's n entries that reported an event. */
void corral_push_ready(lua_State *L, const struct pollfd *pfd, int n);

/* Checks that argument arg is a string without embedded NUL bytes. */
const char *corral_checkpath(lua_State *L, int arg);

/*
 * Every binding module, one Lua namespace each: for a line X(name), luaopen_corral_core
 * creates the table core.<name> and calls `int corral_open_<name>(lua_State *L)`, which
 * stores its functions and constants into the table on top of the stack. Add one line
 * per module; a module is one file l_<name>.c over one core/lib unit where it can be.
 */
#define CORRAL_MODULES(X)                                                                          \
    X(fd)                                                                                          \
    X(path)                                                                                        \
    X(sbpl)                                                                                        \
    X(landlock)                                                                                    \
    X(proc)                                                                                        \
    X(rootplan)                                                                                    \
    X(seccomp)                                                                                     \
    X(cgroup)                                                                                      \
    X(ns)                                                                                          \
    X(dns)                                                                                         \
    X(sni)                                                                                         \
    X(nft)                                                                                         \
    X(rtnl)                                                                                        \
    X(spawn)                                                                                       \
    X(sock)                                                                                        \
    X(unix)                                                                                        \
    X(listen)                                                                                      \
    X(relay)                                                                                       \
    X(io)                                                                                          \
    X(udp)                                                                                         \
    X(udprelay)                                                                                    \
    X(lookup)                                                                                      \
    X(clock)                                                                                       \
    X(inet)                                                                                        \
    X(signal)                                                                                      \
    X(fs)                                                                                          \
    X(tty)                                                                                         \
    X(digest)                                                                                      \
    X(tier)                                                                                        \
    X(vm)                                                                                          \
    X(idmap)                                                                                       \
    X(disk)

#define CORRAL_DECLARE_OPEN(name) int corral_open_##name(lua_State *L);
CORRAL_MODULES(CORRAL_DECLARE_OPEN)
#undef CORRAL_DECLARE_OPEN

#endif
