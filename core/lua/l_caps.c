/*
 * core.caps_text(): the calling process's capability sets as libcap text.
 */
#include "caps.h"
#include "lcorral.h"

static int l_caps_text(lua_State *L)
{
    char buf[1024];
    int r = corral_caps_text(buf, sizeof buf);
    if (r < 0) return corral_pushfail(L, "caps", r);
    lua_pushstring(L, buf);
    return 1;
}

int corral_open_caps(lua_State *L)
{
    lua_pushcfunction(L, l_caps_text);
    lua_setfield(L, -2, "caps_text");
    return 0;
}
