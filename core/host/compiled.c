/* The searcher for compiled twins (compiled.h). */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>

#include "compiled.h"

#define COMPILED_DIR_KEY "corral.compiled"

static int newer_or_same(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec > b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec >= b->tv_nsec);
}

/* Whether the twin's first line, "#<source path>", names `source`: the chunk inside
 * carries that path as its name, which a tree moved after the build would get wrong. */
static int stands_for(const char *twin, const char *source)
{
    char line[PATH_MAX + 2];
    FILE *f = fopen(twin, "re");
    if (f == NULL) return 0;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok || line[0] != '#') return 0;
    line[strcspn(line, "\n")] = '\0';
    return strcmp(line + 1, source) == 0;
}

/* package.searchers entry: (name) → loader, source path; or nothing, and the file
 * searcher after it finds (or explains) the source. */
static int search_compiled(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, COMPILED_DIR_KEY);
    const char *dir = lua_tostring(L, -1);
    if (dir == NULL) return 0;
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchpath");
    lua_pushvalue(L, 1);
    lua_getfield(L, -3, "path");
    lua_call(L, 2, 1);
    const char *source = lua_tostring(L, -1);
    if (source == NULL) return 0;
    char twin[PATH_MAX];
    struct stat ts, ss;
    if (snprintf(twin, sizeof twin, "%s/%s.luac", dir, name) >= (int)sizeof twin) return 0;
    if (stat(twin, &ts) < 0 || stat(source, &ss) < 0 || !newer_or_same(&ts.st_mtim, &ss.st_mtim))
        return 0;
    if (!stands_for(twin, source)) return 0;
    if (luaL_loadfilex(L, twin, "b") != LUA_OK) return 0;
    lua_pushvalue(L, -2); /* the loader's second argument is the source, as from a file */
    return 2;
}

void corral_host_use_compiled(lua_State *L, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) return;
    lua_pushstring(L, dir);
    lua_setfield(L, LUA_REGISTRYINDEX, COMPILED_DIR_KEY);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchers");
    /* after the preload searcher, before the Lua file searcher */
    for (lua_Integer i = luaL_len(L, -1); i >= 2; i--) {
        lua_geti(L, -1, i);
        lua_seti(L, -2, i + 1);
    }
    lua_pushcfunction(L, search_compiled);
    lua_seti(L, -2, 2);
    lua_pop(L, 2);
}
