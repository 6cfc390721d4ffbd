/*
 * core.nft: the sandbox egress ruleset (core/lib/nft.h).
 *
 *   core.nft.apply(netns_fd, plan)   -> true | nil, msg, errno
 *   core.nft.verify(netns_fd, plan)  -> true | nil, msg, errno (EPROTO: differs)
 *   core.nft.delete(netns_fd [, table]) -> true | nil, msg, errno
 *   core.nft.dump(netns_fd [, table])   -> text (the table as read back) | nil, msg, errno
 *   core.nft.refused(netns_fd [, table]) -> {{ip = bytes, port = N, count = N,
 *                                            proto = "tcp"|"udp"}, …}, total
 *                                          | nil, msg, errno
 *
 * plan = {dns_port = N, acceptor_port = N, mark = 42, table = "corral",
 *         tcp_ports = {443, {8000, 8080}, …} (absent: every TCP port), no_tcp = false,
 *         udp_port = N (absent: no UDP relay), udp_mark = N,
 *         udp_ports = {123, {5000, 5010}, …} (absent: every UDP port but 53),
 *         replace = false,
 *         test_bad_message = false}
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>

#include "lcorral.h"
#include "nft.h"

static lua_Integer int_field(lua_State *L, int arg, const char *key, lua_Integer dflt,
                             lua_Integer min, lua_Integer max)
{
    lua_Integer v = dflt;
    int isnum = 1;
    if (lua_getfield(L, arg, key) != LUA_TNIL) v = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    if (!isnum || v < min || v > max)
        luaL_argerror(L, arg, lua_pushfstring(L, "%s must be an integer in %I..%I", key, min, max));
    return v;
}

/* plan[key] = {{lo, hi}, …} or {port, …} into out; absent or empty: none (every port). */
static size_t port_ranges(lua_State *L, int arg, const char *key, struct corral_nft_port_range *out)
{
    size_t count = 0;
    if (lua_getfield(L, arg, key) == LUA_TTABLE) {
        lua_Integer n = luaL_len(L, -1);
        if (n > CORRAL_NFT_MAX_PORT_RANGES)
            luaL_argerror(
                L, arg,
                lua_pushfstring(L, "%s: at most %d ranges", key, CORRAL_NFT_MAX_PORT_RANGES));
        for (lua_Integer i = 1; i <= n; i++) {
            lua_Integer lo, hi;
            int isnum1 = 1, isnum2 = 1;
            if (lua_geti(L, -1, i) == LUA_TTABLE) {
                lua_geti(L, -1, 1);
                lua_geti(L, -2, 2);
                lo = lua_tointegerx(L, -2, &isnum1);
                hi = lua_tointegerx(L, -1, &isnum2);
                lua_pop(L, 2);
            } else {
                lo = hi = lua_tointegerx(L, -1, &isnum1);
            }
            lua_pop(L, 1);
            if (!isnum1 || !isnum2 || lo < 1 || hi > 65535 || hi < lo)
                luaL_argerror(
                    L, arg, lua_pushfstring(L, "%s: each a port or {lo, hi} within 1..65535", key));
            out[count++] = (struct corral_nft_port_range){(uint16_t)lo, (uint16_t)hi};
        }
    } else if (!lua_isnil(L, -1)) {
        luaL_argerror(L, arg, lua_pushfstring(L, "%s must be a list", key));
    }
    lua_pop(L, 1);
    return count;
}

