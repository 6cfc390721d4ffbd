/*
 * core.landlock_abi(): the Landlock ABI this kernel enforces, or nil, msg, errno.
 */
#include "landlock.h"
#include "lcorral.h"

static int l_landlock_abi(lua_State *L)
{
    int abi = corral_landlock_abi();
    if (abi < 0) return corral_pushfail(L, "landlock", abi);
    lua_pushinteger(L, abi);
    return 1;
}

int corral_open_landlock(lua_State *L)
{
    lua_pushcfunction(L, l_landlock_abi);
    lua_setfield(L, -2, "landlock_abi");
    return 0;
}
