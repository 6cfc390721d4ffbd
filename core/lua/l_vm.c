/*
 * core.vm.eval(code, opts): untrusted Lua in a fresh lua_State of its own — tier S2's
 * managed runtime (lua/corral/tier.lua runs it in a child confined at S1).
 *
 *   opts = {fuel = instructions, memory = bytes, read = {resolved paths}, clock = bool}
 *   → true, {n =, ...values}, stats        the chunk's return values
 *   → false, {kind =, message =}, stats    kind: "fuel", "memory", "stack", "error",
 *                                          "syntax", "unserialisable"
 *   stats = {fuel_used =, memory_peak =, output = what print wrote}
 *
 * Limits: the state's allocator refuses any growth past `memory` (the allocation fails
 * inside the state, never in the caller's); a count hook charges every instruction
 * against `fuel`, and once it is spent every further instruction raises, so a pcall in
 * the chunk cannot swallow the stop. One C call can outlast both (a pathological
 * string.find inside one instruction): the S2 child's wall-clock timeout covers that.
 *
 * Fuel is exact: `fuel` instructions run, the next one raises, and fuel_used is what
 * ran. The main thread's hook fires every HOOK_STEP instructions (the trap on every
 * instruction is the cost; the hook's own call is another 2x on a tight loop); what it
 * ran since its last charge is read at the end by running a calibration chunk of known
 * instructions until the hook fires. A coroutine's countdown is its own and dies with
 * it, so coroutines are charged on every instruction.
 *
 * The environment: base (without dofile, loadfile, collectgarbage; load takes text
 * only), string (without string.dump), table, math, utf8, coroutine; no io, os,
 * package, debug. What grants allow comes through checked functions: read_file(path)
 * for paths beneath a `read` grant, clock() and time() with `clock`.
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <limits.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lcorral.h"
#include "util.h"

#define HOOK_STEP 1000 /* instructions between two fuel charges of the main thread */
#define MAX_READ_GRANTS 64
#define CALIBRATION "corral.vm.calibration"

struct vm {
    size_t used, cap, peak;
    int mem_hit;
    long long fuel, spent; /* spent: instructions charged, each one that ran */
    int fuel_out;
    lua_State *main;
    int main_period; /* the main thread's hook count */
    int calibrating, calibrated_at;
    const char *calibration; /* the binary chunk, held on the caller's stack */
    size_t calibration_len;
    int clock;
    char *read[MAX_READ_GRANTS]; /* resolved, malloc'd */
    size_t n_read;
};

static void *vm_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct vm *v = ud;
    size_t old = ptr ? osize : 0; /* without ptr, osize names the type being made */
    if (nsize == 0) {
        free(ptr);
        v->used -= old;
        return NULL;
    }
    if (nsize > old && v->used - old + nsize > v->cap) {
        v->mem_hit = 1;
        return NULL; /* Lua then collects and retries once, and raises "not enough memory" */
    }
    void *p = realloc(ptr, nsize);
    if (!p) {
        v->mem_hit = 1;
        return NULL;
    }
    v->used = v->used - old + nsize;
    if (v->used > v->peak) v->peak = v->used;
    return p;
}

static struct vm *vm_of(lua_State *L)
{
    void *ud;
    lua_getallocf(L, &ud);
    return ud;
}

static void fuel_hook(lua_State *L, lua_Debug *ar);

static void set_period(lua_State *L, struct vm *v, long long count)
{
    int c = count < HOOK_STEP ? (int)count : HOOK_STEP;
    if (L == v->main) v->main_period = c;
    lua_sethook(L, fuel_hook, LUA_MASKCOUNT, c);
}

/* Fires as the period's last instruction is about to run: the period is charged with
 * it. The main thread's last period ends on the instruction past the fuel, exactly. */
static void fuel_hook(lua_State *L, lua_Debug *ar)
{
    struct vm *v = vm_of(L);
    if (v->calibrating) {
        if (!v->calibrated_at && lua_getinfo(L, "l", ar)) v->calibrated_at = ar->currentline;
        return;
    }
    if (!v->fuel_out) {
        v->spent += lua_gethookcount(L);
        if (v->spent <= v->fuel) {
            if (L == v->main && v->fuel - v->spent < HOOK_STEP)
                set_period(L, v, v->fuel - v->spent + 1);
            return;
        }
        v->spent--; /* the instruction about to run does not */
        v->fuel_out = 1;
        /* From now on every instruction, in every coroutine, raises again. */
        set_period(L, v, 1);
    }
    luaL_error(L, "fuel exhausted");
}

/* coroutine.create and coroutine.wrap: the original (upvalue 1), then the new
 * thread's hook charges each instruction. */
