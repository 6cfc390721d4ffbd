/*
 * core.idmap: idmapped and detached mounts (core/lib/idmap.c), the trees a tenant
 * spawn moves into its root (core.spawn.start's binds[i].tree).
 *
 *   userns(disk_uid, shown_uid, disk_gid, shown_gid) → fd | nil, msg, errno
 *   tree(fd[, userns][, {rw =, recursive =}]) → fd | nil, msg, errno (EINVAL with a
 *       userns: this filesystem cannot be idmapped)
 *   foreign_links(fd, uid, gid) → n, path | nil, msg, errno
 */
#include <errno.h>
#include <limits.h>

#include "idmap.h"
#include "lcorral.h"

static unsigned check_id(lua_State *L, int arg)
{
    lua_Integer v = luaL_checkinteger(L, arg);
    luaL_argcheck(L, v >= 0 && v < 0xffffffffLL, arg, "id must be within 0..4294967294");
    return (unsigned)v;
}

static int l_userns(lua_State *L)
{
    uid_t du = check_id(L, 1), su = check_id(L, 2);
    gid_t dg = check_id(L, 3), sg = check_id(L, 4);
    corral_fd *f = corral_newfd(L);
    int fd = corral_idmap_userns(du, su, dg, sg);
    if (fd < 0) return corral_pushfail(L, "idmap user namespace", fd);
    f->fd = fd;
    return 1;
}

static int l_tree(lua_State *L)
{
    int src = corral_checkfd(L, 1);
    int ns = lua_isnoneornil(L, 2) ? -1 : corral_checkfd(L, 2);
    unsigned flags = CORRAL_TREE_RDONLY;
    if (lua_istable(L, 3)) {
        if (lua_getfield(L, 3, "rw"), lua_toboolean(L, -1)) flags &= ~(unsigned)CORRAL_TREE_RDONLY;
        if (lua_getfield(L, 3, "recursive"), lua_toboolean(L, -1)) flags |= CORRAL_TREE_RECURSIVE;
        lua_pop(L, 2);
    }
    corral_fd *f = corral_newfd(L);
    int fd = corral_idmap_tree(src, ns, flags);
    if (fd < 0) return corral_pushfail(L, ns >= 0 ? "idmapped mount" : "detached mount", fd);
    f->fd = fd;
    return 1;
}

static int l_foreign_links(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    uid_t uid = check_id(L, 2);
    gid_t gid = check_id(L, 3);
    char first[PATH_MAX];
    int n = corral_idmap_foreign_links(fd, uid, gid, first, sizeof first);
    if (n < 0) return corral_pushfail(L, "hard link scan", n);
    lua_pushinteger(L, n);
    lua_pushstring(L, first);
    return 2;
}

int corral_open_idmap(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"userns", l_userns}, {"tree", l_tree}, {"foreign_links", l_foreign_links}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
