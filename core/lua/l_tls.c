/*
 * corral.tls: the Lua module of core/lib/intercept.c, built as a C module of its own
 * (corral/tls.so, `luaopen_corral_tls`): it alone links libssl and libhttp_parser, and
 * only a run that binds a secret loads it (corral.egress.secrets).
 *
 *   new{ca_file =, ask =, secrets = {{stand_in =, value =, hosts = {name, ...}}, ...}} →
 * interceptor ic:ca_pem()                   → the run CA's certificate, PEM ic:terminate(fd, name,
 * port)  → fd: the socket to relay to the real upstream (the client fd is taken: closed in the
 * caller's userdata) ic:events()                   → {{kind =, conn =, method =, host =, path =,
 * status =, bytes_up =, bytes_down =, secret_used =, leak =, reason =}, ...} ic:answer(ticket,
 * allow, why) answers an "ask" event (new{ask = true}: each request that passed the stand-in rules,
 * with ticket, port and names, its header names) ic:fileno()                   → the eventfd the
 * loop polls (readable while events wait) ic:close()                    (also __gc, __close)
 *
 * Fds cross as core's corral.fd userdata (core/lua/lcorral.h), which core.so defines:
 * corral.core must be loaded first. An OS failure is nil, "what: strerror", errno.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "intercept.h"
#include "lcorral.h"

#define CORRAL_EXPORT __attribute__((visibility("default")))
#define TYPE "corral.tls"

CORRAL_EXPORT int luaopen_corral_tls(lua_State *L);

struct box {
    struct corral_intercept *ic;
};

static int fail(lua_State *L, const char *what, int err)
{
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", what, strerror(-err));
    lua_pushinteger(L, -err);
    return 3;
}

static struct corral_intercept *check(lua_State *L)
{
    struct box *b = luaL_checkudata(L, 1, TYPE);
    if (!b->ic) luaL_argerror(L, 1, "interceptor is closed");
    return b->ic;
}

/* Entry i of the secrets table at index t: its stand-in, value and hosts (the strings
 * stay the table's, alive for the call; corral_intercept_new copies them). */
static void read_secret(lua_State *L, int t, size_t i, struct corral_intercept_secret *s)
{
    if (lua_geti(L, t, (lua_Integer)i) != LUA_TTABLE) luaL_error(L, "secrets[%d]: a table", (int)i);
    lua_getfield(L, -1, "stand_in");
    lua_getfield(L, -2, "value");
    s->stand_in = lua_tostring(L, -2);
    s->value = lua_tostring(L, -1);
    if (!s->stand_in || !s->value || !*s->stand_in)
        luaL_error(L, "secrets[%d]: a stand-in and a value, strings", (int)i);
    lua_pop(L, 2);
    if (lua_getfield(L, -1, "hosts") != LUA_TTABLE)
        luaL_error(L, "secrets[%d].hosts: a list", (int)i);
    size_t nh = lua_rawlen(L, -1);
    const char **hosts = lua_newuserdatauv(L, (nh ? nh : 1) * sizeof *hosts, 0);
    lua_setfield(L, LUA_REGISTRYINDEX, "corral.tls.hosts"); /* alive until the next call */
    for (size_t j = 0; j < nh; j++) {
        lua_geti(L, -1, (lua_Integer)j + 1);
        if (!(hosts[j] = lua_tostring(L, -1))) luaL_error(L, "secrets[%d].hosts: names", (int)i);
        lua_pop(L, 1);
    }
    s->hosts = hosts;
    s->n_hosts = nh;
    lua_pop(L, 2);
}

static int l_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    struct corral_intercept_opts o = {0};
    lua_getfield(L, 1, "ca_file");
    o.ca_file = luaL_optstring(L, -1, NULL);
    lua_getfield(L, 1, "ask");
    o.ask = lua_toboolean(L, -1);
    lua_getfield(L, 1, "secrets");
    luaL_checktype(L, -1, LUA_TTABLE);
    size_t n = lua_rawlen(L, -1);
    int t = lua_gettop(L);
    struct corral_intercept_secret *s = lua_newuserdatauv(L, (n ? n : 1) * sizeof *s, 0);
    /* each secret's host array stays on the stack until the interceptor has copied it */
    luaL_checkstack(L, (int)n + 4, "too many secrets");
    for (size_t i = 0; i < n; i++) {
        read_secret(L, t, i + 1, &s[i]);
        lua_getfield(L, LUA_REGISTRYINDEX, "corral.tls.hosts");
    }
    o.secrets = s;
    o.n_secrets = n;
    struct box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->ic = NULL;
    luaL_setmetatable(L, TYPE);
    int r = corral_intercept_new(&o, &b->ic);
    if (r == -EINVAL) return fail(L, o.ca_file ? o.ca_file : "the host's trust store", -EINVAL);
    if (r < 0) return fail(L, "tls", r);
    return 1;
}