static int sb_cocreate(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    lua_State *co = lua_tothread(L, -1);
    if (!co && lua_getupvalue(L, -1, 1)) { /* wrap's function keeps its thread there */
        co = lua_tothread(L, -1);
        lua_pop(L, 1);
    }
    if (co) lua_sethook(co, fuel_hook, LUA_MASKCOUNT, 1);
    return 1;
}

struct dump {
    int started;
    luaL_Buffer b;
};

/* The buffer starts at the first write: lua_dump reads the function at the top first. */
static int dump_writer(lua_State *L, const void *p, size_t size, void *ud)
{
    struct dump *d = ud;
    if (!d->started) {
        d->started = 1;
        luaL_buffinit(L, &d->b);
    }
    luaL_addlstring(&d->b, p, size);
    return 0;
}

/* The calibration chunk, "local a" then `a = 1` on each following line: one
 * instruction a line (LOADNIL, then LOADI), so the line the hook fires on is the
 * number of instructions it ran. Compiled once in the caller's state and kept there
 * as a binary chunk (with its lines): loading it is ~10x cheaper than compiling it
 * in every fresh state. Pushes the chunk onto O. */
static const char *calibration_chunk(lua_State *O, size_t *len)
{
    if (lua_getfield(O, LUA_REGISTRYINDEX, CALIBRATION) != LUA_TSTRING) {
        lua_pop(O, 1);
        luaL_Buffer b;
        luaL_buffinit(O, &b);
        luaL_addstring(&b, "local a");
        for (int i = 0; i < HOOK_STEP; i++)
            luaL_addstring(&b, "\na = 1");
        luaL_pushresult(&b);
        size_t tlen;
        const char *text = lua_tolstring(O, -1, &tlen);
        if (luaL_loadbufferx(O, text, tlen, "=calibration", "t") != LUA_OK) lua_error(O);
        struct dump d = {0};
        if (lua_dump(O, dump_writer, &d, 0) != 0 || !d.started)
            luaL_error(O, "calibration: no dump");
        luaL_pushresult(&d.b);
        lua_replace(O, -3); /* over the text */
        lua_pop(O, 1);
        lua_pushvalue(O, -1);
        lua_setfield(O, LUA_REGISTRYINDEX, CALIBRATION);
    }
    return lua_tolstring(O, -1, len);
}

static int load_calibration(lua_State *L, const struct vm *v)
{
    if (luaL_loadbufferx(L, v->calibration, v->calibration_len, "=calibration", "b") != LUA_OK)
        return lua_error(L);
    lua_setfield(L, LUA_REGISTRYINDEX, CALIBRATION);
    return 0;
}

/* What the main thread ran since its last charge: period minus the instructions it
 * takes for its countdown to reach the hook. */
static long long uncharged(lua_State *S, struct vm *v)
{
    v->calibrating = 1;
    v->calibrated_at = 0;
    lua_getfield(S, LUA_REGISTRYINDEX, CALIBRATION);
    int status = lua_pcall(S, 0, 0, 0);
    if (status != LUA_OK) lua_pop(S, 1);
    v->calibrating = 0;
    if (status != LUA_OK || v->calibrated_at < 1 || v->calibrated_at > v->main_period) return 0;
    return v->main_period - v->calibrated_at;
}

/* Whether resolved path lies beneath (or is) a granted one. */
static int granted(const struct vm *v, const char *path)
{
    for (size_t i = 0; i < v->n_read; i++)
        if (corral_is_beneath(path, v->read[i])) return 1;
    return 0;
}

/* read_file(path) → contents, or nil, msg: the path is resolved first, and the resolved
 * path must be beneath a read grant (the S1 child's Landlock domain holds it too). The
 * buffer is made, through the state's allocator, before the file is opened: the one
 * allocation that can raise then leaves nothing open behind. */
static int sb_read_file(lua_State *L)
{
    struct vm *v = vm_of(L);
    const char *path = luaL_checkstring(L, 1);
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(path, real) || stat(real, &st) < 0) return luaL_fileresult(L, 0, path);
    if (!granted(v, real)) {
        luaL_pushfail(L);
        lua_pushfstring(L, "%s: not within a read grant", real);
        return 2;
    }
    size_t size = S_ISREG(st.st_mode) ? (size_t)st.st_size : 0;
    char *buf = lua_newuserdatauv(L, size ? size : 1, 0);
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return luaL_fileresult(L, 0, real);
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    lua_pushlstring(L, buf, got);
    return 1;
}

static int sb_clock(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)clock() / CLOCKS_PER_SEC);
    return 1;
}

static int sb_time(lua_State *L)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    lua_pushnumber(L, (lua_Number)t.tv_sec + (lua_Number)t.tv_nsec / 1e9);
    return 1;
}

