/*
 * core.inet: IP address text and CIDR arithmetic (core/lib/inet.c) for the egress policy.
 *
 *   core.inet.parse(s)               -> family, bytes [, v4bytes] | nil, "inet parse: …", EINVAL
 *       family is "inet" or "inet6"; bytes the 4- or 16-byte address. Accepts "1.2.3.4",
 *       "2001:db8::1" and "[2001:db8::1]". An IPv4-mapped address ("::ffff:1.2.3.4") is
 *       returned as written (family "inet6", 16 bytes) with its embedded IPv4 bytes as a
 *       third value: the caller decides to compare it as IPv4 (corral.egress does).
 *   core.inet.unmap(bytes)           -> v4bytes | nil   (the same test on binary input)
 *   core.inet.format(bytes)          -> text
 *   core.inet.in_cidr(addr, net, prefixlen) -> boolean (false when the lengths differ)
 *   core.inet.mask(bytes, prefixlen) -> bytes with the host bits cleared
 *
 * A malformed address text is a value the policy layer reports to the operator, so
 * parse() returns nil, msg; a byte string of the wrong length or a prefix out of range
 * is a programming error and raises.
 */
#include <errno.h>
#include <string.h>

#include "inet.h"
#include "lcorral.h"

static const uint8_t *checkaddr(lua_State *L, int arg, size_t *len)
{
    const uint8_t *a = (const uint8_t *)luaL_checklstring(L, arg, len);
    if (*len != 4 && *len != 16) luaL_argerror(L, arg, "address must be 4 or 16 bytes");
    return a;
}

static unsigned checkprefix(lua_State *L, int arg, size_t len)
{
    lua_Integer p = luaL_checkinteger(L, arg);
    luaL_argcheck(L, p >= 0 && (size_t)p <= len * 8, arg, "prefix length out of range");
    return (unsigned)p;
}

static int inet_parse(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    uint8_t a[16], v4[4];
    int n = corral_inet_parse(s, len, a);
    if (n < 0) return corral_pushfail(L, "inet parse", n);
    lua_pushstring(L, n == 4 ? "inet" : "inet6");
    lua_pushlstring(L, (const char *)a, (size_t)n);
    if (!corral_inet_unmap(a, (size_t)n, v4)) return 2;
    lua_pushlstring(L, (const char *)v4, 4);
    return 3;
}

static int inet_unmap(lua_State *L)
{
    size_t len;
    const uint8_t *a = checkaddr(L, 1, &len);
    uint8_t v4[4];
    if (corral_inet_unmap(a, len, v4))
        lua_pushlstring(L, (const char *)v4, 4);
    else
        luaL_pushfail(L);
    return 1;
}

static int inet_format(lua_State *L)
{
    size_t len;
    const uint8_t *a = checkaddr(L, 1, &len);
    char text[CORRAL_INET_TEXT_MAX];
    int n = corral_inet_format(a, len, text, sizeof text);
    if (n < 0) return corral_pushfail(L, "inet format", n);
    lua_pushlstring(L, text, (size_t)n);
    return 1;
}

static int inet_in_cidr(lua_State *L)
{
    size_t alen, nlen;
    const uint8_t *a = checkaddr(L, 1, &alen);
    const uint8_t *net = checkaddr(L, 2, &nlen);
    unsigned prefix = checkprefix(L, 3, nlen);
    lua_pushboolean(L, corral_inet_in_cidr(a, alen, net, nlen, prefix) == 1);
    return 1;
}

static int inet_mask(lua_State *L)
{
    size_t len;
    const uint8_t *a = checkaddr(L, 1, &len);
    unsigned prefix = checkprefix(L, 2, len);
    uint8_t out[16];
    memcpy(out, a, len);
    corral_inet_mask(out, len, prefix);
    lua_pushlstring(L, (const char *)out, len);
    return 1;
}

int corral_open_inet(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"parse", inet_parse},   {"unmap", inet_unmap},
                                     {"format", inet_format}, {"in_cidr", inet_in_cidr},
                                     {"mask", inet_mask},     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
    return 0;
}
