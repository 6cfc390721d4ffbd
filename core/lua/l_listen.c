/*
 * core.listen.in_netns(netns_fd, "tcp" | "udp", addr, port) -> fd, port
 *
 * A listening TCP (or bound UDP) socket created inside the netns (core/lib/listen.h):
 * addr "127.0.0.1", "::1" or "::" (dual stack), port 0 for a kernel-chosen one. A netns
 * that cannot be entered is nil, msg, errno and nothing bound anywhere.
 */
#include <sys/socket.h>

#include "lcorral.h"
#include "listen.h"
#include "sock.h"

static int l_listen_in_netns(lua_State *L)
{
    static const char *const types[] = {"tcp", "udp", NULL};
    int ns = corral_checkfd(L, 1);
    int type = luaL_checkoption(L, 2, NULL, types) ? SOCK_DGRAM : SOCK_STREAM;
    const char *addr = luaL_checkstring(L, 3);
    lua_Integer port = luaL_optinteger(L, 4, 0);
    struct sockaddr_storage ss;
    socklen_t len;
    if (port < 0 || port > 65535) return luaL_argerror(L, 4, "port out of range");
    if (corral_sockaddr_from(addr, 0, &ss, &len) < 0)
        return luaL_argerror(L, 3, "not a numeric IPv4 or IPv6 address");
    corral_fd *f = corral_newfd(L);
    int bound = 0;
    int fd = corral_listen_in_netns(ns, type, addr, (int)port, &bound);
    if (fd < 0) return corral_pushfail(L, "listen_in_netns", fd);
    f->fd = fd;
    lua_pushinteger(L, bound);
    return 2;
}

int corral_open_listen(lua_State *L)
{
    lua_pushcfunction(L, l_listen_in_netns);
    lua_setfield(L, -2, "in_netns");
    return 0;
}
