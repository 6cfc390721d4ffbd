/*
 * core.path: the one resolver (core/lib/path.c), so a grant and the invocation it covers
 * are computed by the same code, and the one containment test (core/lib/util.c).
 */
#include <stdlib.h>

#include "lcorral.h"
#include "path.h"
#include "util.h"

/* Pushes the malloc'd result and frees it; the copy into Lua happens before the free,
 * and a memory error raised by the push would only leak this one string. */
static int push_owned(lua_State *L, char *s)
{
    lua_pushstring(L, s);
    free(s);
    return 1;
}

/* core.path.resolve_executable(cmd [, path_env]) -> resolved | cmd unchanged | nil, msg, errno */
static int l_resolve_executable(lua_State *L)
{
    const char *cmd = corral_checkpath(L, 1);
    const char *path_env = lua_isnoneornil(L, 2) ? getenv("PATH") : corral_checkpath(L, 2);
    char *out = NULL;
    int err = corral_resolve_executable(cmd, path_env, &out);
    if (err) return corral_pushfail(L, cmd, err);
    return push_owned(L, out);
}

/* core.path.resolve(p) -> resolved directory | nil, msg, errno */
static int l_resolve_path(lua_State *L)
{
    const char *p = corral_checkpath(L, 1);
    char *out = NULL;
    int err = corral_resolve_dir(p, &out);
    if (err) return corral_pushfail(L, p, err);
    return push_owned(L, out);
}

/* core.path.resolve_file(p) -> resolved existing path of any type | nil, msg, errno */
static int l_resolve_file(lua_State *L)
{
    const char *p = corral_checkpath(L, 1);
    char *out = NULL;
    int err = corral_resolve_file(p, &out);
    if (err) return corral_pushfail(L, p, err);
    return push_owned(L, out);
}

/* core.path.is_beneath(path, dir) -> true when path is dir or lies beneath it (every absolute
 * path is beneath "/"); a string test on resolved paths. */
static int l_is_beneath(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    const char *dir = corral_checkpath(L, 2);
    lua_pushboolean(L, corral_is_beneath(path, dir));
    return 1;
}

int corral_open_path(lua_State *L)
{
    static const luaL_Reg fns[] = {{"resolve_executable", l_resolve_executable},
                                   {"resolve", l_resolve_path},
                                   {"resolve_file", l_resolve_file},
                                   {"is_beneath", l_is_beneath},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
