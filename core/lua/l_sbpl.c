/*
 * core.sbpl.emit(permit_path, extras, runtime_reads[, files[, sockets]])
 *   -> profile text | nil, msg, EINVAL. extras are directories (read-write), files are
 *   granted read-only and sockets to connect to, each alone.
 * Paths are taken as given (lua/corral/sbpl.lua resolves them first); a path the
 * profile could not express faithfully is a refusal naming the argument, not a raise,
 * because it is data from the caller's configuration rather than a programming error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lcorral.h"
#include "sbpl.h"

/* Validates one path; on refusal pushes nil, "sbpl: <what>: Invalid argument", EINVAL. */
static const char *check_one(lua_State *L, int idx, const char *what, int *nret)
{
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    *nret = 0;
    /* A NUL ends the C string early: the grant would be for a different path. */
    if (strlen(s) != len || corral_sbpl_check_path(s)) {
        lua_pushfstring(L, "sbpl: %s", what);
        *nret = corral_pushfail(L, lua_tostring(L, -1), EINVAL);
        return NULL;
    }
    return s;
}

/* Reads list argument arg (nil = empty) into a userdata array of string pointers; the
 * strings stay alive because the table stays on the stack. Returns the count, or
 * (size_t)-1 after pushing a refusal (nret results). */
static size_t check_list(lua_State *L, int arg, const char *name, const char *const **out,
                         int *nret)
{
    *out = NULL;
    *nret = 0;
    if (lua_isnoneornil(L, arg)) return 0;
    luaL_checktype(L, arg, LUA_TTABLE);
    size_t n = (size_t)luaL_len(L, arg);
    const char **v = lua_newuserdatauv(L, (n ? n : 1) * sizeof *v, 0);
    /* The array stays on the stack, above the arguments, for the rest of the call. */
    for (size_t i = 0; i < n; i++) {
        int t = lua_geti(L, arg, (lua_Integer)(i + 1));
        if (t != LUA_TSTRING) {
            lua_pushfstring(L, "%s[%d] is a %s, not a string", name, (int)(i + 1),
                            lua_typename(L, t));
            luaL_argerror(L, arg, lua_tostring(L, -1));
        }
        char what[64];
        snprintf(what, sizeof what, "%s[%d]", name, (int)(i + 1));
        v[i] = check_one(L, -1, what, nret);
        if (!v[i]) return (size_t)-1;
        lua_pop(L, 1);
    }
    *out = v;
    return n;
}

static int l_sbpl(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TSTRING);
    lua_settop(L, 5);
    int nret;
    struct corral_sbpl_spec spec = {0};
    spec.permit_path = check_one(L, 1, "permit_path", &nret);
    if (!spec.permit_path) return nret;
    spec.n_extras = check_list(L, 2, "extras", &spec.extras, &nret);
    if (spec.n_extras == (size_t)-1) return nret;
    spec.n_runtime_reads = check_list(L, 3, "runtime_reads", &spec.runtime_reads, &nret);
    if (spec.n_runtime_reads == (size_t)-1) return nret;
    spec.n_files = check_list(L, 4, "files", &spec.files, &nret);
    if (spec.n_files == (size_t)-1) return nret;
    spec.n_sockets = check_list(L, 5, "sockets", &spec.sockets, &nret);
    if (spec.n_sockets == (size_t)-1) return nret;

    char *out = NULL;
    int err = corral_sbpl_emit(&spec, &out);
    if (err) return corral_pushfail(L, "sbpl", err);
    lua_pushstring(L, out);
    free(out);
    return 1;
}

int corral_open_sbpl(lua_State *L)
{
    lua_pushcfunction(L, l_sbpl);
    lua_setfield(L, -2, "emit");
    return 0;
}
