/*
 * core.poll, core.udp_recv/udp_send, core.resolve_host: the small I/O the egress plane's
 * Lua loop needs around the relay (core/lib/udp.c, core/lib/resolve.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lcorral.h"
#include "resolve.h"
#include "udp.h"

#define MAX_POLL 256

static int fd_at(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (lua_isinteger(L, idx)) return (int)lua_tointeger(L, idx);
    corral_fd *f = luaL_testudata(L, idx, CORRAL_FD_TYPE);
    if (f) return f->fd;
    /* anything with a :fileno() method (relay loops, processes) */
    if (luaL_getmetafield(L, idx, "__index") != LUA_TNIL) {
        lua_getfield(L, -1, "fileno");
        if (lua_isfunction(L, -1)) {
            lua_pushvalue(L, idx);
            lua_call(L, 1, 1);
            int fd = (int)luaL_optinteger(L, -1, -1);
            lua_pop(L, 2);
            return fd;
        }
        lua_pop(L, 2);
    }
    return luaL_error(L, "poll: expected an fd, a corral.fd or an object with :fileno()");
}

/* core.poll(list, timeout_s) → list of indices that are readable (or hung up). */
static int l_poll(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    double t = luaL_optnumber(L, 2, -1);
    lua_Integer n = luaL_len(L, 1);
    if (n > MAX_POLL) return luaL_argerror(L, 1, "too many fds");
    struct pollfd pfd[MAX_POLL];
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        pfd[i - 1] = (struct pollfd){.fd = fd_at(L, -1), .events = POLLIN};
        lua_pop(L, 1);
    }
    int r;
    do
        r = poll(pfd, (nfds_t)n, t < 0 ? -1 : (int)(t * 1000));
    while (r < 0 && errno == EINTR);
    if (r < 0) return corral_pushfail(L, "poll", errno);
    lua_newtable(L);
    int k = 0;
    for (lua_Integer i = 0; i < n; i++) {
        if (pfd[i].revents) {
            lua_pushinteger(L, i + 1);
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

static int l_udp_recv(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    char buf[65536], addr[46], local[46];
    int port = 0;
    ssize_t n = corral_udp_recv(fd, buf, sizeof buf, addr, &port, local);
    if (n < 0) return corral_pushfail(L, "recv", (int)n);
    lua_pushlstring(L, buf, (size_t)n);
    lua_pushstring(L, addr);
    lua_pushinteger(L, port);
    lua_pushstring(L, local);
    return 4;
}

static int l_udp_send(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    const char *addr = luaL_checkstring(L, 3);
    int port = (int)luaL_checkinteger(L, 4);
    const char *local = luaL_optstring(L, 5, NULL);
    ssize_t n = corral_udp_send(fd, data, len, addr, port, local);
    if (n < 0) return corral_pushfail(L, "send", (int)n);
    lua_pushinteger(L, n);
    return 1;
}

static int l_resolve_host(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    char out[16][46];
    int n = corral_resolve_host(name, out, 16);
    if (n < 0) return corral_pushfail(L, name, n);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, out[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* core.read(fd, max) → data ("" at EOF) | nil, msg, errno (EAGAIN when nothing waits) */
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

/* core.write(fd, data) → bytes written | nil, msg, errno */
static int l_write(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    ssize_t n = write(fd, data, len);
    if (n < 0) return corral_pushfail(L, "write", errno);
    lua_pushinteger(L, n);
    return 1;
}

/* core.monotime() → seconds (CLOCK_MONOTONIC), for deadlines that wall-clock jumps
 * cannot move. */
static int l_monotime(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

int corral_open_netio(lua_State *L)
{
    static const luaL_Reg fns[] = {{"poll", l_poll},         {"udp_recv", l_udp_recv},
                                   {"udp_send", l_udp_send}, {"resolve_host", l_resolve_host},
                                   {"read", l_read},         {"write", l_write},
                                   {"monotime", l_monotime}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
