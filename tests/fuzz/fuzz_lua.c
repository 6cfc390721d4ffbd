/*
 * The driver of the Lua targets: each is tests/fuzz/lua/<name>.lua, a chunk that returns
 * a callable of one input (a string), run in a Lua 5.4 state of its own that loads the
 * project's modules from lua/ and its C modules from ./corral/ (run from the
 * repository's root). The function is called under pcall: a Lua error is an input the
 * parser refused, which is fine; an error that is a table with `fuzz_check` (raised by
 * tests/fuzz/lua/support.lua's check) is an invariant the target broke, and aborts, as
 * does a harness that cannot load. A crash, a sanitizer report or a hang is a finding
 * as in any target.
 *
 * Built with -DCORRAL_FUZZ_LUA_TARGET='"name"' it is that target's libFuzzer entry point,
 * with the Lua lines run fed to libFuzzer as coverage (its extra counters: which line
 * followed which), so that inputs that reach new Lua code are kept. Without it,
 * corral_fuzz_lua is what tests/c/test_fuzz_corpus.c replays the corpora through.
 */
#include <ftw.h>
#include <sys/stat.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int corral_fuzz_lua(const char *target, const uint8_t *data, size_t size);
void corral_fuzz_lua_load(const char *target);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef CORRAL_FUZZ_LUA_TARGET
#define LUA_EDGES (1 << 16)
/* libFuzzer counts these as coverage beside the C code's own counters */
__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t lua_edges[LUA_EDGES];
static uintptr_t last_line;

static void on_line(lua_State *L, lua_Debug *ar)
{
    if (!lua_getinfo(L, "S", ar)) return;
    uintptr_t here = (uintptr_t)ar->source * 2654435761u + (uintptr_t)ar->currentline * 40503u;
    uint8_t *c = &lua_edges[(here ^ last_line) % LUA_EDGES];
    if (*c < 255) (*c)++;
    last_line = here >> 1;
}
#endif

/* One scratch directory per process for what a target writes (its files, the state and
 * runtime directories it is pointed at), removed at exit. */
static char scratch[64];
static pid_t scratch_owner;

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_scratch(void)
{
    /* only by the process that made it: a replay's forked children leave it */
    if (scratch[0] && getpid() == scratch_owner)
        nftw(scratch, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_scratch(void)
{
    if (scratch[0]) return;
    snprintf(scratch, sizeof scratch, "/tmp/corral-fuzz-XXXXXX");
    if (!mkdtemp(scratch)) {
        perror("fuzz_lua: mkdtemp");
        abort();
    }
    scratch_owner = getpid();
    atexit(remove_scratch);
    setenv("CORRAL_FUZZ_SCRATCH", scratch, 1);
    setenv("CORRAL_STATE_DIR", scratch, 1);
    setenv("XDG_RUNTIME_DIR", scratch, 1);
    setenv("CORRAL_RUNTIME_LOG_DIR", scratch, 1);
}

struct target {
    const char *name;
    lua_State *L;
    int fn;
};

static struct target targets[16];

/* The target's state and function, loaded on first use; a harness that fails to load
 * aborts (that is a broken target, never a refused input). */
static struct target *target_of(const char *name)
{
    size_t i = 0;
    for (; i < sizeof targets / sizeof targets[0] && targets[i].name; i++)
        if (strcmp(targets[i].name, name) == 0) return &targets[i];
    if (i == sizeof targets / sizeof targets[0]) abort();
    make_scratch();
    lua_State *L = luaL_newstate();
    if (!L) abort();
    luaL_openlibs(L);
    char chunk[256];
    snprintf(chunk, sizeof chunk,
             "package.path = 'lua/?.lua;lua/?/init.lua;tests/fuzz/lua/?.lua;' .. package.path\n"
             "package.cpath = './?.so;' .. package.cpath\n"
             "return dofile('tests/fuzz/lua/%s.lua')",
             name);
    if (luaL_dostring(L, chunk) != LUA_OK || lua_isnil(L, -1)) {
        fprintf(stderr, "fuzz_lua: target %s did not load: %s\n", name, lua_tostring(L, -1));
        abort();
    }
    targets[i] = (struct target){name, L, luaL_ref(L, LUA_REGISTRYINDEX)};
#ifdef CORRAL_FUZZ_LUA_TARGET
    lua_sethook(L, on_line, LUA_MASKLINE, 0);
#endif
    return &targets[i];
}

/* Loads a target ahead of its first input (a replay's children then share the load). */
void corral_fuzz_lua_load(const char *name)
{
    (void)target_of(name);
}

int corral_fuzz_lua(const char *name, const uint8_t *data, size_t size)
{
    struct target *t = target_of(name);
    lua_State *L = t->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->fn);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK && lua_istable(L, -1)) {
        lua_getfield(L, -1, "fuzz_check");
        if (lua_isstring(L, -1)) {
            fprintf(stderr, "fuzz_lua: %s: check failed: %s\n", name, lua_tostring(L, -1));
            abort();
        }
    }
    lua_settop(L, 0);
    return 0;
}

#ifdef CORRAL_FUZZ_LUA_TARGET
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return corral_fuzz_lua(CORRAL_FUZZ_LUA_TARGET, data, size);
}
#endif
