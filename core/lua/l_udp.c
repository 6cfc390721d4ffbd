/*
 * core.udp: datagrams with their peer and local address (core/lib/udp.h), for the
 * egress plane's DNS responder.
 *
 *   core.udp.recv(fd)                               -> data, addr, port, local_addr
 *   core.udp.send(fd, data, addr, port[, local])    -> bytes sent
 */
#include "lcorral.h"
#include "udp.h"

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

int corral_open_udp(lua_State *L)
{
    static const luaL_Reg fns[] = {{"recv", l_udp_recv}, {"send", l_udp_send}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
