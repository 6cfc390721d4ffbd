/*
 * core.cgroup: resource cgroups beneath this process's own cgroup.
 *   create{memory=, pids=, cpu_quota_us=, cpu_period_us=, name=} -> cgroup
 *   info() -> {version = "v1"|"v2"|"hybrid", v1 =, v2 =, controllers = {memory = true,
 *             pids =, cpu =, cpuacct =}, paths = {memory = dir, pids =, cpu =, cpuacct =,
 *             unified =}}
 *   cgroup:attach(pid)  cgroup:kill()  cgroup:usage() -> {memory_peak=, memory_current=,
 *   oom_kills=, pids=, cpu_ns=}  cgroup:held() -> {memory=, memsw=, pids=, cpu=}
 *   cgroup:paths() -> {dir, ...}  cgroup:destroy() (= __gc = __close; idempotent, never
 *   raises).
 */
#include <stdint.h>
#include <string.h>

#include "cgroup.h"
#include "lcorral.h"

#define CGROUP_TYPE "corral.cgroup"

typedef struct {
    struct corral_cgroup *cg; /* NULL once destroyed */
} l_cgroup;

static l_cgroup *tocg(lua_State *L)
{
    return (l_cgroup *)luaL_checkudata(L, 1, CGROUP_TYPE);
}

static void set_flags(lua_State *L, unsigned mask)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{CORRAL_CG_MEMORY, "memory"}, {CORRAL_CG_PIDS, "pids"},
                 {CORRAL_CG_CPU, "cpu"},       {CORRAL_CG_CPUACCT, "cpuacct"},
                 {CORRAL_CG_MEMSW, "memsw"},   {CORRAL_CG_KILL, "kill"}};
    lua_createtable(L, 0, 6);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(mask & names[i].bit)) continue;
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, names[i].name);
    }
}

static uint64_t opt_field(lua_State *L, const char *key, uint64_t max)
{
    lua_getfield(L, 1, key);
    uint64_t v = 0;
    if (!lua_isnil(L, -1)) {
        int isnum;
        lua_Integer i = lua_tointegerx(L, -1, &isnum);
        if (!isnum || i < 0 || (uint64_t)i > max)
            luaL_argerror(L, 1, lua_pushfstring(L, "'%s' must be an integer from 0", key));
        v = (uint64_t)i;
    }
    lua_pop(L, 1);
    return v;
}

static int l_create(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const keys[] = {"memory",        "pids", "cpu_quota_us",
                                       "cpu_period_us", "name", NULL};
    /* A misspelt limit would otherwise be a limit silently not applied. */
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pop(L, 1);
        int known = 0;
        for (size_t i = 0; keys[i] && lua_type(L, -1) == LUA_TSTRING; i++)
            known |= strcmp(lua_tostring(L, -1), keys[i]) == 0;
        if (!known)
            luaL_argerror(L, 1,
                          lua_pushfstring(L, "unknown field '%s'", luaL_tolstring(L, -1, NULL)));
    }
    struct corral_cgroup_limits lim = {
        .memory_bytes = opt_field(L, "memory", INT64_MAX),
        .pids = opt_field(L, "pids", INT64_MAX),
        .cpu_quota_us = (uint32_t)opt_field(L, "cpu_quota_us", UINT32_MAX),
        .cpu_period_us = (uint32_t)opt_field(L, "cpu_period_us", UINT32_MAX),
    };
    const char *name = NULL;
    int t = lua_getfield(L, 1, "name");
    if (t != LUA_TNIL && t != LUA_TSTRING) luaL_argerror(L, 1, "'name' must be a string");
    if (t == LUA_TSTRING) name = lua_tostring(L, -1); /* kept on the stack for the call */

    l_cgroup *u = (l_cgroup *)lua_newuserdatauv(L, sizeof *u, 0);
    u->cg = NULL;
    luaL_setmetatable(L, CGROUP_TYPE);
    int rc = corral_cgroup_create(name, &lim, &u->cg);
    if (rc < 0) return corral_pushfail(L, "create cgroup", rc);
    return 1;
}

static int l_destroy(lua_State *L)
{
    l_cgroup *u = tocg(L);
    if (!u->cg) {
        lua_pushboolean(L, 1);
        return 1;
    }
    int rc = corral_cgroup_remove(u->cg);
    /* A failed removal keeps the object so that :destroy() can be retried; the
     * collector gets one last try and then lets go. */
    if (rc == 0 || lua_toboolean(L, lua_upvalueindex(1))) {
        corral_cgroup_free(u->cg);
        u->cg = NULL;
    }
    return corral_result(L, rc, "destroy cgroup");
}

static struct corral_cgroup *checklive(lua_State *L)
{
    l_cgroup *u = tocg(L);
    if (!u->cg) luaL_argerror(L, 1, "cgroup is destroyed");
    return u->cg;
}

static int l_attach(lua_State *L)
{
    struct corral_cgroup *cg = checklive(L);
    lua_Integer pid = luaL_checkinteger(L, 2);
    if (pid <= 0 || pid > INT32_MAX) luaL_argerror(L, 2, "pid out of range");
    int rc = corral_cgroup_attach(cg, (pid_t)pid);
    return corral_result(L, rc, "attach to cgroup");
}

