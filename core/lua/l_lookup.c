/*
 * core.lookup.host(name) -> {addr, ...} | nil, msg, errno: host-name lookup
 * (core/lib/lookup.h) for a connection the egress acceptor already permitted.
 *
 * core.lookup.pool() -> pool | nil, msg, errno: lookups off the caller's thread
 *   pool:submit(name, max) -> id | nil, msg, errno (EAGAIN: max under way, or the process's)
 *   pool:collect() -> {{id =, addrs = {addr, ...}} | {id =, err = msg, errno =}, ...}
 *   pool:running() -> lookups under way     pool:fileno() -> readable while results wait
 *   pool:close()   (also __gc and __close; lookups under way end on their threads)
 * The pool is pollable by core.io.poll (its fd reader).
 */
#include <errno.h>
#include <string.h>

#include "lcorral.h"
#include "lookup.h"

#define POOL_TYPE "corral.lookup_pool"

typedef struct {
    struct corral_lookup_pool *p;
} lpool;

static struct corral_lookup_pool *checkpool(lua_State *L)
{
    lpool *l = (lpool *)luaL_checkudata(L, 1, POOL_TYPE);
    if (!l->p) luaL_argerror(L, 1, "closed lookup pool");
    return l->p;
}

static int l_pool(lua_State *L)
{
    lpool *l = (lpool *)lua_newuserdatauv(L, sizeof *l, 0);
    l->p = NULL;
    luaL_setmetatable(L, POOL_TYPE);
    int err = corral_lookup_pool_new(&l->p);
    if (err < 0) return corral_pushfail(L, "lookup pool", err);
    return 1;
}

static int l_pool_close(lua_State *L)
{
    lpool *l = (lpool *)luaL_checkudata(L, 1, POOL_TYPE);
    struct corral_lookup_pool *p = l->p;
    l->p = NULL;
    corral_lookup_pool_free(p);
    return 0;
}

static int l_pool_submit(lua_State *L)
{
    struct corral_lookup_pool *p = checkpool(L);
    const char *name = luaL_checkstring(L, 2);
    lua_Integer max = luaL_checkinteger(L, 3);
    luaL_argcheck(L, max > 0, 3, "must be positive");
    uint64_t id;
    int r = corral_lookup_submit(p, name, (size_t)max, &id);
    if (r < 0) return corral_pushfail(L, name, r);
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

static int l_pool_collect(lua_State *L)
{
    struct corral_lookup_pool *p = checkpool(L);
    struct corral_lookup_result res;
    lua_newtable(L);
    for (int i = 1; corral_lookup_collect(p, &res) == 1; i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, (lua_Integer)res.id);
        lua_setfield(L, -2, "id");
        if (res.n < 0) {
            lua_pushfstring(L, "%s", strerror(-res.n));
            lua_setfield(L, -2, "err");
            lua_pushinteger(L, -res.n);
            lua_setfield(L, -2, "errno");
        } else {
            lua_createtable(L, res.n, 0);
            for (int k = 0; k < res.n; k++) {
                lua_pushstring(L, res.addrs[k]);
                lua_rawseti(L, -2, k + 1);
            }
            lua_setfield(L, -2, "addrs");
        }
        lua_rawseti(L, -2, i);
    }
    return 1;
}

static int l_pool_running(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)corral_lookup_running(checkpool(L)));
    return 1;
}

static int l_pool_fileno(lua_State *L)
{
    lua_pushinteger(L, corral_lookup_pool_fd(checkpool(L)));
    return 1;
}

static int pool_fd(void *ud)
{
    lpool *l = ud;
    return l->p ? corral_lookup_pool_fd(l->p) : -1;
}

static const corral_fd_reader pool_fd_reader = {pool_fd};

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
    static const luaL_Reg methods[] = {{"submit", l_pool_submit},   {"collect", l_pool_collect},
                                       {"running", l_pool_running}, {"fileno", l_pool_fileno},
                                       {"close", l_pool_close},     {NULL, NULL}};
    static const luaL_Reg meta[] = {
        {"__gc", l_pool_close}, {"__close", l_pool_close}, {"__index", NULL}, {NULL, NULL}};
    if (luaL_newmetatable(L, POOL_TYPE)) {
        luaL_setfuncs(L, meta, 0);
        corral_set_fd_reader(L, &pool_fd_reader);
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_lookup_host);
    lua_setfield(L, -2, "host");
    lua_pushcfunction(L, l_pool);
    lua_setfield(L, -2, "pool");
    lua_pushinteger(L, CORRAL_LOOKUP_THREADS_MAX);
    lua_setfield(L, -2, "THREADS_MAX");
    return 0;
}
