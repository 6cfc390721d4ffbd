/*
 * core.ns: namespace fds and id maps.
 *   open(pid | "self", kind) -> fd            info(fd) -> {kind=, nstype=, inode=, dev=}
 *   same(fd1, fd2) -> boolean                 setns(fd[, kind]) -> true
 *   unshare(flags) -> true                    write_maps(pid, uid_map, gid_map) -> true
 *   new_net() -> fd (owned by the caller's user namespace; needs CAP_SYS_ADMIN there)
 *   new_net_in_userns() -> fd (owned by a new user namespace of the caller's own)
 * Kinds: "user" "mnt" "pid" "net" "ipc" "uts" "cgroup" "time"; flags: core.ns.CLONE_NEW*.
 * A map is a list of {inside, outside, count} (or {inside=, outside=, count=}); nil
 * leaves that map alone.
 */
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "lcorral.h"
#include "ns.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* The kernel accepts at most 340 lines per map (kernel/user_namespace.c,
 * UID_GID_MAP_MAX_EXTENTS). */
#define MAX_EXTENTS 340

static int checkkind(lua_State *L, int arg)
{
    const char *kind = luaL_checkstring(L, arg);
    int type = corral_ns_type(kind);
    if (type < 0)
        return luaL_argerror(L, arg, lua_pushfstring(L, "unknown namespace kind '%s'", kind));
    return type;
}

static int l_open(lua_State *L)
{
    lua_Integer pid = 0;
    if (lua_type(L, 1) == LUA_TSTRING) {
        if (strcmp(lua_tostring(L, 1), "self") != 0) luaL_argerror(L, 1, "pid or \"self\"");
    } else {
        pid = luaL_checkinteger(L, 1);
        if (pid <= 0 || pid > INT32_MAX) luaL_argerror(L, 1, "pid out of range");
    }
    checkkind(L, 2);
    const char *kind = lua_tostring(L, 2);
    corral_fd *f = corral_newfd(L);
    int fd = corral_ns_open((pid_t)pid, kind);
    if (fd < 0) return corral_pushfail(L, "open namespace", fd);
    f->fd = fd;
    return 1;
}

static int l_info(lua_State *L)
{
    struct corral_ns_info info;
    int rc = corral_ns_info(corral_checkfd(L, 1), &info);
    if (rc < 0) return corral_pushfail(L, "namespace info", rc);
    lua_createtable(L, 0, 4);
    const char *kind = corral_ns_kind(info.nstype);
    if (kind) {
        lua_pushstring(L, kind);
        lua_setfield(L, -2, "kind");
    }
    lua_pushinteger(L, info.nstype);
    lua_setfield(L, -2, "nstype");
    lua_pushinteger(L, (lua_Integer)info.ino);
    lua_setfield(L, -2, "inode");
    lua_pushinteger(L, (lua_Integer)info.dev);
    lua_setfield(L, -2, "dev");
    return 1;
}

static int l_same(lua_State *L)
{
    int rc = corral_ns_same(corral_checkfd(L, 1), corral_checkfd(L, 2));
    if (rc < 0) return corral_pushfail(L, "namespace info", rc);
    lua_pushboolean(L, rc);
    return 1;
}

static int l_setns(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    int type = lua_isnoneornil(L, 2) ? 0 : checkkind(L, 2);
    int rc = corral_ns_setns(fd, type);
    return corral_result(L, rc, "setns");
}

static int l_unshare(lua_State *L)
{
    lua_Integer flags = luaL_checkinteger(L, 1);
    if (flags < 0 || flags > INT32_MAX) luaL_argerror(L, 1, "flags out of range");
    int rc = corral_ns_unshare((int)flags);
    return corral_result(L, rc, "unshare");
}

static uint32_t map_field(lua_State *L, int arg, int idx, const char *name, int min)
{
    /* The entry table is on top of the stack. */
    if (lua_getfield(L, -1, name) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_geti(L, -1, idx);
    }
    int isnum;
    lua_Integer v = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    if (!isnum || v < min || v > (lua_Integer)UINT32_MAX)
        luaL_argerror(L, arg, lua_pushfstring(L, "bad %s in map entry", name));
    return (uint32_t)v;
}

static size_t checkmap(lua_State *L, int arg, struct corral_id_map *m)
{
    if (lua_isnoneornil(L, arg)) return 0;
    luaL_checktype(L, arg, LUA_TTABLE);
    lua_Integer n = luaL_len(L, arg);
    if (n < 1 || n > MAX_EXTENTS) luaL_argerror(L, arg, "a map has 1 to 340 entries");
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_geti(L, arg, i) != LUA_TTABLE) luaL_argerror(L, arg, "map entries are tables");
        m[i - 1].inside = map_field(L, arg, 1, "inside", 0);
        m[i - 1].outside = map_field(L, arg, 2, "outside", 0);
        m[i - 1].count = map_field(L, arg, 3, "count", 1);
        lua_pop(L, 1);
    }
    return (size_t)n;
}

/* core.ns.new_net() → fd of a new empty network namespace owned by the host. */
static int l_new_net(lua_State *L)
{
    corral_fd *f = corral_newfd(L);
    int fd = corral_ns_new_net();
    if (fd < 0) return corral_pushfail(L, "new_net", fd);
    f->fd = fd;
    return 1;
}

/* core.ns.new_net_in_userns() → fd of a new empty network namespace owned by a new user
 * namespace of the caller's own (what an unprivileged caller can make). */
static int l_new_net_in_userns(lua_State *L)
{
    corral_fd *f = corral_newfd(L);
    int fd = corral_ns_new_net_in_userns();
    if (fd < 0) return corral_pushfail(L, "new_net_in_userns", fd);
    f->fd = fd;
    return 1;
}

static int l_write_maps(lua_State *L)
{
    lua_Integer pid = luaL_checkinteger(L, 1);
    if (pid <= 0 || pid > INT32_MAX) luaL_argerror(L, 1, "pid out of range");
    struct corral_id_map uid[MAX_EXTENTS], gid[MAX_EXTENTS];
    size_t nuid = checkmap(L, 2, uid);
    size_t ngid = checkmap(L, 3, gid);
    int rc = corral_ns_write_maps((pid_t)pid, uid, nuid, gid, ngid);
    return corral_result(L, rc, "write id maps");
}

int corral_open_ns(lua_State *L)
{
    static const luaL_Reg fns[] = {{"open", l_open},
                                   {"info", l_info},
                                   {"same", l_same},
                                   {"setns", l_setns},
                                   {"unshare", l_unshare},
                                   {"write_maps", l_write_maps},
                                   {"new_net", l_new_net},
                                   {"new_net_in_userns", l_new_net_in_userns},
                                   {NULL, NULL}};
    static const struct {
        const char *name;
        int value;
    } flags[] = {
        {"CLONE_NEWUSER", CLONE_NEWUSER},     {"CLONE_NEWNS", CLONE_NEWNS},
        {"CLONE_NEWPID", CLONE_NEWPID},       {"CLONE_NEWNET", CLONE_NEWNET},
        {"CLONE_NEWIPC", CLONE_NEWIPC},       {"CLONE_NEWUTS", CLONE_NEWUTS},
        {"CLONE_NEWCGROUP", CLONE_NEWCGROUP}, {"CLONE_NEWTIME", CLONE_NEWTIME},
    };
    luaL_setfuncs(L, fns, 0);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        lua_pushinteger(L, flags[i].value);
        lua_setfield(L, -2, flags[i].name);
    }
    return 0;
}
