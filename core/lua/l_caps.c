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

/* core.caps_drop_all(): drops every capability of the calling process, for good
 * (bounding, ambient, inheritable, permitted, effective; securebits locked). */
static int l_caps_drop_all(lua_State *L)
{
    int r = corral_caps_drop_all();
    if (r < 0) return corral_pushfail(L, "caps_drop_all", r);
    lua_pushboolean(L, 1);
    return 1;
}

int corral_open_caps(lua_State *L)
{
    lua_pushcfunction(L, l_caps_drop_all);
    lua_setfield(L, -2, "caps_drop_all");
    lua_pushcfunction(L, l_caps_text);
    lua_setfield(L, -2, "caps_text");
    return 0;
}
