/*
 * core.relay: the egress relay loop (core/lib/relay.h).
 *
 *   core.relay.new()                                   -> loop
 *   loop:fileno()                                      -> the epoll fd (readable: call run)
 *   loop:add_pair(fd_a, fd_b [, {idle=s, key=, max_per_key=, hold=bool}])  -> id
 *   loop:add_connect(client_fd, ip, port [, {mark=, timeout=s, idle=s, key=, max_per_key=,
 *                                           netns=fd, attempt_delay=s, hold=bool,
 *                                           preface=s}])
 *                                                      -> id
 *     preface: a proxy's CONNECT request, written once connected; the relay opens on its
 *     2xx answer (core/lib/relay.h)
 *     hold: nothing the client sends is relayed until loop:release(id); upstream's bytes
 *     reach it meanwhile, and run reports kind "held" when the client has sent more.
 *   loop:peek(id [, max])                              -> bytes, ended | nil, msg, errno
 *     what a held client sent, not consumed (EAGAIN: nothing yet); ended: it shut down
 *     its side, nothing more will come
 *   loop:release(id)                                   -> true | nil, msg, errno
 *   loop:timer()                                       -> seconds until the loop's timer
 *                                                         fires (0: disarmed)
 *     ip may be a list of addresses: they are raced (RFC 8305) in the order given, each
 *     attempt attempt_delay (default 0.25 s) ahead of the next; the connected event's
 *     addr is the index (from 1) of the one that connected.
 *   loop:run([timeout_s])                              -> {{id=, kind=, up=, down=, err=,
 *                                                           msg=}, …}
 *   loop:poll(list, timeout_s)                         -> list of the indices readable
 *     as core.io.poll (at most 256 entries; the loop itself may be one of them), but the
 *     loop's own connections are relayed meanwhile (corral_relay_poll): it returns once
 *     another entry is readable, an event waits for run (the loop's entry is then
 *     readable) or timeout_s (negative: none) has passed
 *   loop:count([key])                                  -> live connections
 *   loop:close()                                       (also __gc and __close)
 *   core.relay.EUSERS                                  the errno of a per-key refusal
 *   core.relay.walltime()                              -> seconds since the epoch, with
 *                                                         nanoseconds (a log line's time)
 *
 * The fd userdata given to add_pair / add_connect are released into the loop (they read
 * as closed afterwards), whatever the result: on a failure the loop resets them, as a
 * deny does. kind is "connected", "closed", "failed" or "held"; up counts bytes from a (the
 * client) to b (upstream), down the other way; err is 0 or an errno, msg its text. A key
 * is a string or an integer (the integer 5 and the string "5" are the same key).
 * add_connect's timeout defaults to 10 s (0: none); mark 0 (the default) sets no mark;
 * idle 0 (the default) is no idle limit. run's timeout defaults to 0 (do not wait);
 * negative waits for work without a limit.
 *
 * Nothing here calls back into Lua: run returns events and the caller acts on them.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "lcorral.h"
#include "relay.h"
#include "sock.h"

#define RELAY_TYPE "corral.relay"
#define BATCH 128

typedef struct {
    struct corral_relay *r;
} lrelay;

static lrelay *torelay(lua_State *L, int arg)
{
    return (lrelay *)luaL_checkudata(L, arg, RELAY_TYPE);
}

static struct corral_relay *checkrelay(lua_State *L, int arg)
{
    lrelay *l = torelay(L, arg);
    if (!l->r) luaL_argerror(L, arg, "relay loop is closed");
    return l->r;
}

static int ms_of(lua_State *L, int arg, const char *field, double seconds)
{
    if (seconds < 0 || seconds > 86400.0 * 365)
        return luaL_argerror(L, arg, lua_pushfstring(L, "%s out of range", field));
    return (int)(seconds * 1000 + 0.5);
}

struct opts {
    struct corral_relay_opts o;
    uint32_t mark;
    int timeout_ms;
    int netns_fd;         /* upstream made in this netns (the sandbox's own link); -1: here */
    const char *port_key; /* the source-port slice's key (corral_port_slice); NULL: key */
    int attempt_delay_ms;
};

/* Reads the options table at arg (absent: defaults). A key string stays referenced by
 * the table, or is pushed here for an integer key; either way it outlives the call. */
