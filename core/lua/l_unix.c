/*
 * core.unix: unix stream sockets for the control channel (core/lib/unix.h). Failures:
 * nil, "what: strerror", errno; bad arguments raise. Data moves with core.sock.send and
 * core.sock.recv, which take any socket fd.
 *
 *   core.unix.listen(path[, mode = 0600[, backlog = 16]]) -> fd (non-blocking)
 *   core.unix.connect(path[, timeout_s = 5])            -> fd
 *   core.unix.accept(fd[, send_timeout_s = 0])          -> fd | nil, msg, EAGAIN
 *   core.unix.peercred(fd)                              -> {pid =, uid =, gid =}
 *   core.unix.peer_in_own_userns(fd)                    -> boolean
 *   core.unix.sendmsg(fd, data[, {fd, ...}])             -> bytes sent (fds: corral.fd
 *                                                          or integers, SCM_RIGHTS)
 *   core.unix.recvmsg(fd, max[, max_fds = 0[, wait]])   -> data ("" at EOF), {fd, ...}
 *                                                          | nil, msg, EAGAIN (nothing yet)
 */
#include <errno.h>
#include <unistd.h>
#include <sys/types.h>

#include "lcorral.h"
#include "unix.h"

static int l_listen(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    lua_Integer mode = luaL_optinteger(L, 2, 0600);
    lua_Integer backlog = luaL_optinteger(L, 3, 16);
    if (mode < 0 || mode > 07777) return luaL_argerror(L, 2, "mode out of range");
    if (backlog < 1 || backlog > 4096) return luaL_argerror(L, 3, "backlog out of range 1..4096");
    corral_fd *f = corral_newfd(L);
    int fd = corral_unix_listen(path, (int)backlog, (mode_t)mode);
    if (fd < 0) return corral_pushfail(L, "unix listen", fd);
    f->fd = fd;
    return 1;
}

static int l_connect(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    double s = luaL_optnumber(L, 2, 5);
    corral_fd *f = corral_newfd(L);
    int fd = corral_unix_connect(path, s < 0 ? -1 : (int)(s * 1000));
    if (fd < 0) return corral_pushfail(L, "unix connect", fd);
    f->fd = fd;
    return 1;
}

static int l_accept(lua_State *L)
{
    int lfd = corral_checkfd(L, 1);
    double s = luaL_optnumber(L, 2, 0);
    if (s < 0 || s > 3600) return luaL_argerror(L, 2, "send timeout out of range 0..3600 s");
    corral_fd *f = corral_newfd(L);
    int fd = corral_unix_accept(lfd, (int)(s * 1000));
    if (fd < 0) return corral_pushfail(L, "unix accept", fd);
    f->fd = fd;
    return 1;
}

static int l_peercred(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    pid_t pid;
    uid_t uid;
    gid_t gid;
    int err = corral_unix_peercred(fd, &pid, &uid, &gid);
    if (err < 0) return corral_pushfail(L, "peercred", err);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, pid);
    lua_setfield(L, -2, "pid");
    lua_pushinteger(L, uid);
    lua_setfield(L, -2, "uid");
    lua_pushinteger(L, gid);
    lua_setfield(L, -2, "gid");
    return 1;
}

static int l_peer_in_own_userns(lua_State *L)
{
    int r = corral_unix_peer_in_own_userns(corral_checkfd(L, 1));
    if (r < 0) return corral_pushfail(L, "peer user namespace", r);
    lua_pushboolean(L, r);
    return 1;
}

static int l_sendmsg(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    if (len == 0) return luaL_argerror(L, 2, "nothing to send");
    int fds[CORRAL_UNIX_FDS_MAX];
    size_t n = 0;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_Integer k = luaL_len(L, 3);
        if (k > CORRAL_UNIX_FDS_MAX) return luaL_argerror(L, 3, "too many fds");
        for (lua_Integer i = 1; i <= k; i++) {
            lua_geti(L, 3, i);
            if (corral_getfd(L, -1, &fds[n]) < 0 || fds[n] < 0)
                return luaL_argerror(L, 3, "each entry must be an open fd");
            n++;
            lua_pop(L, 1);
        }
    }
    ssize_t r = corral_unix_send_fds(fd, data, len, fds, n);
    if (r < 0) return corral_pushfail(L, "sendmsg", (int)r);
    lua_pushinteger(L, r);
    return 1;
}

static int l_recvmsg(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    lua_Integer max = luaL_checkinteger(L, 2);
    lua_Integer max_fds = luaL_optinteger(L, 3, 0);
    int wait = lua_toboolean(L, 4);
    if (max < 1 || max > (1 << 20)) return luaL_argerror(L, 2, "max out of range 1..1 MiB");
    if (max_fds < 0 || max_fds > CORRAL_UNIX_FDS_MAX)
        return luaL_argerror(L, 3, "max_fds out of range 0..8");
    int fds[CORRAL_UNIX_FDS_MAX];
    size_t n = 0;
    luaL_Buffer b;
    char *buf = luaL_buffinitsize(L, &b, (size_t)max);
    ssize_t r = corral_unix_recv_fds(fd, buf, (size_t)max, fds, (size_t)max_fds, &n, !wait);
    if (r < 0) return corral_pushfail(L, "recvmsg", (int)r);
    luaL_pushresultsize(&b, (size_t)r);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        corral_fd *f = corral_newfd(L);
        f->fd = fds[i];
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 2;
}

int corral_open_unix(lua_State *L)
{
    static const luaL_Reg fns[] = {{"listen", l_listen},
                                   {"connect", l_connect},
                                   {"accept", l_accept},
                                   {"peercred", l_peercred},
                                   {"peer_in_own_userns", l_peer_in_own_userns},
                                   {"sendmsg", l_sendmsg},
                                   {"recvmsg", l_recvmsg},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
