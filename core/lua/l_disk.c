/*
 * core.disk: a sandbox's own disk image on a loop device (core/lib/disk.c).
 *
 *   open(path[, create_bytes]) → fd, bytes | nil, msg, errno
 *   attach(image_fd[, fstype = "ext4"]) → mount fd, "/dev/loopN" | nil, msg, errno
 */
#include <errno.h>
#include <stdio.h>

#include "disk.h"
#include "lcorral.h"

static int l_open(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    lua_Integer create = luaL_optinteger(L, 2, 0);
    luaL_argcheck(L, create >= 0, 2, "size must not be negative");
    corral_fd *f = corral_newfd(L);
    uint64_t bytes = 0;
    int fd = corral_disk_open(path, (uint64_t)create, &bytes);
    if (fd < 0) return corral_pushfail(L, path, fd);
    f->fd = fd;
    lua_pushinteger(L, (lua_Integer)bytes);
    return 2;
}

static int l_attach(lua_State *L)
{
    int image = corral_checkfd(L, 1);
    const char *fstype = luaL_optstring(L, 2, "ext4");
    corral_fd *f = corral_newfd(L);
    int loop = -1;
    int fd = corral_disk_attach(image, fstype, &loop);
    if (fd < 0) return corral_pushfail(L, "attach disk", fd);
    f->fd = fd;
    lua_pushfstring(L, "/dev/loop%d", loop);
    return 2;
}

int corral_open_disk(lua_State *L)
{
    static const luaL_Reg fns[] = {{"open", l_open}, {"attach", l_attach}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