static void check_opts(lua_State *L, int arg, struct opts *p)
{
    memset(p, 0, sizeof *p);
    p->timeout_ms = 10000;
    p->attempt_delay_ms = 250;
    p->netns_fd = -1;
    if (lua_isnoneornil(L, arg)) return;
    luaL_checktype(L, arg, LUA_TTABLE);
    if (lua_getfield(L, arg, "netns") != LUA_TNIL) {
        corral_fd *f = luaL_testudata(L, -1, CORRAL_FD_TYPE);
        if (!f || f->fd < 0) luaL_argerror(L, arg, "netns must be an open corral.fd");
        p->netns_fd = f->fd;
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "idle") != LUA_TNIL) {
        if (!lua_isnumber(L, -1)) luaL_argerror(L, arg, "idle must be a number of seconds");
        p->o.idle_ms = ms_of(L, arg, "idle", lua_tonumber(L, -1));
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "hold") != LUA_TNIL) {
        if (!lua_isboolean(L, -1)) luaL_argerror(L, arg, "hold must be a boolean");
        p->o.hold_a = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "timeout") != LUA_TNIL) {
        if (!lua_isnumber(L, -1)) luaL_argerror(L, arg, "timeout must be a number of seconds");
        p->timeout_ms = ms_of(L, arg, "timeout", lua_tonumber(L, -1));
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "attempt_delay") != LUA_TNIL) {
        if (!lua_isnumber(L, -1))
            luaL_argerror(L, arg, "attempt_delay must be a number of seconds");
        p->attempt_delay_ms = ms_of(L, arg, "attempt_delay", lua_tonumber(L, -1));
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "mark") != LUA_TNIL) {
        int isint = 0;
        lua_Integer m = lua_tointegerx(L, -1, &isint);
        if (!isint || m < 0 || m > UINT32_MAX)
            luaL_argerror(L, arg, "mark must be an integer in 0..2^32-1");
        p->mark = (uint32_t)m;
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "max_per_key") != LUA_TNIL) {
        int isint = 0;
        lua_Integer m = lua_tointegerx(L, -1, &isint);
        if (!isint || m < 0 || m > INT32_MAX)
            luaL_argerror(L, arg, "max_per_key must be a non-negative integer");
        p->o.max_per_key = (int)m;
    }
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "preface") == LUA_TSTRING)
        p->o.preface = lua_tostring(L, -1); /* still referenced by the table */
    else if (!lua_isnil(L, -1))
        luaL_argerror(L, arg, "preface must be a string");
    lua_pop(L, 1);
    if (lua_getfield(L, arg, "port_key") == LUA_TSTRING)
        p->port_key = lua_tostring(L, -1); /* still referenced by the table */
    else if (!lua_isnil(L, -1))
        luaL_argerror(L, arg, "port_key must be a string");
    lua_pop(L, 1);
    int t = lua_getfield(L, arg, "key");
    if (t == LUA_TSTRING) {
        size_t len;
        const char *k = lua_tolstring(L, -1, &len);
        if (strlen(k) != len) luaL_argerror(L, arg, "key contains a NUL byte");
        p->o.key = k;
        lua_pop(L, 1); /* still referenced by the table */
    } else if (t == LUA_TNUMBER && lua_isinteger(L, -1)) {
        /* left on the stack, so the string lives until the call returns */
        p->o.key = lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, -1));
    } else if (t == LUA_TNIL) {
        lua_pop(L, 1);
        if (p->o.max_per_key) luaL_argerror(L, arg, "max_per_key needs a key");
    } else {
        luaL_argerror(L, arg, "key must be a string or an integer");
    }
}

/* Takes the descriptor out of an fd userdata: from here the loop owns it. */
static int take_fd(lua_State *L, int arg)
{
    corral_fd *f = (corral_fd *)luaL_checkudata(L, arg, CORRAL_FD_TYPE);
    int fd = f->fd;
    f->fd = -1;
    return fd;
}

static int l_new(lua_State *L)
{
    lrelay *l = (lrelay *)lua_newuserdatauv(L, sizeof *l, 0);
    l->r = NULL;
    luaL_setmetatable(L, RELAY_TYPE);
    int err = corral_relay_new(&l->r);
    if (err < 0) return corral_pushfail(L, "relay", err);
    return 1;
}

static int l_close(lua_State *L)
{
    lrelay *l = torelay(L, 1);
    struct corral_relay *r = l->r;
    l->r = NULL;
    corral_relay_free(r);
    return 0;
}

static int l_fileno(lua_State *L)
{
    lrelay *l = torelay(L, 1);
    if (!l->r) return corral_pushfail(L, "fileno", EBADF);
    lua_pushinteger(L, corral_relay_fd(l->r));
    return 1;
}

static int relay_fd(void *ud)
{
    lrelay *l = ud;
    return l->r ? corral_relay_fd(l->r) : -1;
}

static const corral_fd_reader relay_fd_reader = {relay_fd};

