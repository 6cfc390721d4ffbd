/*
 * core.digest.sha256(s): the SHA-256 of a string as 64 lowercase hex digits, and the
 * implementation that computed it ("af_alg" or "libcrypto"); nil, msg, errno when the
 * system offers none (core/lib/digest.h).
 */
#include <stdint.h>

#include "digest.h"
#include "lcorral.h"

static int l_sha256(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    uint8_t md[CORRAL_SHA256_LEN];
    const char *backend = "";
    int r = corral_sha256(s, len, md, &backend);
    if (r < 0) return corral_pushfail(L, "sha256", r);
    static const char hex[] = "0123456789abcdef";
    char out[2 * CORRAL_SHA256_LEN];
    for (size_t i = 0; i < CORRAL_SHA256_LEN; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    lua_pushlstring(L, out, sizeof out);
    lua_pushstring(L, backend);
    return 2;
}

int corral_open_digest(lua_State *L)
{
    static const luaL_Reg fns[] = {{"sha256", l_sha256}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
