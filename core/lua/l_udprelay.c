/*
 * core.udprelay: one sandbox's UDP relay (core/lib/udprelay.h).
 *
 *   core.udprelay.new(netns, {mark =, max_entries? =, upstream_netns? = fd,
 *                             upstream_mark? =})          -> relay, port
 *   relay:fileno()                                        -> the epoll fd (readable: call run)
 *   relay:port()                                          -> the listener's port in the netns
 *   relay:run()                                           -> {event, …}
 *   relay:allow(id, {addr, …}, port, idle_s)              -> index of the address used (from 1)
 *   relay:deny(id, idle_s)                                -> true
 *   relay:cut(id)                                         -> true
 *   relay:count()                                         -> flows allowed, still open
 *   relay:shutdown()                                      (every flow ends: the next run says so)
 *   relay:close()                                         (also __gc and __close)
 *
 * An event is {kind = "new", id =, src =, sport =, dst =, dport =, size =} (a flow's first
 * datagram, to allow or deny), {kind = "end", id =, src =, sport =, dst =, dport =, why =
 * "idle"|"cut"|"closed", allowed =, up =, down =, sent =, received =, dropped =, err =,
 * msg =} (up/down bytes and sent/received datagrams relayed each way; err the last error
 * of the upstream socket, 0 for none, msg its text), or {kind = "overflow", dropped =}.
 * Addresses are text; an IPv4-mapped address is given as IPv4. Failures return nil, msg,
 * errno (allow: ENOENT for no new flow of that id; a connect error otherwise).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "lcorral.h"
#include "sock.h"
#include "udprelay.h"

#define UDPRELAY_TYPE "corral.udprelay"
#define BATCH 128
#define ADDRS_MAX 16

typedef struct {
    struct corral_udprelay *r;
    uint16_t port;
} ludprelay;

static ludprelay *toludp(lua_State *L, int arg)
{
    return (ludprelay *)luaL_checkudata(L, arg, UDPRELAY_TYPE);
}

static struct corral_udprelay *checkrelay(lua_State *L, int arg)
{
    ludprelay *l = toludp(L, arg);
    if (!l->r) luaL_argerror(L, arg, "UDP relay is closed");
    return l->r;
}

static int idle_ms(lua_State *L, int arg)
{
    lua_Number s = luaL_checknumber(L, arg);
    if (!(s > 0 && s <= 86400.0 * 365))
        return luaL_argerror(L, arg, "idle must be seconds in (0, a year]");
    int ms = (int)(s * 1000 + 0.5);
    return ms > 0 ? ms : 1;
}

static uint32_t opt_u32(lua_State *L, int arg, const char *key, uint32_t dflt)
{
    uint32_t v = dflt;
    if (lua_getfield(L, arg, key) != LUA_TNIL) {
        int isint = 0;
        lua_Integer m = lua_tointegerx(L, -1, &isint);
        if (!isint || m < 0 || m > UINT32_MAX)
            luaL_argerror(L, arg, lua_pushfstring(L, "%s must be an integer in 0..2^32-1", key));
        v = (uint32_t)m;
    }
    lua_pop(L, 1);
    return v;
}

static int l_new(lua_State *L)
{
    int netns = corral_checkfd(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    struct corral_udprelay_opts o = {.netns_fd = netns, .upstream_netns_fd = -1};
    o.mark = opt_u32(L, 2, "mark", 0);
    if (!o.mark) return luaL_argerror(L, 2, "mark must be set (not 0)");
    o.max_entries = opt_u32(L, 2, "max_entries", 0);
    o.upstream_mark = opt_u32(L, 2, "upstream_mark", 0);
    if (lua_getfield(L, 2, "upstream_netns") != LUA_TNIL) {
        corral_fd *f = luaL_testudata(L, -1, CORRAL_FD_TYPE);
        if (!f || f->fd < 0) luaL_argerror(L, 2, "upstream_netns must be an open corral.fd");
        o.upstream_netns_fd = f->fd;
    }
    lua_pop(L, 1);
    ludprelay *l = (ludprelay *)lua_newuserdatauv(L, sizeof *l, 0);
    l->r = NULL;
    l->port = 0;
    luaL_setmetatable(L, UDPRELAY_TYPE);
    int err = corral_udprelay_new(&o, &l->r, &l->port);
    if (err < 0) return corral_pushfail(L, "udp relay", err);
    lua_pushinteger(L, l->port);
    return 2;
}

static int l_close(lua_State *L)
{
    ludprelay *l = toludp(L, 1);
    struct corral_udprelay *r = l->r;
    l->r = NULL;
    corral_udprelay_free(r);
    return 0;
}

static int l_fileno(lua_State *L)
{
    ludprelay *l = toludp(L, 1);
    if (!l->r) return corral_pushfail(L, "fileno", EBADF);
    lua_pushinteger(L, corral_udprelay_fd(l->r));
    return 1;
}

/* core.io.poll reads the relay's fd through this (lcorral.h, corral_fd_reader). */
static int udprelay_fd(void *ud)
{
    ludprelay *l = ud;
    return l->r ? corral_udprelay_fd(l->r) : -1;
}

static const corral_fd_reader udprelay_fd_reader = {udprelay_fd};

static int l_port(lua_State *L)
{
    checkrelay(L, 1);
    lua_pushinteger(L, toludp(L, 1)->port);
    return 1;
}

