/*
 * The fd userdata every binding returns descriptors in. __gc, __close and :close() are
 * one idempotent function that never raises; :release() hands the number to the caller
 * (who then owns it) and leaves the userdata closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "lcorral.h"

int corral_pushfail(lua_State *L, const char *what, int err)
{
    if (err < 0) err = -err;
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", what, strerror(err));
    lua_pushinteger(L, err);
    return 3;
}

int corral_result(lua_State *L, int rc, const char *what)
{
    if (rc < 0) return corral_pushfail(L, what, rc);
    lua_pushboolean(L, 1);
    return 1;
}

const char *corral_checkpath(lua_State *L, int arg)
{
    size_t len;
    const char *s = luaL_checklstring(L, arg, &len);
    if (strlen(s) != len) luaL_argerror(L, arg, "path contains a NUL byte");
    return s;
}

static corral_fd *tofd(lua_State *L, int arg)
{
    return (corral_fd *)luaL_checkudata(L, arg, CORRAL_FD_TYPE);
}

int corral_checkfd(lua_State *L, int arg)
{
    corral_fd *f = tofd(L, arg);
    if (f->fd < 0) luaL_argerror(L, arg, "fd is closed");
    return f->fd;
}

#define FD_READER_FIELD "__corral_fd_reader"

void corral_set_fd_reader(lua_State *L, const corral_fd_reader *reader)
{
    lua_pushlightuserdata(L, (void *)reader);
    lua_setfield(L, -2, FD_READER_FIELD);
}

int corral_getfd(lua_State *L, int idx, int *fd)
{
    if (lua_isinteger(L, idx)) {
        *fd = (int)lua_tointeger(L, idx);
        return 0;
    }
    corral_fd *f = luaL_testudata(L, idx, CORRAL_FD_TYPE);
    if (f) {
        *fd = f->fd;
        return 0;
    }
    if (lua_type(L, idx) != LUA_TUSERDATA) return -1;
    int t = luaL_getmetafield(L, idx, FD_READER_FIELD);
    if (t == LUA_TNIL) return -1;
    const corral_fd_reader *reader = t == LUA_TLIGHTUSERDATA ? lua_touserdata(L, -1) : NULL;
    lua_pop(L, 1);
    if (!reader) return -1;
    *fd = reader->fd(lua_touserdata(L, idx));
    return 0;
}

static int fd_close(lua_State *L)
{
    corral_fd *f = tofd(L, 1);
    if (f->fd >= 0) {
        int fd = f->fd;
        f->fd = -1;
        close(fd); /* EINTR on close still frees the descriptor on Linux */
    }
    return 0;
}

static int fd_fileno(lua_State *L)
{
    corral_fd *f = tofd(L, 1);
    if (f->fd < 0) return corral_pushfail(L, "fileno", EBADF);
    lua_pushinteger(L, f->fd);
    return 1;
}

static int fd_release(lua_State *L)
{
    corral_fd *f = tofd(L, 1);
    if (f->fd < 0) return corral_pushfail(L, "release", EBADF);
    lua_pushinteger(L, f->fd);
    f->fd = -1;
    return 1;
}

static int fd_tostring(lua_State *L)
{
    corral_fd *f = tofd(L, 1);
    if (f->fd < 0)
        lua_pushliteral(L, "corral.fd (closed)");
    else
        lua_pushfstring(L, "corral.fd (%d)", f->fd);
    return 1;
}

/* core.fd.open(path) → a read-only CLOEXEC fd (e.g. a seccomp program handed to a helper). */
static int fd_open(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    corral_fd *f = corral_newfd(L);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return corral_pushfail(L, path, errno);
    f->fd = fd;
    return 1;
}

corral_fd *corral_newfd(lua_State *L)
{
    corral_fd *f = (corral_fd *)lua_newuserdatauv(L, sizeof *f, 1);
    f->fd = -1;
    luaL_setmetatable(L, CORRAL_FD_TYPE);
    return f;
}

int corral_newpipe(lua_State *L, corral_fd **rd, corral_fd **wr)
{
    *rd = corral_newfd(L);
    *wr = corral_newfd(L);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) return -errno;
    (*rd)->fd = fds[0];
    (*wr)->fd = fds[1];
    return 0;
}

int corral_open_fd(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"close", fd_close}, {"fileno", fd_fileno}, {"release", fd_release}, {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", fd_close},
                                    {"__close", fd_close},
                                    {"__tostring", fd_tostring},
                                    {"__index", NULL},
                                    {NULL, NULL}};
    if (luaL_newmetatable(L, CORRAL_FD_TYPE)) {
        luaL_setfuncs(L, meta, 0);
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, fd_open);
    lua_setfield(L, -2, "open");
    return 0;
}