/* print: appended to the output buffer in the registry (bounded by the memory cap). */
static int sb_print(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b); /* pushes its placeholder: what is added comes after it */
    lua_getfield(L, LUA_REGISTRYINDEX, "corral.vm.output");
    luaL_addvalue(&b);
    for (int i = 1; i <= n; i++) {
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
        if (i < n) luaL_addchar(&b, '\t');
    }
    luaL_addchar(&b, '\n');
    luaL_pushresult(&b);
    lua_setfield(L, LUA_REGISTRYINDEX, "corral.vm.output");
    return 0;
}

/* load(chunk [, name [, mode [, env]]]) with text chunks only. */
static int sb_load(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "=(load)");
    int env = !lua_isnone(L, 4);
    int r = luaL_loadbufferx(L, s, len, name, "t");
    if (r != LUA_OK) {
        luaL_pushfail(L);
        lua_insert(L, -2);
        return 2;
    }
    if (env) {
        lua_pushvalue(L, 4);
        if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
}

/* Builds the environment (in protected mode: a cap too small to build it is a memory
 * failure, not a panic). */
static int setup(lua_State *L)
{
    struct vm *v = vm_of(L);
    static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                    {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_TABLIBNAME, luaopen_table},
                                    {LUA_MATHLIBNAME, luaopen_math},
                                    {LUA_UTF8LIBNAME, luaopen_utf8},
                                    {LUA_COLIBNAME, luaopen_coroutine},
                                    {NULL, NULL}};
    for (const luaL_Reg *l = libs; l->func; l++) {
        luaL_requiref(L, l->name, l->func, 1);
        lua_pop(L, 1);
    }
    lua_pushglobaltable(L);
    static const char *const removed[] = {"dofile", "loadfile", "collectgarbage", "require"};
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
        lua_pushnil(L);
        lua_setfield(L, -2, removed[i]);
    }
    lua_getfield(L, -1, "string");
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    lua_pushcfunction(L, sb_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, sb_print);
    lua_setfield(L, -2, "print");
    if (v->n_read) {
        lua_pushcfunction(L, sb_read_file);
        lua_setfield(L, -2, "read_file");
    }
    lua_getfield(L, -1, "coroutine");
    static const char *const makers[] = {"create", "wrap"};
    for (size_t i = 0; i < 2; i++) {
        lua_getfield(L, -1, makers[i]);
        lua_pushcclosure(L, sb_cocreate, 1);
        lua_setfield(L, -2, makers[i]);
    }
    lua_pop(L, 1);
    if (v->clock) {
        lua_pushcfunction(L, sb_clock);
        lua_setfield(L, -2, "clock");
        lua_pushcfunction(L, sb_time);
        lua_setfield(L, -2, "time");
    }
    lua_pushliteral(L, "");
    lua_setfield(L, LUA_REGISTRYINDEX, "corral.vm.output");
    return load_calibration(L, v);
}

/* Copies a scalar at index i of S onto O; 0 when it is not one. */
static int copy_scalar(lua_State *S, int i, lua_State *O)
{
    switch (lua_type(S, i)) {
    case LUA_TNIL:
        lua_pushnil(O);
        return 1;
    case LUA_TBOOLEAN:
        lua_pushboolean(O, lua_toboolean(S, i));
        return 1;
    case LUA_TNUMBER:
        if (lua_isinteger(S, i))
            lua_pushinteger(O, lua_tointeger(S, i));
        else
            lua_pushnumber(O, lua_tonumber(S, i));
        return 1;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(S, i, &len);
        lua_pushlstring(O, s, len);
        return 1;
    }
    default:
        return 0;
    }
}

/* Copies a result (a scalar, or a flat table of scalars keyed by strings and numbers)
 * from S to O. Returns 0, or pushes nothing and returns -1. Runs without raising in S:
 * lua_next over a table only reads. */
static int copy_value(lua_State *S, int i, lua_State *O)
{
    if (copy_scalar(S, i, O)) return 0;
    if (lua_type(S, i) != LUA_TTABLE) return -1;
    lua_newtable(O);
    lua_pushnil(S);
    while (lua_next(S, i)) {
        int kt = lua_type(S, -2);
        if ((kt != LUA_TSTRING && kt != LUA_TNUMBER) || lua_type(S, -1) == LUA_TTABLE) {
            lua_pop(S, 2);
            lua_pop(O, 1);
            return -1;
        }
        copy_scalar(S, lua_absindex(S, -2), O);
        if (!copy_scalar(S, lua_absindex(S, -1), O)) {
            lua_pop(S, 2);
            lua_pop(O, 2);
            return -1;
        }
        lua_rawset(O, -3);
        lua_pop(S, 1);
    }
    return 0;
}

