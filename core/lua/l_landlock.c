/*
 * core.landlock.abi(): the Landlock ABI this kernel enforces, or nil, msg, errno.
 * core.landlock.restrict(rules): confines the calling process (irreversibly) to the
 * given paths at the best ABI, e.g. {{path = "/srv/x", access = "rw"},
 * {path = "/usr", access = "rx"}}; access is "r", "rx" or "rw" (rw includes create,
 * remove, rename and truncate beneath the path). Returns the ABI enforced.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "landlock.h"
#include "lcorral.h"

static int l_landlock_abi(lua_State *L)
{
    int abi = corral_landlock_abi();
    if (abi < 0) return corral_pushfail(L, "landlock", abi);
    lua_pushinteger(L, abi);
    return 1;
}

/* The rights of an access string; 0 for none of "r", "rx", "rw". */
static uint64_t access_rights(const char *access)
{
    if (strcmp(access, "r") == 0) return CORRAL_LL_READ_FILE | CORRAL_LL_READ_DIR;
    if (strcmp(access, "rx") == 0) return CORRAL_LL_READ_EXEC;
    if (strcmp(access, "rw") == 0) return CORRAL_LL_FS_ALL;
    return 0;
}

static int l_landlock_restrict(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 1);
    /* Validate every rule before anything is created: a bad rule raises, and raising
     * must not leak the ruleset fd. */
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 1, i);
        luaL_checktype(L, -1, LUA_TTABLE);
        lua_getfield(L, -1, "path");
        corral_checkpath(L, -1);
        lua_getfield(L, -2, "access");
        const char *access = luaL_checkstring(L, -1);
        if (!access_rights(access))
            luaL_argerror(L, 1,
                          lua_pushfstring(L,
                                          "rule %d: access must be \"r\", \"rx\" or \"rw\", not %s",
                                          (int)i, access));
        lua_pop(L, 3);
    }
    int abi = corral_landlock_abi();
    if (abi < 1) return corral_pushfail(L, "landlock", abi < 0 ? abi : -EOPNOTSUPP);
    int rs = corral_landlock_create(abi);
    if (rs < 0) return corral_pushfail(L, "landlock_create_ruleset", rs);
    int r = 0;
    const char *failed = "";
    for (lua_Integer i = 1; r == 0 && i <= n; i++) {
        lua_geti(L, 1, i);
        lua_getfield(L, -1, "path");
        lua_getfield(L, -2, "access");
        failed = lua_tostring(L, -2);
        r = corral_landlock_allow_path(rs, abi, failed, access_rights(lua_tostring(L, -1)), 0);
        lua_pop(L, 3);
    }
    if (r == 0) r = corral_landlock_restrict(rs);
    close(rs);
    if (r < 0) return corral_pushfail(L, failed, r);
    lua_pushinteger(L, abi);
    return 1;
}

int corral_open_landlock(lua_State *L)
{
    lua_pushcfunction(L, l_landlock_abi);
    lua_setfield(L, -2, "abi");
    lua_pushcfunction(L, l_landlock_restrict);
    lua_setfield(L, -2, "restrict");
    return 0;
}
