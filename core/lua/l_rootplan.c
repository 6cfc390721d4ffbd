/*
 * core.rootplan: the root plan (core/lib/rootplan.c) for Lua, so the tenant mechanisms,
 * the confinement module and tier S1 show and refuse the same paths as exec-confined.
 *
 *   runtime_paths() -> {path, ...}   masked_paths() -> {...}   system_paths() -> {...}
 *   program_paths()   startup_files()   network_files()   data_devices() -> {...}
 *   check_boundary(resolved) -> true | nil, reason, kind
 */
#include <limits.h>

#include "lcorral.h"
#include "rootplan.h"

static int push_list(lua_State *L, const char *const *(*get)(size_t *))
{
    size_t n;
    const char *const *paths = get(&n);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, paths[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int l_runtime_paths(lua_State *L)
{
    return push_list(L, corral_rootplan_runtime);
}

static int l_masked_paths(lua_State *L)
{
    return push_list(L, corral_rootplan_masked);
}

static int l_system_paths(lua_State *L)
{
    return push_list(L, corral_rootplan_system);
}

static int l_program_paths(lua_State *L)
{
    return push_list(L, corral_rootplan_programs);
}

static int l_startup_files(lua_State *L)
{
    return push_list(L, corral_rootplan_startup_files);
}

static int l_network_files(lua_State *L)
{
    return push_list(L, corral_rootplan_network_files);
}

static int l_data_devices(lua_State *L)
{
    return push_list(L, corral_rootplan_data_devices);
}

/* check_boundary(resolved): reason follows the path in a message ("would confine
 * nothing"), kind is "root", "system" or "runtime". */
static int l_check_boundary(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    char why[PATH_MAX + 64];
    enum corral_boundary b = corral_rootplan_check_boundary(path, why, sizeof why);
    if (b == CORRAL_BOUNDARY_OK) {
        lua_pushboolean(L, 1);
        return 1;
    }
    luaL_pushfail(L);
    lua_pushstring(L, why);
    lua_pushstring(L, corral_boundary_name(b));
    return 3;
}

int corral_open_rootplan(lua_State *L)
{
    static const luaL_Reg fns[] = {{"runtime_paths", l_runtime_paths},
                                   {"masked_paths", l_masked_paths},
                                   {"system_paths", l_system_paths},
                                   {"program_paths", l_program_paths},
                                   {"startup_files", l_startup_files},
                                   {"network_files", l_network_files},
                                   {"data_devices", l_data_devices},
                                   {"check_boundary", l_check_boundary},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
