/*
 * core.rootplan: the root plan (core/lib/rootplan.c) for Lua, so the tenant mechanisms,
 * the confinement module and tier S1 show and refuse the same paths as exec-confined.
 *
 *   runtime_paths() -> {path, ...}   masked_paths() -> {...}   system_paths() -> {...}
 *   program_paths()   startup_files()   network_files()   data_devices() -> {...}
 *   name_files() -> {...}
 *   check_boundary(resolved) -> true | nil, reason, kind
 *   check_file(resolved) -> true | nil, reason, kind   (a file or socket granted alone)
 */
#include <limits.h>

#include "lcorral.h"
#include "rootplan.h"

/* Each list, by its Lua name; its function reads the entry from its upvalue. */
static const struct list {
    const char *name;
    const char *const *(*get)(size_t *n);
} lists[] = {
    {"runtime_paths", corral_rootplan_runtime},
    {"masked_paths", corral_rootplan_masked},
    {"system_paths", corral_rootplan_system},
    {"program_paths", corral_rootplan_programs},
    {"startup_files", corral_rootplan_startup_files},
    {"network_files", corral_rootplan_network_files},
    {"data_devices", corral_rootplan_data_devices},
    {"name_files", corral_rootplan_name_files},
};

static int l_list(lua_State *L)
{
    const struct list *list = lua_touserdata(L, lua_upvalueindex(1));
    size_t n;
    const char *const *paths = list->get(&n);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, paths[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* true, or nil, the reason and the kind's name. */
static int push_verdict(lua_State *L, enum corral_boundary b, const char *why)
{
    if (b == CORRAL_BOUNDARY_OK) {
        lua_pushboolean(L, 1);
        return 1;
    }
    luaL_pushfail(L);
    lua_pushstring(L, why);
    lua_pushstring(L, corral_boundary_name(b));
    return 3;
}

/* check_boundary(resolved): reason follows the path in a message ("would confine
 * nothing"), kind is "root", "system" or "runtime". */
static int l_check_boundary(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    char why[PATH_MAX + 64];
    return push_verdict(L, corral_rootplan_check_boundary(path, why, sizeof why), why);
}

/* check_file(resolved): the same for one file; kind also "masked". */
static int l_check_file(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    char why[PATH_MAX + 64];
    return push_verdict(L, corral_rootplan_check_file(path, why, sizeof why), why);
}

int corral_open_rootplan(lua_State *L)
{
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        lua_pushlightuserdata(L, (void *)&lists[i]);
        lua_pushcclosure(L, l_list, 1);
        lua_setfield(L, -2, lists[i].name);
    }
    lua_pushcfunction(L, l_check_boundary);
    lua_setfield(L, -2, "check_boundary");
    lua_pushcfunction(L, l_check_file);
    lua_setfield(L, -2, "check_file");
    return 0;
}