static void set_endpoint(lua_State *L, const struct sockaddr_storage *ss, const char *addr_key,
                         const char *port_key)
{
    char text[64];
    int port = 0;
    if (corral_sockaddr_text(ss, text, sizeof text, &port) < 0) return;
    lua_pushstring(L, text);
    lua_setfield(L, -2, addr_key);
    lua_pushinteger(L, port);
    lua_setfield(L, -2, port_key);
}

static void set_int(lua_State *L, const char *key, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, key);
}

static const char *why_name(int why)
{
    switch (why) {
    case CORRAL_UDPRELAY_IDLE:
        return "idle";
    case CORRAL_UDPRELAY_CUT:
        return "cut";
    default:
        return "closed";
    }
}

static void push_event(lua_State *L, const struct corral_udprelay_event *ev)
{
    lua_createtable(L, 0, 14);
    if (ev->kind == CORRAL_UDPRELAY_OVERFLOW) {
        lua_pushliteral(L, "overflow");
        lua_setfield(L, -2, "kind");
        set_int(L, "dropped", (lua_Integer)ev->dropped);
        return;
    }
    lua_pushstring(L, ev->kind == CORRAL_UDPRELAY_NEW ? "new" : "end");
    lua_setfield(L, -2, "kind");
    set_int(L, "id", (lua_Integer)ev->id);
    set_endpoint(L, &ev->src, "src", "sport");
    set_endpoint(L, &ev->dst, "dst", "dport");
    if (ev->kind == CORRAL_UDPRELAY_NEW) {
        set_int(L, "size", (lua_Integer)ev->size);
        return;
    }
    lua_pushstring(L, why_name(ev->why));
    lua_setfield(L, -2, "why");
    lua_pushboolean(L, ev->allowed);
    lua_setfield(L, -2, "allowed");
    set_int(L, "up", (lua_Integer)ev->bytes_up);
    set_int(L, "down", (lua_Integer)ev->bytes_down);
    set_int(L, "sent", (lua_Integer)ev->sent);
    set_int(L, "received", (lua_Integer)ev->received);
    set_int(L, "dropped", (lua_Integer)ev->dropped);
    set_int(L, "err", ev->err);
    if (ev->err) {
        lua_pushstring(L, strerror(ev->err));
        lua_setfield(L, -2, "msg");
    }
}

static int l_run(lua_State *L)
{
    struct corral_udprelay *r = checkrelay(L, 1);
    struct corral_udprelay_event ev[BATCH];
    lua_newtable(L);
    lua_Integer k = 0;
    for (;;) {
        int n = corral_udprelay_run(r, ev, BATCH);
        if (n < 0) return corral_pushfail(L, "udp relay", n);
        for (int i = 0; i < n; i++) {
            push_event(L, &ev[i]);
            lua_rawseti(L, -2, ++k);
        }
        if (n < BATCH) break;
    }
    return 1;
}

static int l_allow(lua_State *L)
{
    struct corral_udprelay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_Integer port = luaL_checkinteger(L, 4);
    if (port < 1 || port > 65535) return luaL_argerror(L, 4, "port out of range");
    int ms = idle_ms(L, 5);
    struct sockaddr_storage addrs[ADDRS_MAX];
    lua_Integer n = luaL_len(L, 3);
    if (n < 1 || n > ADDRS_MAX) return luaL_argerror(L, 3, "a list of 1 to 16 addresses");
    for (lua_Integer i = 1; i <= n; i++) {
        socklen_t len;
        lua_geti(L, 3, i);
        const char *ip = lua_tostring(L, -1);
        if (!ip || corral_sockaddr_from(ip, (int)port, &addrs[i - 1], &len) < 0)
            return luaL_argerror(L, 3, "not a list of numeric IPv4 or IPv6 addresses");
        lua_pop(L, 1);
    }
    size_t used = 0;
    int err = corral_udprelay_allow(r, (uint64_t)id, addrs, (size_t)n, ms, &used);
    if (err < 0) return corral_pushfail(L, "upstream", err);
    lua_pushinteger(L, (lua_Integer)used + 1);
    return 1;
}

static int l_deny(lua_State *L)
{
    struct corral_udprelay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    return corral_result(L, corral_udprelay_deny(r, (uint64_t)id, idle_ms(L, 3)), "deny");
}

static int l_cut(lua_State *L)
{
    struct corral_udprelay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    return corral_result(L, corral_udprelay_cut(r, (uint64_t)id), "cut");
}

static int l_count(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)corral_udprelay_count(checkrelay(L, 1)));
    return 1;
}

static int l_shutdown(lua_State *L)
{
    corral_udprelay_shutdown(checkrelay(L, 1));
    return 0;
}

static int l_tostring(lua_State *L)
{
    ludprelay *l = toludp(L, 1);
    if (l->r)
        lua_pushfstring(L, "corral.udprelay (port %d, %d flows)", (int)l->port,
                        (int)corral_udprelay_count(l->r));
    else
        lua_pushliteral(L, "corral.udprelay (closed)");
    return 1;
}

int corral_open_udprelay(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"fileno", l_fileno}, {"port", l_port}, {"run", l_run},     {"allow", l_allow},
        {"deny", l_deny},     {"cut", l_cut},   {"count", l_count}, {"shutdown", l_shutdown},
        {"close", l_close},   {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", l_close},
                                    {"__close", l_close},
                                    {"__tostring", l_tostring},
                                    {"__index", NULL},
                                    {NULL, NULL}};
    if (luaL_newmetatable(L, UDPRELAY_TYPE)) {
        luaL_setfuncs(L, meta, 0);
        corral_set_fd_reader(L, &udprelay_fd_reader);
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "new");
    return 0;
}
