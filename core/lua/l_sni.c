/*
 * core.sni: the name a client means, from its first bytes (core/lib/sni.h).
 *
 *   core.sni.parse(bytes) -> kind ("tls" | "http" | "other"), name | nil
 *                          | nil, "more"                (peek again once more arrived)
 *                          | nil, "malformed", kind     (TLS or HTTP against its grammar)
 *   core.sni.peek(fd [, max]) -> bytes (what the socket holds, not consumed; "" at its
 *                                end) | nil, msg, errno (EAGAIN: nothing yet)
 *   core.sni.lowat(fd, n)      -> true | nil, msg, errno: readable (poll) only once n
 *                                bytes wait (SO_RCVLOWAT), so a peeked, incomplete flight
 *                                does not wake the loop again until more arrives
 *   core.sni.PEEK_MAX          the most `peek` needs (one TLS record)
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "lcorral.h"
#include "sni.h"

static const char *const KINDS[] = {"other", "tls", "http"};

static int l_parse(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    struct corral_sni out;
    int r = corral_sni_parse((const uint8_t *)s, len, &out);
    if (r == -EAGAIN) {
        lua_pushnil(L);
        lua_pushliteral(L, "more");
        return 2;
    }
    if (r < 0) {
        lua_pushnil(L);
        lua_pushliteral(L, "malformed");
        lua_pushstring(L, KINDS[out.kind]);
        return 3;
    }
    lua_pushstring(L, KINDS[out.kind]);
    if (out.name_len)
        lua_pushlstring(L, out.name, out.name_len);
    else
        lua_pushnil(L);
    return 2;
}

static int l_peek(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    lua_Integer max = luaL_optinteger(L, 2, CORRAL_SNI_PEEK_MAX);
    luaL_argcheck(L, max > 0 && max <= CORRAL_SNI_PEEK_MAX, 2, "at most PEEK_MAX bytes");
    char *buf = malloc((size_t)max);
    if (!buf) return corral_pushfail(L, "peek", -ENOMEM);
    ssize_t n;
    do
        n = recv(fd, buf, (size_t)max, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        int err = errno;
        free(buf);
        return corral_pushfail(L, "peek", -err);
    }
    lua_pushlstring(L, buf, (size_t)n);
    free(buf);
    return 1;
}

static int l_lowat(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 1 && n <= CORRAL_SNI_PEEK_MAX + 1, 2, "1 .. PEEK_MAX + 1");
    int v = (int)n;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) < 0)
        return corral_pushfail(L, "SO_RCVLOWAT", -errno);
    lua_pushboolean(L, 1);
    return 1;
}

int corral_open_sni(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        {"parse", l_parse}, {"peek", l_peek}, {"lowat", l_lowat}, {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
    lua_pushinteger(L, CORRAL_SNI_PEEK_MAX);
    lua_setfield(L, -2, "PEEK_MAX");
    return 0;
}
