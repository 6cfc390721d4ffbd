/*
 * core.io: poll, read and write over fds of any kind (sockets, pipes, signalfds, a relay
 * loop, a process, a tier step: each read in C, see corral_getfd), for the Lua loops
 * around the relay; pipes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lcorral.h"
#include "util.h"

int corral_check_poll_list(lua_State *L, int arg, struct pollfd *pfd)
{
    luaL_checktype(L, arg, LUA_TTABLE);
    lua_Integer n = luaL_len(L, arg);
    if (n > CORRAL_POLL_MAX) luaL_argerror(L, arg, "too many fds");
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, arg, i);
        if (corral_getfd(L, -1, &pfd[i - 1].fd) < 0)
            luaL_argerror(L, arg,
                          lua_pushfstring(L,
                                          "entry %d: expected an fd, a corral.fd or a corral "
                                          "object with an fd (a process, a relay loop, a tier "
                                          "step)",
                                          (int)i));
        pfd[i - 1].events = POLLIN;
        pfd[i - 1].revents = 0;
        lua_pop(L, 1);
    }
    return (int)n;
}

void corral_push_ready(lua_State *L, const struct pollfd *pfd, int n)
{
    lua_newtable(L);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (pfd[i].revents) {
            lua_pushinteger(L, i + 1);
            lua_rawseti(L, -2, ++k);
        }
    }
}

/* core.io.poll(list, timeout_s) → list of indices that are readable (or hung up). */
static int l_poll(lua_State *L)
{
    struct pollfd pfd[CORRAL_POLL_MAX];
    int n = corral_check_poll_list(L, 1, pfd);
    double t = luaL_optnumber(L, 2, -1);
    int r;
    do
        r = poll(pfd, (nfds_t)n, t < 0 ? -1 : (int)(t * 1000));
    while (r < 0 && errno == EINTR);
    if (r < 0) return corral_pushfail(L, "poll", errno);
    corral_push_ready(L, pfd, n);
    return 1;
}

/* core.io.read(fd, max) → data ("" at EOF) | nil, msg, errno (EAGAIN when nothing waits) */
static int l_read(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    lua_Integer max = luaL_optinteger(L, 2, 65536);
    if (max < 1 || max > 1 << 20) return luaL_argerror(L, 2, "1..1048576");
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)max);
    ssize_t n = recv(fd, p, (size_t)max, MSG_DONTWAIT);
    if (n < 0 && errno == ENOTSOCK) n = read(fd, p, (size_t)max);
    if (n < 0) return corral_pushfail(L, "read", errno);
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
}

/* core.io.write(fd, data) → bytes written | nil, msg, errno. A reader gone is EPIPE, never
 * SIGPIPE: the loop writes tenants' sockets (a DNS answer over TCP), and a tenant that
 * resets one must not end the host (a socket is written with MSG_NOSIGNAL, anything else
 * through corral_write_nosigpipe). */
static int l_write(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = corral_write_nosigpipe(fd, data, len);
    if (n < 0) return corral_pushfail(L, "write", errno);
    lua_pushinteger(L, n);
    return 1;
}

/* core.io.pipe() → read end, write end: both CLOEXEC, the read end non-blocking, so a
 * loop that reads only what poll reported never waits on a writer that still holds its
 * end (a helper's daemon inheriting a child's stderr). */
static int l_pipe(lua_State *L)
{
    corral_fd *rd, *wr;
    int err = corral_newpipe(L, &rd, &wr);
    if (err) return corral_pushfail(L, "pipe", err);
    int flags = fcntl(rd->fd, F_GETFL);
    if (flags < 0 || fcntl(rd->fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return corral_pushfail(L, "pipe", errno); /* both fds close with their userdata */
    return 2;
}

/* core.io.dup_stdio(fd0, fd1, fd2) → true: makes this process's 0, 1 and 2 copies of the
 * given fds (a forked child that runs Lua code writing to its own stdio: a custom
 * mechanism's exec on a session client's fds). Sources at or below 2 are moved above it
 * first, so that one dup2 never overwrites another's source. */
static int l_dup_stdio(lua_State *L)
{
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = corral_checkfd(L, i + 1);
    for (int i = 0; i < 3; i++)
        if (fds[i] <= 2 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0)
            return corral_pushfail(L, "dup", errno);
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], i) < 0) return corral_pushfail(L, "dup2", errno);
    lua_pushboolean(L, 1);
    return 1;
}

int corral_open_io(lua_State *L)
{
    static const luaL_Reg fns[] = {{"poll", l_poll}, {"read", l_read},           {"write", l_write},
                                   {"pipe", l_pipe}, {"dup_stdio", l_dup_stdio}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
