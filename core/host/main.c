/*
 * The `corral` executable: Lua 5.4's standalone interpreter contract (options -e -l -i -v
 * -E -W -- -, the `arg` table, LUA_INIT, errors with a traceback) with the core linked in
 * and preloaded as "corral.core", plus these additions: the `exec-confined`, `exec` and
 * `confine --exec` fast paths (core/host/confine.c, core/host/session_exec.c,
 * core/host/confine_fast.c; their `--help` is cli.lua's),
 * subcommands from lua/corral/cli.lua (an unknown one is an error there, unless a file of that name
 * exists), `--version`, `--help` and `-h` alone on the line, and a REPL with history, whose results
 * print and whose Tab completes through lua/corral/repl.lua (`corral.host.repl()` opens it from
 * Lua, as `corral attach` does).
 *
 * Installed as `corral-host`: the `corral` a user runs is the front (core/front/front.c),
 * which serves `corral exec` itself and execs this program with every other argv.
 *
 * The command line is kept identical to lua5.4's so that `busted --lua=build/corral` can
 * re-exec the host as `build/corral /usr/bin/busted args…` (the sanitizer build runs the
 * whole suite that way).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "compiled.h"
#include "confine.h"
#include "confine_fast.h"
#include "console.h"
#include "dispatch.h"
#include "session_exec.h"
#include "exitcodes.h"

#define LUA_VERSION_DIR LUA_VERSION_MAJOR "." LUA_VERSION_MINOR
#define LUA_INIT_VAR "LUA_INIT"
#define LUA_INIT_VERSIONED LUA_INIT_VAR "_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR
/* loadlib.c's LUA_IGMARK: `-l mod-suffix` requires "mod-suffix" into global "mod". */
#define IGNORE_MARK '-'

int luaopen_corral_core(lua_State *L);
static int open_host(lua_State *L);

enum {
    ARGS_ERROR = 1 << 0,
    ARGS_INTERACTIVE = 1 << 1, /* -i */
    ARGS_VERSION = 1 << 2,     /* -v */
    ARGS_EXEC = 1 << 3,        /* -e */
    ARGS_NOENV = 1 << 4,       /* -E */
};

const char *host_progname = CORRAL_PROGNAME;
static lua_State *signal_L;