static int l_add_pair(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    corral_checkfd(L, 2);
    corral_checkfd(L, 3);
    if (lua_rawequal(L, 2, 3)) return luaL_argerror(L, 3, "the same fd twice");
    struct opts p;
    check_opts(L, 4, &p);
    int a = take_fd(L, 2), b = take_fd(L, 3);
    uint64_t id = 0;
    int err = corral_relay_add_pair(r, a, b, &p.o, &id);
    if (err < 0) return corral_pushfail(L, "relay", err);
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

/* add_connect with a list of addresses: raced by the loop (corral_relay_add_race). */
static int add_race(lua_State *L, struct corral_relay *r, int port)
{
    struct sockaddr_storage addrs[CORRAL_RELAY_RACE_MAX];
    lua_Integer n = luaL_len(L, 3);
    if (n < 1 || n > CORRAL_RELAY_RACE_MAX)
        return luaL_argerror(L, 3, "a list of 1 to 12 addresses");
    for (lua_Integer i = 1; i <= n; i++) {
        socklen_t len;
        lua_geti(L, 3, i);
        const char *ip = lua_tostring(L, -1);
        if (!ip || corral_sockaddr_from(ip, port, &addrs[i - 1], &len) < 0)
            return luaL_argerror(L, 3, "not a list of numeric IPv4 or IPv6 addresses");
        lua_pop(L, 1);
    }
    struct opts p;
    check_opts(L, 5, &p);
    int client = take_fd(L, 2);
    struct corral_relay_race how = {.addrs = addrs,
                                    .n = (size_t)n,
                                    .mark = p.mark,
                                    .netns_fd = p.netns_fd,
                                    .port_key = p.netns_fd < 0 ? p.port_key : NULL,
                                    .connect_timeout_ms = p.timeout_ms,
                                    .attempt_delay_ms = p.attempt_delay_ms};
    uint64_t id = 0;
    int err = corral_relay_add_race(r, client, &how, &p.o, &id);
    if (err < 0) return corral_pushfail(L, "relay", err);
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

static int l_add_connect(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    corral_checkfd(L, 2);
    lua_Integer port = luaL_checkinteger(L, 4);
    if (port < 1 || port > 65535) return luaL_argerror(L, 4, "port out of range");
    if (lua_type(L, 3) == LUA_TTABLE) return add_race(L, r, (int)port);
    const char *ip = luaL_checkstring(L, 3);
    struct sockaddr_storage ss;
    socklen_t len;
    if (corral_sockaddr_from(ip, (int)port, &ss, &len) < 0)
        return luaL_argerror(L, 3, "not a numeric IPv4 or IPv6 address");
    struct opts p;
    check_opts(L, 5, &p);
    int client = take_fd(L, 2);

    /* The cap is checked before anything is dialled. */
    if (p.o.key && p.o.max_per_key && corral_relay_count(r, p.o.key) >= (size_t)p.o.max_per_key) {
        corral_reset(client);
        return corral_pushfail(L, "relay", EUSERS);
    }
    /* The upstream is made here rather than by corral_relay_add_connect so that a mark
     * refusal names its step ("setsockopt_mark: …"). */
    const char *what = "connect";
    int in_progress = 0;
    /* In the host's netns, the sandbox's connections draw source ports from its own
     * slice (see corral_port_slice); from a sandbox's own link they have its netns. */
    int up = corral_connect_marked_start(
        (struct sockaddr *)&ss, len, p.mark, p.netns_fd,
        p.netns_fd < 0 ? (p.port_key ? p.port_key : p.o.key) : NULL, &in_progress, &what);
    if (up < 0) {
        corral_reset(client);
        return corral_pushfail(L, what, up);
    }
    uint64_t id = 0;
    int err = corral_relay_add_connecting(r, client, up, p.timeout_ms, &p.o, &id);
    if (err < 0) return corral_pushfail(L, "relay", err);
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case CORRAL_RELAY_CONNECTED:
        return "connected";
    case CORRAL_RELAY_CLOSED:
        return "closed";
    case CORRAL_RELAY_HELD:
        return "held";
    default:
        return "failed";
    }
}

static int l_run(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    double s = luaL_optnumber(L, 2, 0);
    int ms = s < 0 ? -1 : s > 86400 ? 86400000 : (int)(s * 1000 + 0.5);
    struct corral_relay_event ev[BATCH];
    lua_newtable(L);
    lua_Integer k = 0;
    for (;;) {
        int n = corral_relay_run(r, ms, ev, BATCH);
        if (n < 0) return corral_pushfail(L, "relay", n);
        for (int i = 0; i < n; i++) {
            lua_createtable(L, 0, 6);
            lua_pushinteger(L, (lua_Integer)ev[i].id);
            lua_setfield(L, -2, "id");
            lua_pushstring(L, kind_name(ev[i].kind));
            lua_setfield(L, -2, "kind");
            lua_pushinteger(L, (lua_Integer)ev[i].bytes_a_to_b);
            lua_setfield(L, -2, "up");
            lua_pushinteger(L, (lua_Integer)ev[i].bytes_b_to_a);
            lua_setfield(L, -2, "down");
            lua_pushinteger(L, ev[i].err);
            lua_setfield(L, -2, "err");
            if (ev[i].kind == CORRAL_RELAY_CONNECTED) {
                lua_pushinteger(L, ev[i].addr_index + 1);
                lua_setfield(L, -2, "addr");
            }
            if (ev[i].err) {
                lua_pushstring(L, strerror(ev[i].err));
                lua_setfield(L, -2, "msg");
            }
            lua_rawseti(L, -2, ++k);
        }
        if (n < BATCH) break;
        ms = 0; /* more may be queued: take them without waiting */
    }
    return 1;
}

static int l_poll(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    struct pollfd pfd[CORRAL_POLL_MAX];
    int n = corral_check_poll_list(L, 2, pfd);
    double t = luaL_optnumber(L, 3, -1);
    int ms = t < 0 ? -1 : t > 86400 ? 86400000 : (int)(t * 1000);
    int k = corral_relay_poll(r, pfd, (size_t)n, ms);
    if (k < 0) return corral_pushfail(L, "poll", -k);
    corral_push_ready(L, pfd, n);
    return 1;
}

static int l_count(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    const char *key = NULL;
    if (lua_type(L, 2) == LUA_TNUMBER && lua_isinteger(L, 2))
        key = lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, 2));
    else if (!lua_isnoneornil(L, 2))
        key = luaL_checkstring(L, 2);
    lua_pushinteger(L, (lua_Integer)corral_relay_count(r, key));
    return 1;
}

