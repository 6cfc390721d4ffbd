/*
 * core.lookup.host(name) -> {addr, ...} | nil, msg, errno: host-name lookup
 * (core/lib/lookup.h) for a connection the egress acceptor already permitted.
 */
#include "lcorral.h"
#include "lookup.h"

static int l_lookup_host(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    char out[16][46];
    int n = corral_lookup_host(name, out, 16);
    if (n < 0) return corral_pushfail(L, name, n);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, out[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

int corral_open_lookup(lua_State *L)
{
    lua_pushcfunction(L, l_lookup_host);
    lua_setfield(L, -2, "host");
    return 0;
}
