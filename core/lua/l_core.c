/*
 * luaopen_corral_core: the one exported symbol of corral/core.so, and the function the
 * `corral` host preloads. Each binding module fills its own table, core.<module>.
 */
#include <errno.h>

#include "exitcodes.h"
#include "lcorral.h"

#define CORRAL_EXPORT __attribute__((visibility("default")))

CORRAL_EXPORT int luaopen_corral_core(lua_State *L);

static void push_errno_constants(lua_State *L)
{
    static const struct {
        const char *name;
        int value;
    } names[] = {
        {"EPERM", EPERM},
        {"ENOENT", ENOENT},
        {"EACCES", EACCES},
        {"EEXIST", EEXIST},
        {"ENOTDIR", ENOTDIR},
        {"EINVAL", EINVAL},
        {"ELOOP", ELOOP},
        {"ENAMETOOLONG", ENAMETOOLONG},
        {"ENOSYS", ENOSYS},
        {"EOPNOTSUPP", EOPNOTSUPP},
        {"EROFS", EROFS},
        {"EXDEV", EXDEV},
        {"ECONNREFUSED", ECONNREFUSED},
        {"EAGAIN", EAGAIN},
        {"EBADF", EBADF},
        {"ETIMEDOUT", ETIMEDOUT},
        {"EFBIG", EFBIG},
        {"EISDIR", EISDIR},
        {"EMFILE", EMFILE},
        {"ENFILE", ENFILE},
        {"EPIPE", EPIPE},
        {"ECONNRESET", ECONNRESET},
        {"ENOMEM", ENOMEM},
        {"ENOSPC", ENOSPC},
        {"ENOBUFS", ENOBUFS},
        {"EDQUOT", EDQUOT},
        {"EADDRINUSE", EADDRINUSE},
    };
    lua_createtable(L, 0, (int)(sizeof names / sizeof names[0]));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lua_pushinteger(L, names[i].value);
        lua_setfield(L, -2, names[i].name);
    }
    lua_setfield(L, -2, "errno");
}

/* core.exit: the statuses corral gives of its own (exitcodes.h holds the table). */
static void push_exit_codes(lua_State *L)
{
    lua_newtable(L);
#define CORRAL_EXIT_PUSH(name, code)                                                               \
    lua_pushinteger(L, code);                                                                      \
    lua_setfield(L, -2, #name);
    CORRAL_EXIT_CODES(CORRAL_EXIT_PUSH)
#undef CORRAL_EXIT_PUSH
    lua_setfield(L, -2, "exit");
}

int luaopen_corral_core(lua_State *L)
{
    lua_newtable(L);
#define CORRAL_CALL_OPEN(name)                                                                     \
    lua_newtable(L);                                                                               \
    corral_open_##name(L);                                                                         \
    lua_setfield(L, -2, #name);
    CORRAL_MODULES(CORRAL_CALL_OPEN)
#undef CORRAL_CALL_OPEN
    push_errno_constants(L);
    push_exit_codes(L);
    lua_pushliteral(L, "corral.core 0.1");
    lua_setfield(L, -2, "_VERSION");
    return 1;
}