void host_print_message(const char *prefix, const char *msg)
{
    if (prefix != NULL) fprintf(stderr, "%s: ", prefix);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

int host_report(lua_State *L, int status)
{
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        host_print_message(host_progname, msg != NULL ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

/* Optimal string alignment distance, as corral.cli.suggest measures a mistyped command;
 * words past 31 characters are never close. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31) return 99;
    int d[32][32];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* The long option the host knows that `bad` is a slip of (one or two edits), or NULL. */
static const char *closest_long_option(const char *bad)
{
    static const char *const known[] = {"--version", "--help"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        int d = edit_distance(bad, known[i]);
        if (d > 0 && d <= 2) return known[i];
    }
    return NULL;
}

static void print_usage(const char *bad)
{
    const char *close = closest_long_option(bad);
    if (bad[1] == 'e' || bad[1] == 'l')
        fprintf(stderr, "%s: '%s' needs argument\n", host_progname, bad);
    else if (close)
        fprintf(stderr, "%s: unrecognized option '%s'; did you mean '%s'?\n", host_progname, bad,
                close);
    else
        fprintf(stderr, "%s: unrecognized option '%s'\n", host_progname, bad);
    fputs("usage: " CORRAL_PROGNAME " [options] [script [args]]\n"
          "       " CORRAL_PROGNAME " <command> [args]   (`" CORRAL_PROGNAME
          " help` lists the commands)\n"
          "Available options are:\n"
          "  -e stat   execute string 'stat'\n"
          "  -i        enter interactive mode after executing 'script'\n"
          "  -l mod    require library 'mod' into global 'mod'\n"
          "  -l g=mod  require library 'mod' into global 'g'\n"
          "  -v        show version information (also --version)\n"
          "  -E        ignore environment variables\n"
          "  -W        turn warnings on\n"
          "  --        stop handling options\n"
          "  -         stop handling options and execute stdin\n"
          "  -h        list the commands (also --help)\n",
          stderr);
    fflush(stderr);
}

static void print_version(void)
{
    fputs(CORRAL_PROGNAME " " CORRAL_VERSION " (" LUA_RELEASE ")\n", stdout);
    fflush(stdout);
}

/* Set once a Ctrl-C has interrupted a chunk. */
static volatile sig_atomic_t interrupted;

/* Runs inside the interrupted chunk, where raising is safe; the signal handler is not.
 * The error carries no position: it is the user's Ctrl-C, not a line of corral's. */
static void interrupt_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    lua_pushliteral(L, "interrupted!");
    lua_error(L);
}

/* SA_RESETHAND makes a second Ctrl-C kill the process, as in lua.c, if the chunk never
 * reaches the hook (a C function blocked forever). */
static void on_sigint_running(int sig)
{
    (void)sig;
    interrupted = 1;
    lua_sethook(signal_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* A command that a Ctrl-C interrupted before it took SIGINT itself (its clean-up ran as
 * the error unwound it) exits as one SIGINT ended, 128 + 2, never with 1 as if it had
 * failed; a script keeps lua.c's 1. */
static int command_exit(int status)
{
    return interrupted ? 128 + SIGINT : status;
}

static int message_handler(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Calls the function below narg arguments with the traceback handler and Ctrl-C armed;
 * the previous SIGINT disposition (default, or the REPL's reader) comes back after. */
int host_docall(lua_State *L, int narg, int nres)
{
    int base = lua_gettop(L) - narg;
    struct sigaction sa, old;
    int status;

    lua_pushcfunction(L, message_handler);
    lua_insert(L, base);
    signal_L = L;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint_running;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    status = lua_pcall(L, narg, nres, base);
    sigaction(SIGINT, &old, NULL);
    /* A Ctrl-C that landed after the chunk's last instruction must not interrupt the
     * next one; a hook the user set with debug.sethook stays. */
    if (lua_gethook(L) == interrupt_hook) lua_sethook(L, NULL, 0, 0);
    lua_remove(L, base);
    return status;
}

static int dochunk(lua_State *L, int status)
{
    if (status == LUA_OK) status = host_docall(L, 0, 0);
    return host_report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *chunkname)
{
    return dochunk(L, luaL_loadbuffer(L, s, strlen(s), chunkname));
}

/* `-l mod`, `-l g=mod`: global = require(mod). */
static int dolibrary(lua_State *L, const char *spec)
{
    const char *eq = strchr(spec, '=');
    const char *modname = eq != NULL ? eq + 1 : spec;
    const char *mark = strchr(spec, IGNORE_MARK);
    size_t globlen =
        eq != NULL ? (size_t)(eq - spec) : (mark != NULL ? (size_t)(mark - spec) : strlen(spec));
    int status;

    lua_pushlstring(L, spec, globlen);
    lua_getglobal(L, "require");
    lua_pushstring(L, modname);
    status = host_docall(L, 1, 1);
    if (status == LUA_OK)
        lua_setglobal(L, lua_tostring(L, -2));
    else
        host_report(L, status);
    lua_pop(L, 1);
    return status;
}

/*
 * Scans the options as lua.c does. *script is the index of the script in argv, or 0
 * when there is none; on ARGS_ERROR it is the index of the offending option.
 */
static int collect_args(char **argv, int *script)
{
    int args = 0;
    int i;

    for (i = 1; argv[i] != NULL; i++) {
        *script = i;
        if (argv[i][0] != '-') return args;
        switch (argv[i][1]) {
        case '-':
            if (argv[i][2] != '\0') return ARGS_ERROR;
            *script = argv[i + 1] != NULL ? i + 1 : 0;
            return args;
        case '\0':
            return args;
        case 'E':
            if (argv[i][2] != '\0') return ARGS_ERROR;
            args |= ARGS_NOENV;
            break;
        case 'W':
            if (argv[i][2] != '\0') return ARGS_ERROR;
            break;
        case 'i':
            if (argv[i][2] != '\0') return ARGS_ERROR;
            args |= ARGS_INTERACTIVE;
            break;
        case 'v':
            if (argv[i][2] != '\0') return ARGS_ERROR;
            args |= ARGS_VERSION;
            break;
        case 'e':
        case 'l':
            if (argv[i][1] == 'e') args |= ARGS_EXEC;
            if (argv[i][2] == '\0') {
                i++;
                if (argv[i] == NULL || argv[i][0] == '-') return ARGS_ERROR;
            }
            break;
        default:
            return ARGS_ERROR;
        }
    }
    *script = 0;
    return args;
}

/* Runs -e, -l and -W in command-line order; argv[1..n-1] are all options. */
static int run_args(lua_State *L, char **argv, int n)
{
    for (int i = 1; i < n; i++) {
        char option = argv[i][1];
        if (option == 'e' || option == 'l') {
            const char *extra = argv[i] + 2;
            int status;
            if (*extra == '\0') extra = argv[++i];
            if (option == 'e')
                status = dostring(L, extra, "=(command line)");
            else
                status = dolibrary(L, extra);
            if (status != LUA_OK) return 0;
        } else if (option == 'W') {
            lua_warning(L, "@on", 0);
        }
    }
    return 1;
}

/* arg[0] is the script (or the program when there is none), options go to negative
 * indices and the script's own arguments to 1..n. */
static void create_arg_table(lua_State *L, char **argv, int argc, int script)
{
    lua_createtable(L, argc - (script + 1), script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

static int push_script_args(lua_State *L)
{
    int n;
    if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
    n = (int)luaL_len(L, -1);
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++)
        lua_rawgeti(L, -i, i);
    lua_remove(L, -n - 1);
    return n;
}

static int handle_script(lua_State *L, char **argv, int script)
{
    const char *fname = argv[script];
    int status;
    /* `-` is stdin unless it follows `--`, where it is a file name. */
    if (strcmp(fname, "-") == 0 && strcmp(argv[script - 1], "--") != 0) fname = NULL;
    status = luaL_loadfile(L, fname);
    if (status == LUA_OK) {
        int n = push_script_args(L);
        status = host_docall(L, n, LUA_MULTRET);
    }
    return host_report(L, status);
}

static int handle_luainit(lua_State *L)
{
    const char *chunkname = "=" LUA_INIT_VERSIONED;
    const char *init = getenv(chunkname + 1);
    if (init == NULL) {
        chunkname = "=" LUA_INIT_VAR;
        init = getenv(chunkname + 1);
    }
    if (init == NULL) return LUA_OK;
    if (init[0] == '@') return dochunk(L, luaL_loadfile(L, init + 1));
    return dostring(L, init, chunkname);
}

/* The resolved executable; /proc may be absent (an early chroot), then argv[0]. */
static int resolve_self(const char *argv0, char *out, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", out, size - 1);
    if (n > 0 && (size_t)n < size - 1) {
        out[n] = '\0';
        return 1;
    }
    if (strchr(argv0, '/') != NULL && size >= PATH_MAX && realpath(argv0, out) != NULL) return 1;
    return 0;
}

/* Registry "corral.host_executable" for the core (it launches this same binary as the
 * confinement wrapper), and package paths relative to the executable so that both
 * build/corral (modules in lua/) and PREFIX/bin/corral (PREFIX/share/lua/5.4) find their
 * own modules without LUA_PATH. */
static void setup_host(lua_State *L, const char *argv0)
{
    char exe[PATH_MAX];
    char *slash;
    const char *root;

    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_corral_core);
    lua_setfield(L, -2, "corral.core");
    lua_pushcfunction(L, open_host);
    lua_setfield(L, -2, "corral.host");
    lua_pop(L, 1);

    if (!resolve_self(argv0, exe, sizeof exe)) return;
    lua_pushstring(L, exe);
    lua_setfield(L, LUA_REGISTRYINDEX, "corral.host_executable");

    /* exe is canonical (no symlinks, no ..), so cutting two components is <exedir>/.. */
    slash = strrchr(exe, '/');
    if (slash == NULL) return;
    *slash = '\0';
    char twins[PATH_MAX]; /* the build tree's compiled modules, else the installed ones */
    if (snprintf(twins, sizeof twins, "%s/luac", exe) >= (int)sizeof twins) twins[0] = '\0';
    slash = strrchr(exe, '/');
    if (slash == NULL) return;
    *slash = '\0';
    root = exe;

    lua_getglobal(L, "package");
    lua_pushfstring(L,
                    "%s/lua/?.lua;%s/lua/?/init.lua;%s/share/lua/" LUA_VERSION_DIR
                    "/?.lua;%s/share/lua/" LUA_VERSION_DIR "/?/init.lua;",
                    root, root, root, root);
    lua_getfield(L, -2, "path");
    lua_concat(L, 2);
    lua_setfield(L, -2, "path");
    lua_pushfstring(L, "%s/lib/lua/" LUA_VERSION_DIR "/?.so;", root);
    lua_getfield(L, -2, "cpath");
    lua_concat(L, 2);
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    struct stat st;
    /* only a directory: with PREFIX=/usr, <exedir>/luac is /usr/bin/luac, the compiler */
    if ((twins[0] == '\0' || stat(twins, &st) < 0 || !S_ISDIR(st.st_mode)) &&
        snprintf(twins, sizeof twins, "%s/lib/lua/" LUA_VERSION_DIR "/corral/luac", root) >=
            (int)sizeof twins)
        return;
    corral_host_use_compiled(L, twins);
}

/* A name ending in ".lua" is meant as a script even when the file is missing, so that
 * its error stays "cannot open", not "unknown command". */
static int looks_like_script(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".lua") == 0;
}

/*
 * Whether argv[1] goes to corral.cli: a subcommand, or a word that is neither a command
 * nor a file, which cli.main reports as an unknown command. A name with a '/' never does
 * (that is how a script named like a command is run: ./name), which also keeps
 * `corral /usr/bin/busted` from loading the CLI at all; an existing file that is not a
 * command is run as a script. When corral.cli cannot be loaded, an existing file is run
 * as a script; otherwise the load error is reported (*failed).
 */
static int is_command(lua_State *L, const char *name, int *failed)
{
    int status, yes;

    *failed = 0;
    if (strchr(name, '/') != NULL || looks_like_script(name)) return 0;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "corral.cli");
    status = host_docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_getfield(L, -1, "is_command");
        lua_pushstring(L, name);
        status = host_docall(L, 1, 1);
        lua_remove(L, -2);
    }
    if (status != LUA_OK) {
        if (access(name, F_OK) == 0) {
            lua_pop(L, 1);
            return 0;
        }
        host_report(L, status);
        *failed = 1;
        return 0;
    }
    yes = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return yes || access(name, F_OK) != 0;
}

/* require(module).main({argv[1], …}); returns the process exit status. */
static int run_module_main(lua_State *L, const char *module, int argc, char **argv)
{
    int status;

    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    status = host_docall(L, 1, 1);
    if (status != LUA_OK) return host_report(L, status), EXIT_FAILURE;
    lua_getfield(L, -1, "main");
    lua_remove(L, -2);
    lua_createtable(L, argc - 1, 1);
    lua_pushstring(L, argv[0]); /* [0]: how the host was called (corral-runtime's keeper) */
    lua_rawseti(L, -2, 0);
    for (int i = 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    status = host_docall(L, 1, 1);
    if (status != LUA_OK) return host_report(L, status), EXIT_FAILURE;
    if (lua_isinteger(L, -1)) {
        lua_Integer code = lua_tointeger(L, -1);
        lua_pop(L, 1);
        return (int)code;
    }
    if (lua_isnil(L, -1) || lua_isboolean(L, -1)) {
        int ok = lua_isnil(L, -1) || lua_toboolean(L, -1);
        lua_pop(L, 1);
        return ok ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    host_print_message(host_progname, lua_pushfstring(L, "%s.main returned a %s value", module,
                                                      luaL_typename(L, -1)));
    lua_pop(L, 2);
    return EXIT_FAILURE;
}

/* require("corral.cli").main({argv[1], …}); returns the process exit status. */
static int run_command(lua_State *L, int argc, char **argv)
{
    return run_module_main(L, "corral.cli", argc, argv);
}

/* corral.host.repl(): the REPL, from Lua (`corral attach` opens it once it has chosen
 * the sandbox). Returns when the user ends it (EOF); os.exit ends the process. */
static int l_host_repl(lua_State *L)
{
    lua_settop(L, 0);
    corral_console_run(L);
    return 0;
}

/* A NULL-terminated copy of the list at index idx (its strings stay the Lua state's). */
static char **string_list(lua_State *L, int idx, int *n)
{
    lua_Integer len = luaL_len(L, idx);
    char **out = calloc((size_t)len + 1, sizeof *out);
    if (out == NULL) luaL_error(L, "out of memory");
    for (lua_Integer i = 1; i <= len; i++) {
        lua_geti(L, idx, i);
        out[i - 1] = (char *)lua_tostring(L, -1);
        lua_pop(L, 1); /* the table keeps the string alive */
        if (out[i - 1] == NULL) {
            free(out);
            luaL_argerror(L, idx, "must be a list of strings");
        }
    }
    if (n != NULL) *n = (int)len;
    return out;
}

/* corral.host.exec_confined(args, envp, cd): this process becomes the confinement
 * wrapper, as execve(host, {host, args...}, envp) from cd would make it, without loading
 * the host a second time (`corral confine --exec` pays one start-up, not two). args[1] is
 * "exec-confined". Never returns once the wrapper starts: the process exits with its
 * status. Returns nil, msg, errno when cd or the environment cannot be set. */
static int l_host_exec_confined(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *cd = luaL_optstring(L, 3, NULL);
    int argc;
    char **argv = string_list(L, 1, &argc);
    char **envp = string_list(L, 2, NULL);
    if (argc < 1 || strcmp(argv[0], "exec-confined") != 0) {
        free(argv);
        free(envp);
        return luaL_argerror(L, 1, "must start with \"exec-confined\"");
    }
    if (cd != NULL && chdir(cd) < 0) {
        int err = errno;
        free(argv);
        free(envp);
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", cd, strerror(err));
        lua_pushinteger(L, err);
        return 3;
    }
    /* what an exec would leave: this environment, SIGINT as the host found it */
    environ = envp;
    signal(SIGINT, SIG_DFL);
    fflush(NULL);
    _exit(corral_exec_confined_main(argc, argv));
}

static int open_host(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"repl", l_host_repl}, {"exec_confined", l_host_exec_confined}, {NULL, NULL}};
    luaL_newlib(L, fns);
    /* Whether the REPL has line editing, history and completion (linked with readline). */
#ifdef CORRAL_USE_READLINE
    lua_pushboolean(L, 1);
#else
    lua_pushboolean(L, 0);
#endif
    lua_setfield(L, -2, "readline");
    return 1;
}

/* ---- main --------------------------------------------------------------------------- */

static int push_exit(lua_State *L, int code)
{
    lua_pushinteger(L, code);
    return 1;
}

/* `--version` ('v'), `--help` or `-h` ('h') alone on the line, else 0. lua.c has no long
 * options and no -h, so these spellings take nothing away from its command line. */
static int long_option(const char *a)
{
    if (strcmp(a, "--version") == 0) return 'v';
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 'h';
    return 0;
}

/* Runs protected; pushes the process exit status. */
static int pmain(lua_State *L)
{
    int argc = (int)lua_tointeger(L, 1);
    char **argv = lua_touserdata(L, 2);
    int script = 0;
    int args = collect_args(argv, &script);
    int wants = argc == 2 ? long_option(argv[1]) : 0;
    int failed = 0;

    luaL_checkversion(L);
    /* runc's command line (`--root DIR create …`), neither corral's nor lua.c's: the
     * whole line goes to corral.runtime.cli */
    if (corral_invoked_as_runtime(argv[0])) {
        luaL_openlibs(L);
        setup_host(L, argv[0]);
        lua_gc(L, LUA_GCRESTART);
        lua_gc(L, LUA_GCGEN, 0, 0);
        return push_exit(L, command_exit(run_module_main(L, "corral.runtime.cli", argc, argv)));
    }
    if ((args & ARGS_ERROR) && !wants) {
        print_usage(argv[script]);
        return push_exit(L, CORRAL_EXIT_USAGE); /* a usage error, as an unknown command's */
    }
    if ((args & ARGS_VERSION) || wants == 'v') print_version();
    if (wants == 'v') return push_exit(L, EXIT_SUCCESS);
    if (args & ARGS_NOENV) {
        /* Read by the package library: LUA_PATH and LUA_CPATH are ignored too. */
        lua_pushboolean(L, 1);
        lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
    }
    luaL_openlibs(L);
    setup_host(L, argv[0]);
    lua_gc(L, LUA_GCRESTART);
    lua_gc(L, LUA_GCGEN, 0, 0);

    if (wants == 'h') {
        char help_name[] = "help";
        char *help_argv[] = {argv[0], help_name, NULL};
        return push_exit(L, command_exit(run_command(L, 2, help_argv)));
    }

    if (script == 1 && argv[1][0] != '-' && is_command(L, argv[1], &failed)) {
        create_arg_table(L, argv, argc, 0);
        if (handle_luainit(L) != LUA_OK) return push_exit(L, command_exit(EXIT_FAILURE));
        return push_exit(L, command_exit(run_command(L, argc, argv)));
    }
    if (failed) return push_exit(L, command_exit(EXIT_FAILURE));

    create_arg_table(L, argv, argc, script);
    if (!(args & ARGS_NOENV) && handle_luainit(L) != LUA_OK) return push_exit(L, EXIT_FAILURE);
    if (!run_args(L, argv, script > 0 ? script : argc)) return push_exit(L, EXIT_FAILURE);
    if (script > 0 && handle_script(L, argv, script) != LUA_OK) return push_exit(L, EXIT_FAILURE);
    if (args & ARGS_INTERACTIVE) {
        corral_console_run(L);
    } else if (script == 0 && !(args & (ARGS_EXEC | ARGS_VERSION))) {
        if (isatty(STDIN_FILENO))
            corral_console_run(L);
        else if (dochunk(L, luaL_loadfile(L, NULL)) != LUA_OK)
            return push_exit(L, EXIT_FAILURE);
    }
    return push_exit(L, EXIT_SUCCESS);
}

#if defined(__SANITIZE_ADDRESS__)
/* `make asan`: LeakSanitizer stops the world through ptrace, which a confined process
 * (Landlock, no capabilities) cannot do: it reports a fatal error and spins at 100% CPU
 * inside a nested `exec-confined`. Leak checks stay off in that build. */

const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}
#endif

/* Whether an `exec-confined` line asks for its usage: `--help` or `-h` where an option
 * stands (each option takes one value), before `--`. The usage is cli.lua's, through
 * the Lua path; a directory named -h given as a value is still a value. */
static int confined_wants_help(int argc, char **argv)
{
    for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i += 2)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

/* The allocator lua_close runs under: every finalizer and to-be-closed variable still
 * runs (a cgroup's __gc removes it, a spawn's ends its process), and what they allocate is
 * real, but the blocks lua_close frees are left to the process's end, which comes right
 * after. Freeing the whole heap object by object was measured at ~0.3 ms of a
 * `corral run -- /bin/true`. */
static void *exit_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    (void)osize;
    if (nsize == 0) return NULL;
    return realloc(ptr, nsize);
}

/* The status main's lua_close ends the process with once every finalizer has run (set,
 * and `exit_armed`, just before it; an os.exit(status, true) closing the state leaves
 * the close its own). */
static int exit_code, exit_armed;

/* The finalizer of the first object the state marks for finalization, which lua_close
 * runs last (finalizers run in the reverse order of marking): every other finalizer and
 * to-be-closed variable has run by then. What lua_close has left is the heap's objects
 * one by one (unlinking each string, writing pages a fork made copy-on-write), which the
 * process's end releases at once: ~0.4 ms of a `corral run -- /bin/true` here. */
static int exit_after_finalizers(lua_State *L)
{
    (void)L;
    if (exit_armed) exit(exit_code);
    return 0;
}

static void mark_first_finalizer(lua_State *L)
{
    lua_newuserdatauv(L, 0, 0);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, exit_after_finalizers);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &exit_code);
}