static void check_plan(lua_State *L, int arg, struct corral_nft_plan *p)
{
    luaL_checktype(L, arg, LUA_TTABLE);
    memset(p, 0, sizeof *p);
    p->dns_port = (uint16_t)int_field(L, arg, "dns_port", 0, 1, 65535);
    p->acceptor_port = (uint16_t)int_field(L, arg, "acceptor_port", 0, 1, 65535);
    p->mark = (uint32_t)int_field(L, arg, "mark", CORRAL_NFT_MARK, 1, UINT32_MAX);
    /* The string stays referenced by the plan table, which stays on the stack. */
    if (lua_getfield(L, arg, "table") != LUA_TNIL) {
        size_t len;
        const char *t = lua_tolstring(L, -1, &len);
        if (!t || lua_type(L, -1) != LUA_TSTRING || len == 0 || strlen(t) != len)
            luaL_argerror(L, arg, "table must be a non-empty string");
        p->table = t;
    }
    lua_pop(L, 1);
    lua_getfield(L, arg, "test_bad_message");
    p->test_bad_message = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, arg, "replace");
    p->replace = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, arg, "no_tcp");
    p->no_tcp = lua_toboolean(L, -1);
    lua_pop(L, 1);
    p->n_tcp_ports = port_ranges(L, arg, "tcp_ports", p->tcp_ports);
    p->udp_port = (uint16_t)int_field(L, arg, "udp_port", 0, 0, 65535);
    p->udp_mark = (uint32_t)int_field(L, arg, "udp_mark", 0, 0, UINT32_MAX);
    p->n_udp_ports = port_ranges(L, arg, "udp_ports", p->udp_ports);
}

static int result(lua_State *L, const char *what, int err)
{
    if (err < 0) return corral_pushfail(L, what, err);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_apply(lua_State *L)
{
    struct corral_nft_plan p;
    int fd = corral_checkfd(L, 1);
    check_plan(L, 2, &p);
    return result(L, "nft apply", corral_nft_apply(fd, &p));
}

static int l_verify(lua_State *L)
{
    struct corral_nft_plan p;
    int fd = corral_checkfd(L, 1);
    check_plan(L, 2, &p);
    return result(L, "nft verify", corral_nft_verify(fd, &p));
}

static int l_delete(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    const char *table = luaL_optstring(L, 2, CORRAL_NFT_TABLE);
    return result(L, "nft delete", corral_nft_delete(fd, table));
}

/* The four sets at their size: what the ruleset can itemise, read in one call. */
#define REFUSED_MAX (4 * CORRAL_NFT_REFUSED_SIZE)

static int l_refused(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    const char *table = luaL_optstring(L, 2, CORRAL_NFT_TABLE);
    struct corral_nft_refusal *out = calloc(REFUSED_MAX, sizeof *out);
    if (!out) return corral_pushfail(L, "nft refused", -ENOMEM);
    size_t n = 0;
    uint64_t total = 0;
    int err = corral_nft_refused(fd, table, out, REFUSED_MAX, &n, &total);
    if (err < 0) {
        free(out);
        return corral_pushfail(L, "nft refused", err);
    }
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_createtable(L, 0, 4);
        lua_pushlstring(L, (const char *)out[i].addr, out[i].addr_len);
        lua_setfield(L, -2, "ip");
        lua_pushinteger(L, out[i].port);
        lua_setfield(L, -2, "port");
        lua_pushinteger(L, (lua_Integer)out[i].packets);
        lua_setfield(L, -2, "count");
        lua_pushstring(L, out[i].proto == IPPROTO_UDP ? "udp" : "tcp");
        lua_setfield(L, -2, "proto");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    free(out);
    lua_pushinteger(L, (lua_Integer)total);
    return 2;
}

static int l_dump(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    const char *table = luaL_optstring(L, 2, CORRAL_NFT_TABLE);
    char *text = NULL;
    size_t len = 0;
    int err = corral_nft_dump(fd, table, &text, &len);
    if (err < 0) return corral_pushfail(L, "nft dump", err);
    /* Only a memory error in lua_pushlstring could skip the free: a few kB, once. */
    lua_pushlstring(L, text, len);
    free(text);
    return 1;
}

int corral_open_nft(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"apply", l_apply},   {"verify", l_verify},
                                     {"delete", l_delete}, {"refused", l_refused},
                                     {"dump", l_dump},     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
    lua_pushinteger(L, CORRAL_NFT_MARK);
    lua_setfield(L, -2, "DEFAULT_MARK");
    lua_pushstring(L, CORRAL_NFT_TABLE);
    lua_setfield(L, -2, "DEFAULT_TABLE");
    lua_pushinteger(L, CORRAL_NFT_REFUSED_SIZE);
    lua_setfield(L, -2, "REFUSED_SIZE");
    lua_pushinteger(L, CORRAL_NFT_MAX_PORT_RANGES);
    lua_setfield(L, -2, "MAX_PORT_RANGES");
    return 0;
}
