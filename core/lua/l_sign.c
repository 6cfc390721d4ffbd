/*
 * corral.sign: the Lua module of core/lib/sign.c, built as a C module of its own
 * (corral/sign.so, `luaopen_corral_sign`) and not one of core.<name>: it alone links
 * libcrypto, and only what signs or verifies a receipt loads it (corral.receipt.key).
 *
 *   ensure_key(path)            → created (boolean)
 *   public_key(path)            → pem, raw (32 bytes)
 *   sign(path, msg)             → signature (64 bytes)
 *   public_raw(pem)             → raw (32 bytes)
 *   verify(pem, msg, sig)       → true | false, "signature does not verify"
 *   b64encode(s), b64decode(s)  → text | bytes (nil when s is not padded base64)
 *
 * An OS failure or a key that cannot be read is nil, "what: strerror", errno.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sign.h"
#include "lcorral.h"

#define CORRAL_EXPORT __attribute__((visibility("default")))

CORRAL_EXPORT int luaopen_corral_sign(lua_State *L);

/* corral_pushfail and corral_checkpath live in core.so's bindings, which this module
 * does not link. */
static const char *checkpath(lua_State *L, int arg)
{
    size_t len;
    const char *s = luaL_checklstring(L, arg, &len);
    if (strlen(s) != len) luaL_argerror(L, arg, "path contains a NUL byte");
    return s;
}

static int fail(lua_State *L, const char *what, int err)
{
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", what,
                    err == -EINVAL ? "not an Ed25519 key OpenSSL can read" : strerror(-err));
    lua_pushinteger(L, -err);
    return 3;
}

static int l_ensure_key(lua_State *L)
{
    const char *path = checkpath(L, 1);
    int created = 0;
    int r = corral_key_ensure(path, &created);
    if (r < 0) return fail(L, path, r);
    lua_pushboolean(L, created);
    return 1;
}

static int l_public_key(lua_State *L)
{
    const char *path = checkpath(L, 1);
    char *pem = NULL;
    uint8_t raw[CORRAL_ED25519_RAW_LEN];
    int r = corral_key_public(path, &pem, raw);
    if (r < 0) {
        free(pem);
        return fail(L, path, r);
    }
    lua_pushstring(L, pem);
    free(pem);
    lua_pushlstring(L, (const char *)raw, sizeof raw);
    return 2;
}

static int l_sign(lua_State *L)
{
    const char *path = checkpath(L, 1);
    size_t len;
    const char *msg = luaL_checklstring(L, 2, &len);
    uint8_t sig[CORRAL_ED25519_SIG_LEN];
    int r = corral_key_sign(path, msg, len, sig);
    if (r < 0) return fail(L, path, r);
    lua_pushlstring(L, (const char *)sig, sizeof sig);
    return 1;
}

static int l_public_raw(lua_State *L)
{
    size_t len;
    const char *pem = luaL_checklstring(L, 1, &len);
    uint8_t raw[CORRAL_ED25519_RAW_LEN];
    int r = corral_pub_raw(pem, len, raw);
    if (r < 0) return fail(L, "public key", r);
    lua_pushlstring(L, (const char *)raw, sizeof raw);
    return 1;
}

static int l_verify(lua_State *L)
{
    size_t pem_len, len, sig_len;
    const char *pem = luaL_checklstring(L, 1, &pem_len);
    const char *msg = luaL_checklstring(L, 2, &len);
    const char *sig = luaL_checklstring(L, 3, &sig_len);
    int r = corral_pub_verify(pem, pem_len, msg, len, (const uint8_t *)sig, sig_len);
    if (r == -EBADMSG) {
        lua_pushboolean(L, 0);
        lua_pushliteral(L, "signature does not verify");
        return 2;
    }
    if (r < 0) return fail(L, "public key", r);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_b64encode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    luaL_Buffer b;
    char *out = luaL_buffinitsize(L, &b, 4 * ((len + 2) / 3) + 1);
    int n = corral_b64_encode(s, len, out);
    if (n < 0) return luaL_argerror(L, 1, "too long");
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
}

static int l_b64decode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    luaL_Buffer b;
    uint8_t *out = (uint8_t *)luaL_buffinitsize(L, &b, 3 * (len / 4) + 1);
    int n = corral_b64_decode(s, len, out);
    if (n < 0) {
        luaL_pushresultsize(&b, 0);
        luaL_pushfail(L);
        return 1;
    }
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
}

int luaopen_corral_sign(lua_State *L)
{
    static const luaL_Reg fns[] = {{"ensure_key", l_ensure_key},
                                   {"public_key", l_public_key},
                                   {"sign", l_sign},
                                   {"public_raw", l_public_raw},
                                   {"verify", l_verify},
                                   {"b64encode", l_b64encode},
                                   {"b64decode", l_b64decode},
                                   {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
