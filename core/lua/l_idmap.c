/*
 * core.idmap: idmapped and detached mounts (core/lib/idmap.c), the trees a tenant
 * spawn moves into its root (core.spawn.start's binds[i].tree).
 *
 *   userns(disk_uid, shown_uid, disk_gid, shown_gid) → fd | nil, msg, errno
 *   tree(fd[, userns][, {rw =, recursive =}]) → fd | nil, msg, errno (EINVAL with a
 *       userns: this filesystem cannot be idmapped)
 *   scan(fd, uid, gid[, mark]) → {links =, link =, privileged =, privileged_path =, storages =,
 *       storage =} | nil, msg, errno
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

static int l_scan(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    uid_t uid = check_id(L, 2);
    gid_t gid = check_id(L, 3);
    const char *mark = luaL_optstring(L, 4, NULL);
    struct corral_idmap_findings f;
    int r = corral_idmap_scan(fd, uid, gid, mark, &f);
    if (r < 0) return corral_pushfail(L, "tree scan", r);
    lua_createtable(L, 0, 6);
    lua_pushinteger(L, f.links);
    lua_setfield(L, -2, "links");
    lua_pushstring(L, f.link);
    lua_setfield(L, -2, "link");
    lua_pushinteger(L, f.privileged);
    lua_setfield(L, -2, "privileged");
    lua_pushstring(L, f.privileged_path);
    lua_setfield(L, -2, "privileged_path");
    lua_pushinteger(L, f.storages);
    lua_setfield(L, -2, "storages");
    lua_pushstring(L, f.storage);
    lua_setfield(L, -2, "storage");
    return 1;
}

int corral_open_idmap(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"userns", l_userns}, {"tree", l_tree}, {"scan", l_scan}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
