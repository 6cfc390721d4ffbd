/*
 * core.rtnl: links, addresses and routes inside a network namespace (core/lib/rtnl.h).
 * Every verb takes the netns as a corral.fd; each returns true (or a value) or
 * nil, msg, errno.
 *
 *   core.rtnl.netns_open(path)                        -> fd (checked to be a netns)
 *   core.rtnl.link_index(netns, ifname)               -> ifindex
 *   core.rtnl.lo_default_routes(netns)
 *   core.rtnl.veth(host_netns, host_name, peer_netns, peer_name)
 *   core.rtnl.addr(netns, ifname, "192.0.2.1" | "2001:db8::1", prefixlen)
 *   core.rtnl.link_up(netns, ifname)
 *   core.rtnl.link_del(netns, ifname)
 *   core.rtnl.default_via(netns, gateway_ip, ifname)
 *   core.rtnl.mark_local(netns, mark, table)          (see corral_rtnl_mark_local)
 */
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "lcorral.h"
#include "rtnl.h"

static int result(lua_State *L, const char *what, int err)
{
    return corral_result(L, err, what);
}

static int l_netns_open(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    corral_fd *f = corral_newfd(L);
    int fd = corral_netns_open(path);
    if (fd < 0) return corral_pushfail(L, path, fd);
    f->fd = fd;
    return 1;
}

static int l_link_index(lua_State *L)
{
    int ns = corral_checkfd(L, 1);
    const char *ifname = corral_checkpath(L, 2);
    int index = corral_rtnl_link_index(ns, ifname);
    if (index < 0) return corral_pushfail(L, ifname, index);
    lua_pushinteger(L, index);
    return 1;
}

static int l_lo_default_routes(lua_State *L)
{
    int ns = corral_checkfd(L, 1);
    return result(L, "lo default routes", corral_rtnl_lo_default_routes(ns));
}

static int l_veth(lua_State *L)
{
    int host = corral_checkfd(L, 1);
    const char *host_name = corral_checkpath(L, 2);
    int peer = corral_checkfd(L, 3);
    const char *peer_name = corral_checkpath(L, 4);
    return result(L, "veth", corral_rtnl_veth(host, host_name, peer, peer_name));
}

/* The address at arg as bytes; returns its family (raises for anything else). */
static int check_ip(lua_State *L, int arg, unsigned char *bytes)
{
    const char *text = corral_checkpath(L, arg);
    if (inet_pton(AF_INET, text, bytes) == 1) return AF_INET;
    if (inet_pton(AF_INET6, text, bytes) == 1) return AF_INET6;
    return luaL_argerror(L, arg, "not an IPv4 or IPv6 address");
}

static int l_addr(lua_State *L)
{
    unsigned char bytes[sizeof(struct in6_addr)];
    int ns = corral_checkfd(L, 1);
    const char *ifname = corral_checkpath(L, 2);
    int family = check_ip(L, 3, bytes);
    lua_Integer prefix = luaL_checkinteger(L, 4);
    if (prefix < 0 || prefix > (family == AF_INET ? 32 : 128))
        return luaL_argerror(L, 4, "prefix length out of range");
    return result(L, ifname, corral_rtnl_addr(ns, ifname, family, bytes, (int)prefix));
}

static int l_default_via(lua_State *L)
{
    unsigned char bytes[sizeof(struct in6_addr)];
    int ns = corral_checkfd(L, 1);
    int family = check_ip(L, 2, bytes);
    const char *ifname = corral_checkpath(L, 3);
    return result(L, "default route", corral_rtnl_default_via(ns, family, bytes, ifname));
}

static int l_link_up(lua_State *L)
{
    int ns = corral_checkfd(L, 1);
    const char *ifname = corral_checkpath(L, 2);
    return result(L, ifname, corral_rtnl_link_up(ns, ifname));
}

static int l_link_del(lua_State *L)
{
    int ns = corral_checkfd(L, 1);
    const char *ifname = corral_checkpath(L, 2);
    return result(L, ifname, corral_rtnl_link_del(ns, ifname));
}

static int l_mark_local(lua_State *L)
{
    int ns = corral_checkfd(L, 1);
    lua_Integer mark = luaL_checkinteger(L, 2), table = luaL_checkinteger(L, 3);
    luaL_argcheck(L, mark >= 1 && mark <= UINT32_MAX, 2, "mark must be in 1..2^32-1");
    luaL_argcheck(L, table >= 1 && table <= 251, 3, "table must be in 1..251");
    return result(L, "mark route", corral_rtnl_mark_local(ns, (uint32_t)mark, (uint32_t)table));
}

int corral_open_rtnl(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"netns_open", l_netns_open},
                                     {"link_index", l_link_index},
                                     {"lo_default_routes", l_lo_default_routes},
                                     {"veth", l_veth},
                                     {"addr", l_addr},
                                     {"link_up", l_link_up},
                                     {"default_via", l_default_via},
                                     {"link_del", l_link_del},
                                     {"mark_local", l_mark_local},
                                     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
    return 0;
}
