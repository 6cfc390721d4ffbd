/*
 * core.tcp_listen(addr[, port]) → fd, port; core.tcp_connect(addr, port[, timeout_s]) → fd;
 * core.tcp_accept(fd[, timeout_s]) → fd. Failures: nil, "what: strerror", errno.
 */
#include "lcorral.h"
#include "sock.h"

static int l_listen(lua_State *L)
{
    const char *addr = luaL_checkstring(L, 1);
    int port = (int)luaL_optinteger(L, 2, 0);
    corral_fd *f = corral_newfd(L);
    int bound = 0;
    int fd = corral_tcp_listen(addr, port, &bound);
    if (fd < 0) return corral_pushfail(L, "listen", fd);
    f->fd = fd;
    lua_pushinteger(L, bound);
    return 2;
}

static int timeout_ms(lua_State *L, int arg, double def)
{
    double s = luaL_optnumber(L, arg, def);
    return s < 0 ? -1 : (int)(s * 1000);
}

static int l_connect(lua_State *L)
{
    const char *addr = luaL_checkstring(L, 1);
    int port = (int)luaL_checkinteger(L, 2);
    int ms = timeout_ms(L, 3, 5);
    corral_fd *f = corral_newfd(L);
    int fd = corral_tcp_connect(addr, port, ms);
    if (fd < 0) return corral_pushfail(L, "connect", fd);
    f->fd = fd;
    return 1;
}

static int l_accept(lua_State *L)
{
    int lfd = corral_checkfd(L, 1);
    int ms = timeout_ms(L, 2, 5);
    corral_fd *f = corral_newfd(L);
    int fd = corral_tcp_accept(lfd, ms);
    if (fd < 0) return corral_pushfail(L, "accept", fd);
    f->fd = fd;
    return 1;
}

int corral_open_sock(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"tcp_listen", l_listen}, {"tcp_connect", l_connect}, {"tcp_accept", l_accept}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