static void push_stats(lua_State *O, lua_State *S, const struct vm *v)
{
    lua_createtable(O, 0, 3);
    lua_pushinteger(O, v->spent);
    lua_setfield(O, -2, "fuel_used");
    lua_pushinteger(O, (lua_Integer)v->peak);
    lua_setfield(O, -2, "memory_peak");
    lua_getfield(S, LUA_REGISTRYINDEX, "corral.vm.output");
    size_t len = 0;
    const char *out = lua_tolstring(S, -1, &len);
    lua_pushlstring(O, out ? out : "", out ? len : 0);
    lua_pop(S, 1);
    lua_setfield(O, -2, "output");
}

static int push_failure(lua_State *O, const char *kind, const char *message)
{
    lua_pushboolean(O, 0);
    lua_createtable(O, 0, 2);
    lua_pushstring(O, kind);
    lua_setfield(O, -2, "kind");
    lua_pushstring(O, message);
    lua_setfield(O, -2, "message");
    return 2;
}

static const char *failure_kind(const struct vm *v, int status, const char *msg)
{
    if (v->fuel_out) return "fuel";
    if (status == LUA_ERRMEM || v->mem_hit) return "memory";
    if (status == LUA_ERRSYNTAX) return "syntax";
    if (msg && strstr(msg, "stack overflow")) return "stack";
    return "error";
}

static void read_opts(lua_State *O, struct vm *v)
{
    lua_getfield(O, 2, "fuel");
    v->fuel = (long long)luaL_optinteger(O, -1, 100000000);
    lua_getfield(O, 2, "memory");
    v->cap = (size_t)luaL_optinteger(O, -1, 64 << 20);
    lua_getfield(O, 2, "clock");
    v->clock = lua_toboolean(O, -1);
    lua_pop(O, 3);
    if (lua_getfield(O, 2, "read") == LUA_TTABLE) {
        lua_Integer n = luaL_len(O, -1);
        if (n > MAX_READ_GRANTS)
            luaL_argerror(O, 2, lua_pushfstring(O, "at most %d read grants", MAX_READ_GRANTS));
        for (lua_Integer i = 1; i <= n; i++) {
            lua_geti(O, -1, i);
            const char *p = lua_tostring(O, -1);
            if (p && (v->read[v->n_read] = strdup(p))) v->n_read++;
            lua_pop(O, 1);
        }
    }
    lua_pop(O, 1);
}

static void vm_release(struct vm *v)
{
    for (size_t i = 0; i < v->n_read; i++)
        free(v->read[i]);
    v->n_read = 0;
}

static int l_eval(lua_State *O)
{
    size_t len;
    const char *code = luaL_checklstring(O, 1, &len);
    if (lua_isnoneornil(O, 2)) {
        lua_settop(O, 1);
        lua_newtable(O);
    }
    lua_settop(O, 2);
    luaL_checktype(O, 2, LUA_TTABLE);
    /* The vm lives in a userdata of the caller's state, so nothing leaks if the caller
     * raises below (the strdup'd grants are released before any raising call). */
    struct vm *v = lua_newuserdatauv(O, sizeof *v, 0);
    memset(v, 0, sizeof *v);
    v->calibration = calibration_chunk(O, &v->calibration_len);
    read_opts(O, v);
    lua_State *S = lua_newstate(vm_alloc, v);
    if (!S) {
        vm_release(v);
        push_failure(O, "memory", "the memory cap is too small for a Lua state");
        lua_createtable(O, 0, 0);
        return 3;
    }
    lua_pushcfunction(S, setup);
    int status = lua_pcall(S, 0, 0, 0);
    if (status == LUA_OK) {
        v->main = S;
        status = luaL_loadbufferx(S, code, len, "=step", "t");
        set_period(S, v, v->fuel + 1);
        if (status == LUA_OK) status = lua_pcall(S, 0, LUA_MULTRET, 0);
        /* calibrated on top of the results, which it leaves in place */
        v->spent += uncharged(S, v);
    }
    vm_release(v);
    int nret;
    if (status != LUA_OK) {
        const char *msg = lua_tostring(S, -1);
        nret = push_failure(O, failure_kind(v, status, msg),
                            msg ? msg : "(error object is not a string)");
    } else {
        int n = lua_gettop(S);
        lua_pushboolean(O, 1);
        lua_createtable(O, n, 1);
        lua_pushinteger(O, n);
        lua_setfield(O, -2, "n");
        nret = 2;
        for (int i = 1; i <= n; i++) {
            if (copy_value(S, i, O) < 0) {
                lua_pop(O, 2);
                char msg[96];
                snprintf(msg, sizeof msg,
                         "result %d is a %s (a scalar or a flat table is returned)", i,
                         luaL_typename(S, i));
                nret = push_failure(O, "unserialisable", msg);
                break;
            }
            lua_rawseti(O, -2, i);
        }
    }
    push_stats(O, S, v);
    lua_close(S);
    return nret + 1;
}

int corral_open_vm(lua_State *L)
{
    static const luaL_Reg fns[] = {{"eval", l_eval}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