static int l_close(lua_State *L)
{
    struct box *b = luaL_checkudata(L, 1, TYPE);
    corral_intercept_free(b->ic);
    b->ic = NULL;
    return 0;
}

static int l_ca_pem(lua_State *L)
{
    lua_pushstring(L, corral_intercept_ca_pem(check(L)));
    return 1;
}

static int l_fileno(lua_State *L)
{
    lua_pushinteger(L, corral_intercept_fd(check(L)));
    return 1;
}

static int l_terminate(lua_State *L)
{
    struct corral_intercept *ic = check(L);
    corral_fd *client = luaL_checkudata(L, 2, CORRAL_FD_TYPE);
    const char *name = luaL_checkstring(L, 3);
    lua_Integer port = luaL_checkinteger(L, 4);
    if (client->fd < 0) return luaL_argerror(L, 2, "fd is closed");
    corral_fd *up = lua_newuserdatauv(L, sizeof *up, 1);
    up->fd = -1;
    luaL_setmetatable(L, CORRAL_FD_TYPE);
    int fd = client->fd, upfd;
    client->fd = -1; /* taken, whatever follows */
    int r = corral_intercept_start(ic, fd, name, (int)port, &upfd);
    if (r < 0) return fail(L, "terminate", r);
    up->fd = upfd;
    return 1;
}

static void set_text(lua_State *L, const char *k, const char *v)
{
    if (!*v) return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* An ASK's ticket, port and header names (a list) into the table on top. */
static void push_ask(lua_State *L, const struct corral_intercept_event *e)
{
    lua_pushinteger(L, (lua_Integer)e->ticket);
    lua_setfield(L, -2, "ticket");
    lua_pushinteger(L, e->port);
    lua_setfield(L, -2, "port");
    lua_newtable(L);
    lua_Integer k = 0;
    for (const char *p = e->names; *p;) {
        size_t n = strcspn(p, "\n");
        lua_pushlstring(L, p, n);
        lua_rawseti(L, -2, ++k);
        p += n + (p[n] == '\n');
    }
    lua_setfield(L, -2, "names");
}

static int l_answer(lua_State *L)
{
    struct corral_intercept *ic = check(L);
    lua_Integer ticket = luaL_checkinteger(L, 2);
    corral_intercept_answer(ic, (uint64_t)ticket, lua_toboolean(L, 3), luaL_optstring(L, 4, NULL));
    return 0;
}

static int l_events(lua_State *L)
{
    static const char *const KIND[] = {"", "request", "refused", "failed", "ask"};
    struct corral_intercept *ic = check(L);
    struct corral_intercept_event ev[64];
    lua_newtable(L);
    size_t n, k = 0;
    while ((n = corral_intercept_take(ic, ev, 64)) > 0) {
        for (size_t i = 0; i < n; i++) {
            struct corral_intercept_event *e = &ev[i];
            lua_createtable(L, 0, 11);
            lua_pushstring(L, KIND[e->kind]);
            lua_setfield(L, -2, "kind");
            lua_pushinteger(L, (lua_Integer)e->conn);
            lua_setfield(L, -2, "conn");
            set_text(L, "method", e->method);
            set_text(L, "host", e->host);
            set_text(L, "path", e->path);
            set_text(L, "reason", e->reason);
            if (e->status) {
                lua_pushinteger(L, e->status);
                lua_setfield(L, -2, "status");
            }
            lua_pushinteger(L, (lua_Integer)e->bytes_up);
            lua_setfield(L, -2, "bytes_up");
            lua_pushinteger(L, (lua_Integer)e->bytes_down);
            lua_setfield(L, -2, "bytes_down");
            lua_pushboolean(L, e->secret_used);
            lua_setfield(L, -2, "secret_used");
            lua_pushboolean(L, e->leak);
            lua_setfield(L, -2, "leak");
            if (e->kind == CORRAL_INTERCEPT_ASK) push_ask(L, e);
            lua_rawseti(L, -2, (lua_Integer)++k);
        }
    }
    return 1;
}

int luaopen_corral_tls(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"ca_pem", l_ca_pem}, {"fileno", l_fileno}, {"terminate", l_terminate},
        {"events", l_events}, {"answer", l_answer}, {"close", l_close},
        {NULL, NULL},
    };
    if (luaL_getmetatable(L, CORRAL_FD_TYPE) != LUA_TTABLE)
        return luaL_error(L, "corral.tls: load corral.core first (its fds are core's)");
    lua_pop(L, 1);
    luaL_newmetatable(L, TYPE);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"new", l_new}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