static int l_kill(lua_State *L)
{
    int rc = corral_cgroup_kill(checklive(L));
    return corral_result(L, rc, "kill cgroup");
}

static int l_usage(lua_State *L)
{
    struct corral_cgroup_usage u;
    int rc = corral_cgroup_usage(checklive(L), &u);
    if (rc < 0) return corral_pushfail(L, "cgroup usage", rc);
    lua_createtable(L, 0, 5);
    if (u.have & CORRAL_CG_MEMORY) {
        lua_pushinteger(L, (lua_Integer)u.memory_peak);
        lua_setfield(L, -2, "memory_peak");
        lua_pushinteger(L, (lua_Integer)u.memory_current);
        lua_setfield(L, -2, "memory_current");
        lua_pushinteger(L, (lua_Integer)u.oom_kills);
        lua_setfield(L, -2, "oom_kills");
    }
    if (u.have & CORRAL_CG_PIDS) {
        lua_pushinteger(L, (lua_Integer)u.pids_current);
        lua_setfield(L, -2, "pids");
    }
    if (u.have & CORRAL_CG_CPUACCT) {
        lua_pushinteger(L, (lua_Integer)u.cpu_ns);
        lua_setfield(L, -2, "cpu_ns");
    }
    return 1;
}

static int l_held(lua_State *L)
{
    set_flags(L, corral_cgroup_held(checklive(L)));
    return 1;
}

static int l_paths(lua_State *L)
{
    struct corral_cgroup *cg = checklive(L);
    lua_newtable(L);
    const char *p;
    for (size_t i = 0; (p = corral_cgroup_path(cg, i, NULL)); i++) {
        lua_pushstring(L, p);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int l_tostring(lua_State *L)
{
    l_cgroup *u = tocg(L);
    const char *p = u->cg ? corral_cgroup_path(u->cg, 0, NULL) : NULL;
    if (p)
        lua_pushfstring(L, "corral.cgroup (%s)", p);
    else
        lua_pushliteral(L, "corral.cgroup (destroyed)");
    return 1;
}

static int l_info(lua_State *L)
{
    /* About 20 KiB: a userdata rather than the C stack, collected with the call. */
    struct corral_cgroup_info *info = lua_newuserdatauv(L, sizeof *info, 0);
    int rc = corral_cgroup_info(info);
    if (rc < 0) return corral_pushfail(L, "cgroup info", rc);
    lua_createtable(L, 0, 5);
    int v1 = info->version & CORRAL_CGROUP_V1, v2 = info->version & CORRAL_CGROUP_V2;
    lua_pushstring(L, v1 && v2 ? "hybrid" : v2 ? "v2" : "v1");
    lua_setfield(L, -2, "version");
    lua_pushboolean(L, v1);
    lua_setfield(L, -2, "v1");
    lua_pushboolean(L, v2);
    lua_setfield(L, -2, "v2");
    set_flags(L, info->controllers);
    lua_setfield(L, -2, "controllers");
    lua_createtable(L, 0, (int)info->n);
    for (size_t i = 0; i < info->n; i++) {
        const struct corral_cgroup_hier *h = &info->hier[i];
        /* Co-mounted v1 controllers (cpu,cpuacct) share one directory: named under
         * each. */
        static const struct {
            unsigned bit;
            const char *name;
        } v1names[] = {{CORRAL_CG_MEMORY, "memory"},
                       {CORRAL_CG_PIDS, "pids"},
                       {CORRAL_CG_CPU, "cpu"},
                       {CORRAL_CG_CPUACCT, "cpuacct"}};
        if (h->version == CORRAL_CGROUP_V2) {
            lua_pushstring(L, h->dir);
            lua_setfield(L, -2, "unified");
            continue;
        }
        for (size_t k = 0; k < sizeof v1names / sizeof v1names[0]; k++) {
            if (!(h->controllers & v1names[k].bit)) continue;
            lua_pushstring(L, h->dir);
            lua_setfield(L, -2, v1names[k].name);
        }
    }
    lua_setfield(L, -2, "paths");
    return 1;
}

int corral_open_cgroup(lua_State *L)
{
    static const luaL_Reg methods[] = {{"attach", l_attach}, {"kill", l_kill},   {"usage", l_usage},
                                       {"held", l_held},     {"paths", l_paths}, {NULL, NULL}};
    if (luaL_newmetatable(L, CGROUP_TYPE)) {
        luaL_newlib(L, methods);
        /* One function, three entries; the upvalue is true for __gc only, the last
         * chance to free the object. */
        lua_pushboolean(L, 0);
        lua_pushcclosure(L, l_destroy, 1);
        lua_setfield(L, -2, "destroy");
        lua_setfield(L, -2, "__index");
        lua_pushboolean(L, 0);
        lua_pushcclosure(L, l_destroy, 1);
        lua_setfield(L, -2, "__close");
        lua_pushboolean(L, 1);
        lua_pushcclosure(L, l_destroy, 1);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, l_tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pop(L, 1);

    static const luaL_Reg fns[] = {{"create", l_create}, {"info", l_info}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