/* relay:reset(id) → true | nil, "reset: …", errno (ENOENT: no live connection id) */
static int l_reset(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    int err = corral_relay_reset(r, (uint64_t)id);
    if (err < 0) return corral_pushfail(L, "reset", -err);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_peek(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    lua_Integer max = luaL_optinteger(L, 3, 16384 + 5);
    luaL_argcheck(L, max > 0 && max <= 65536, 3, "1 .. 65536 bytes");
    luaL_Buffer b;
    char *buf = luaL_buffinitsize(L, &b, (size_t)max);
    int ended = 0;
    ssize_t n = corral_relay_peek(r, (uint64_t)id, buf, (size_t)max, &ended);
    if (n < 0) return corral_pushfail(L, "peek", (int)n);
    luaL_pushresultsize(&b, (size_t)n);
    lua_pushboolean(L, ended);
    return 2;
}

static int l_release(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    lua_Integer id = luaL_checkinteger(L, 2);
    return corral_result(L, corral_relay_release(r, (uint64_t)id), "release");
}

static int l_timer(lua_State *L)
{
    struct corral_relay *r = checkrelay(L, 1);
    int64_t ms = 0;
    int err = corral_relay_timer_ms(r, &ms);
    if (err < 0) return corral_pushfail(L, "timer", err);
    lua_pushnumber(L, (lua_Number)ms / 1000);
    return 1;
}

static int l_tostring(lua_State *L)
{
    lrelay *l = torelay(L, 1);
    if (l->r)
        lua_pushfstring(L, "corral.relay (%d live)", (int)corral_relay_count(l->r, NULL));
    else
        lua_pushliteral(L, "corral.relay (closed)");
    return 1;
}

static int l_walltime(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

int corral_open_relay(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"fileno", l_fileno},   {"add_pair", l_add_pair}, {"add_connect", l_add_connect},
        {"run", l_run},         {"poll", l_poll},         {"count", l_count},
        {"close", l_close},     {"reset", l_reset},       {"peek", l_peek},
        {"release", l_release}, {"timer", l_timer},       {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", l_close},
                                    {"__close", l_close},
                                    {"__tostring", l_tostring},
                                    {"__index", NULL},
                                    {NULL, NULL}};
    if (luaL_newmetatable(L, RELAY_TYPE)) {
        luaL_setfuncs(L, meta, 0);
        corral_set_fd_reader(L, &relay_fd_reader);
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "new");
    lua_pushcfunction(L, l_walltime);
    lua_setfield(L, -2, "walltime");
    lua_pushinteger(L, EUSERS);
    lua_setfield(L, -2, "EUSERS");
    return 0;
}