int main(int argc, char **argv)
{
    lua_State *L;
    int status, code;

    corral_open_closed_std_fds();

    /* As corral-runtime, argv is runc's: its `exec` is an engine's, never corral's. */
    int fast = argc > 1 && !corral_invoked_as_runtime(argv[0]);
    /* On every confined launch: no Lua state, nothing loaded. */
    if (fast && strcmp(argv[1], "exec-confined") == 0 && !confined_wants_help(argc, argv))
        return corral_exec_confined_main(argc - 1, argv + 1);
    /* `corral confine --exec` that needs no Lua (core/host/confine_fast.h): the spec built
     * and the wrapper run here; anything else is declined to the Lua path below. */
    if (fast && strcmp(argv[1], "confine") == 0) {
        int handled = confine_fast_main(argc, argv, NULL);
        if (handled != CORRAL_CONFINE_FAST_DECLINE) return handled;
    }
    /* On every exec into a live sandbox: a client of its keeper, nothing loaded either;
     * inside `corral confine --broker`, the broker's client (lua/corral/broker/client.lua). */
    if (fast && strcmp(argv[1], "exec") == 0 &&
        !corral_session_exec_wants_help(argc - 1, argv + 1) && !corral_brokered())
        return corral_session_exec_main(argc - 1, argv + 1);

    L = luaL_newstate();
    if (L == NULL) {
        host_print_message(host_progname, "cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    lua_gc(L, LUA_GCSTOP);
    mark_first_finalizer(L);
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    status = lua_pcall(L, 2, 1, 0);
    code = status == LUA_OK ? (int)lua_tointeger(L, -1) : EXIT_FAILURE;
    host_report(L, status);
    lua_setallocf(L, exit_alloc, NULL);
    exit_code = code;
    exit_armed = 1;
    lua_close(L);
    return code;
}
