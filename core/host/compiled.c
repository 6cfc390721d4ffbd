/* The searcher for compiled twins (compiled.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>

#include "compiled.h"

#define COMPILED_DIR_KEY "corral.compiled"
/* A twin larger than this is not one `make` wrote. */
#define TWIN_MAX (16 << 20)

static int newer_or_same(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec > b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec >= b->tv_nsec);
}

/* The twin's whole content, read through one descriptor (the file searcher's
 * fopen/freopen pair cost ~10 system calls a module: measured 23 modules, ~0.3 ms), or
 * NULL when it is missing, older than the source (its status `ss`) or unreadable. The
 * caller frees it. */
static char *read_twin(const char *twin, const struct stat *ss, size_t *len)
{
    struct stat ts;
    int fd = open(twin, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    char *buf = NULL;
    if (fstat(fd, &ts) == 0 && S_ISREG(ts.st_mode) && ts.st_size > 0 && ts.st_size <= TWIN_MAX &&
        newer_or_same(&ts.st_mtim, &ss->st_mtim))
        buf = malloc((size_t)ts.st_size);
    size_t got = 0;
    while (buf != NULL && got < (size_t)ts.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)ts.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(buf);
            buf = NULL;
        } else {
            got += (size_t)n;
        }
    }
    close(fd);
    *len = got;
    return buf;
}

/* The length of the twin's first line, "#<source path>\n", when it names `source`: the
 * chunk after it carries that path as its name, which a tree moved after the build would
 * get wrong. 0 otherwise. */
static size_t stands_for(const char *buf, size_t len, const char *source)
{
    size_t n = strlen(source);
    if (len < n + 2 || buf[0] != '#' || memcmp(buf + 1, source, n) != 0 || buf[n + 1] != '\n')
        return 0;
    return n + 2;
}

/* Pushes the first of package.path's templates, its '?' replaced by `name` (its dots
 * made '/'), that names an existing file, and fills *st with its status; pushes nothing
 * and returns 0 when none does. package.searchpath finds the same one (it takes the
 * first it can open, which for a file that exists differs only when it is unreadable,
 * and then no twin of it is taken: see below) but by an open and a close each, and the
 * status is needed anyway: together 2 of the 7 system calls a module took. */
static int find_source(lua_State *L, const char *name, struct stat *st)
{
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    const char *path = lua_tostring(L, -1);
    lua_pop(L, 2); /* package.path stays referenced by package */
    if (path == NULL) return 0;
    const char *file = luaL_gsub(L, name, ".", LUA_DIRSEP);
    int found = 0;
    for (const char *t = path; !found && *t;) {
        const char *end = strchr(t, *LUA_PATH_SEP);
        size_t n = end ? (size_t)(end - t) : strlen(t);
        lua_pushlstring(L, t, n);
        const char *candidate = luaL_gsub(L, lua_tostring(L, -1), LUA_PATH_MARK, file);
        lua_remove(L, -2);
        found = n > 0 && stat(candidate, st) == 0;
        if (!found) lua_pop(L, 1);
        t = end ? end + 1 : t + n;
    }
    if (found)
        lua_remove(L, -2); /* the file name */
    else
        lua_pop(L, 1);
    return found;
}

/* package.searchers entry: (name) → loader, source path; or nothing, and the file
 * searcher after it finds (or explains) the source. */
static int search_compiled(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, COMPILED_DIR_KEY);
    const char *dir = lua_tostring(L, -1);
    if (dir == NULL) return 0;
    struct stat ss;
    if (!find_source(L, name, &ss)) return 0;
    const char *source = lua_tostring(L, -1);
    /* a source this process may not read is the file searcher's to pass over or refuse
     * (asked only of one others may not read: sources are 0644) */
    if (!(ss.st_mode & S_IROTH) && access(source, R_OK) < 0) return 0;
    char twin[PATH_MAX];
    if (snprintf(twin, sizeof twin, "%s/%s.luac", dir, name) >= (int)sizeof twin) return 0;
    size_t len;
    char *buf = read_twin(twin, &ss, &len);
    if (buf == NULL) return 0;
    size_t skip = stands_for(buf, len, source);
    lua_pushfstring(L, "@%s", twin);
    int status = skip == 0 ? LUA_ERRFILE
                           : luaL_loadbufferx(L, buf + skip, len - skip, lua_tostring(L, -1), "b");
    free(buf);
    if (status != LUA_OK) return 0;
    lua_pushvalue(L, -3); /* the loader's second argument is the source, as from a file */
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
