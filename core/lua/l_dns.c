/*
 * core.dns: the responder's DNS codec (core/lib/dns.c) for Lua.
 *
 *   core.dns.parse(msg)                      -> {id, flags, qtype, qclass, name, rd,
 *                                                hostname, edns}
 *                                             | nil, "dns parse: …", errno, why, reason
 *   core.dns.answer(query, rcode [, addr [, ttl]]) -> response bytes | nil, "dns answer: …", errno
 *   core.dns.error_rcode(errno)              -> rcode to answer a parse failure with, or nil
 *                                               (drop the packet)
 *
 * A refused query's why is the sentence naming the rule it broke with its numbers
 * ("QDCOUNT 2: exactly one question is answered") and reason that rule's stable name
 * ("qdcount"), both from the codec (corral_dns_describe, corral_dns_reason_to_string),
 * so that no caller reads the packet again to say what was wrong with it.
 *
 * answer() parses the query itself, so the question it echoes is the one on the wire and
 * never one rebuilt from Lua values. A query that fails to parse with an answerable error
 * (FORMERR, NOTIMP) gets a header-only answer with the given rcode; one to be dropped
 * returns nil, "dns answer: …", errno.
 */
#include <errno.h>

#include "dns.h"
#include "lcorral.h"

static int dns_parse(lua_State *L)
{
    size_t len;
    const uint8_t *msg = (const uint8_t *)luaL_checklstring(L, 1, &len);
    struct corral_dns_query q;
    int r = corral_dns_parse_query(msg, len, &q);
    if (r < 0) {
        char why[128];
        corral_dns_describe(&q, why, sizeof why);
        corral_pushfail(L, "dns parse", r);
        lua_pushstring(L, why);
        lua_pushstring(L, corral_dns_reason_to_string(q.reason));
        return 5;
    }
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, q.id);
    lua_setfield(L, -2, "id");
    lua_pushinteger(L, q.flags);
    lua_setfield(L, -2, "flags");
    lua_pushinteger(L, q.qtype);
    lua_setfield(L, -2, "qtype");
    lua_pushinteger(L, q.qclass);
    lua_setfield(L, -2, "qclass");
    lua_pushlstring(L, q.name, q.name_len);
    lua_setfield(L, -2, "name");
    lua_pushboolean(L, q.rd);
    lua_setfield(L, -2, "rd");
    lua_pushboolean(L, q.hostname);
    lua_setfield(L, -2, "hostname");
    lua_pushboolean(L, q.edns);
    lua_setfield(L, -2, "edns");
    return 1;
}

static int dns_answer(lua_State *L)
{
    size_t len, addr_len = 0;
    const uint8_t *msg = (const uint8_t *)luaL_checklstring(L, 1, &len);
    lua_Integer rcode = luaL_checkinteger(L, 2);
    luaL_argcheck(L, rcode >= 0 && rcode <= 15, 2, "rcode out of range 0..15");
    const uint8_t *addr = (const uint8_t *)luaL_optlstring(L, 3, NULL, &addr_len);
    if (addr) luaL_argcheck(L, addr_len == 4 || addr_len == 16, 3, "address must be 4 or 16 bytes");
    lua_Integer ttl = luaL_optinteger(L, 4, 0);
    luaL_argcheck(L, ttl >= 0 && ttl <= INT32_MAX, 4, "ttl out of range 0..2^31-1");

    struct corral_dns_query q;
    int r = corral_dns_parse_query(msg, len, &q);
    if (r < 0 && corral_dns_error_rcode(r) < 0) return corral_pushfail(L, "dns answer", r);
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    r = corral_dns_build_answer(&q, out, sizeof out, (int)rcode, addr, addr_len, (uint32_t)ttl);
    if (r < 0) return corral_pushfail(L, "dns answer", r);
    lua_pushlstring(L, (const char *)out, (size_t)r);
    return 1;
}

static int dns_error_rcode(lua_State *L)
{
    lua_Integer err = luaL_checkinteger(L, 1);
    luaL_argcheck(L, err > INT32_MIN && err < INT32_MAX, 1, "not an errno");
    int rcode = corral_dns_error_rcode(err > 0 ? -(int)err : (int)err);
    if (rcode < 0)
        luaL_pushfail(L);
    else
        lua_pushinteger(L, rcode);
    return 1;
}

int corral_open_dns(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"parse", dns_parse},
                                     {"answer", dns_answer},
                                     {"error_rcode", dns_error_rcode},
                                     {NULL, NULL}};
    static const struct {
        const char *name;
        int value;
    } consts[] = {
        {"A", CORRAL_DNS_TYPE_A},
        {"AAAA", CORRAL_DNS_TYPE_AAAA},
        {"TXT", CORRAL_DNS_TYPE_TXT},
        {"ANY", CORRAL_DNS_TYPE_ANY},
        {"IN", CORRAL_DNS_CLASS_IN},
        {"NOERROR", CORRAL_DNS_NOERROR},
        {"FORMERR", CORRAL_DNS_FORMERR},
        {"SERVFAIL", CORRAL_DNS_SERVFAIL},
        {"NXDOMAIN", CORRAL_DNS_NXDOMAIN},
        {"NOTIMP", CORRAL_DNS_NOTIMP},
        {"REFUSED", CORRAL_DNS_REFUSED},
        /* the parse failures (core.errno does not list these) */
        {"EBADMSG", EBADMSG},
        {"EOPNOTSUPP", EOPNOTSUPP},
        {"EPROTO", EPROTO},
        {"EMSGSIZE", EMSGSIZE},
    };
    luaL_setfuncs(L, funcs, 0);
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
        lua_pushinteger(L, consts[i].value);
        lua_setfield(L, -2, consts[i].name);
    }
    return 0;
}
