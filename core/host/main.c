/*
 * The `corral` executable: Lua 5.4's standalone interpreter contract (options -e -l -i -v
 * -E -W -- -, the `arg` table, LUA_INIT, errors with a traceback) with the core linked in
 * and preloaded as "corral.core", plus these additions: the `exec-confined` fast path
 * (its `--help` is cli.lua's), subcommands from lua/corral/cli.lua (an unknown one is an
 * error there, unless a file of that name exists), `--version`, `--help` and `-h` alone
 * on the line, and a REPL with history, whose results print and whose Tab completes
 * through lua/corral/repl.lua (`corral.host.repl()` opens it from Lua, as `corral attach`
 * does).
 *
 * The command line is kept identical to lua5.4's so that `busted --lua=build/corral` can
 * re-exec the host as `build/corral /usr/bin/busted args…` (the sanitizer build runs the
 * whole suite that way).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#ifdef CORRAL_USE_READLINE
#include <readline/readline.h>
#include <readline/history.h>
#endif

#include "compiled.h"
#include "confine.h"
#include "exitcodes.h"

#define CORRAL_VERSION "0.1"
#define CORRAL_PROGNAME "corral"
#define CORRAL_PROMPT "corral> "
#define CORRAL_PROMPT2 "corral>> "
#define CORRAL_HISTORY_LINES 1000
#define LUA_VERSION_DIR LUA_VERSION_MAJOR "." LUA_VERSION_MINOR
#define LUA_INIT_VAR "LUA_INIT"
#define LUA_INIT_VERSIONED LUA_INIT_VAR "_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR
/* loadlib.c's LUA_IGMARK: `-l mod-suffix` requires "mod-suffix" into global "mod". */
#define IGNORE_MARK '-'
/* The syntax error of a chunk that merely stops early ends with this mark (lua.c). */
#define EOF_MARK "<eof>"
/* Registry key of the loaded corral.repl module while a REPL runs. */
#define REPL_MODULE "corral.repl"
/* Candidates offered for one Tab, at most. */
#define COMPLETIONS_MAX 256

int luaopen_corral_core(lua_State *L);
static int open_host(lua_State *L);

enum {
    ARGS_ERROR = 1 << 0,
    ARGS_INTERACTIVE = 1 << 1, /* -i */
    ARGS_VERSION = 1 << 2,     /* -v */
    ARGS_EXEC = 1 << 3,        /* -e */
    ARGS_NOENV = 1 << 4,       /* -E */
};

/* Reading results besides a Lua status. */
enum { INPUT_EOF = -1, INPUT_INTERRUPTED = -2 };

static const char *progname = CORRAL_PROGNAME;
static lua_State *signal_L;
static volatile sig_atomic_t input_interrupted;
static char *history_path;

static void print_message(const char *prefix, const char *msg)
{
    if (prefix != NULL) fprintf(stderr, "%s: ", prefix);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
}

static int report(lua_State *L, int status)
{
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        print_message(progname, msg != NULL ? msg : "(error object is not a string)");
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
        fprintf(stderr, "%s: '%s' needs argument\n", progname, bad);
    else if (close)
        fprintf(stderr, "%s: unrecognized option '%s'; did you mean '%s'?\n", progname, bad, close);
    else
        fprintf(stderr, "%s: unrecognized option '%s'\n", progname, bad);
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

/* Runs inside the interrupted chunk, where raising is safe; the signal handler is not. */
static void interrupt_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

/* SA_RESETHAND makes a second Ctrl-C kill the process, as in lua.c, if the chunk never
 * reaches the hook (a C function blocked forever). */
static void on_sigint_running(int sig)
{
    (void)sig;
    lua_sethook(signal_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static void on_sigint_reading(int sig)
{
    (void)sig;
    input_interrupted = 1;
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
static int docall(lua_State *L, int narg, int nres)
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
    if (status == LUA_OK) status = docall(L, 0, 0);
    return report(L, status);
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
    status = docall(L, 1, 1);
    if (status == LUA_OK)
        lua_setglobal(L, lua_tostring(L, -2));
    else
        report(L, status);
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
        status = docall(L, n, LUA_MULTRET);
    }
    return report(L, status);
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
    status = docall(L, 1, 1);
    if (status == LUA_OK) {
        lua_getfield(L, -1, "is_command");
        lua_pushstring(L, name);
        status = docall(L, 1, 1);
        lua_remove(L, -2);
    }
    if (status != LUA_OK) {
        if (access(name, F_OK) == 0) {
            lua_pop(L, 1);
            return 0;
        }
        report(L, status);
        *failed = 1;
        return 0;
    }
    yes = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return yes || access(name, F_OK) != 0;
}

/* require("corral.cli").main({argv[1], …}); returns the process exit status. */
static int run_command(lua_State *L, int argc, char **argv)
{
    int status;

    lua_getglobal(L, "require");
    lua_pushliteral(L, "corral.cli");
    status = docall(L, 1, 1);
    if (status != LUA_OK) return report(L, status), EXIT_FAILURE;
    lua_getfield(L, -1, "main");
    lua_remove(L, -2);
    lua_createtable(L, argc - 1, 0);
    for (int i = 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    status = docall(L, 1, 1);
    if (status != LUA_OK) return report(L, status), EXIT_FAILURE;
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
    print_message(progname,
                  lua_pushfstring(L, "corral.cli.main returned a %s value", luaL_typename(L, -1)));
    lua_pop(L, 2);
    return EXIT_FAILURE;
}

/* ---- REPL ------------------------------------------------------------------------- */

/* Pushes field `name` of the REPL module (corral.repl), or nil when it did not load. */
static int repl_field(lua_State *L, const char *name)
{
    if (lua_getfield(L, LUA_REGISTRYINDEX, REPL_MODULE) != LUA_TTABLE) return lua_type(L, -1);
    lua_getfield(L, -1, name);
    lua_remove(L, -2);
    return lua_type(L, -1);
}

static void history_open(void)
{
    const char *env = getenv("CORRAL_HISTORY");
    const char *home = getenv("HOME");

    if (env != NULL) {
        if (env[0] == '\0') return;
        history_path = strdup(env);
    } else if (home != NULL && home[0] != '\0') {
        size_t n = strlen(home) + sizeof "/.corral_history";
        history_path = malloc(n);
        if (history_path != NULL) snprintf(history_path, n, "%s/.corral_history", home);
    }
#ifdef CORRAL_USE_READLINE
    if (history_path != NULL) {
        /* append_history does not create the file; failures only cost the history. */
        int fd = open(history_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
        read_history(history_path);
        history_truncate_file(history_path, CORRAL_HISTORY_LINES);
    }
#endif
}

static void history_save(const char *line)
{
    if (line[0] == '\0') return;
#ifdef CORRAL_USE_READLINE
    add_history(line);
    /* One entry at a time, so a session that ends in os.exit keeps its lines. */
    if (history_path != NULL) append_history(1, history_path);
#endif
}

#ifdef CORRAL_USE_READLINE
static int use_readline;
static char *rl_line;
static int rl_line_done;

static void on_readline_line(char *line)
{
    rl_line = line;
    rl_line_done = 1;
    rl_callback_handler_remove();
}

/*
 * readline's callback interface around pselect, so that a Ctrl-C at the prompt wakes the
 * wait (SIGINT is blocked except inside pselect, so it cannot slip in between the check
 * and the wait) and the line is dropped with readline's state cleaned up. Blocking
 * readline() would restart its read after our handler ran. Shown by tests/host_spec.lua
 * ("Ctrl-C at the prompt discards the pending input").
 */
static int readline_read(const char *prompt, char **line)
{
    sigset_t block, orig;
    int fd = fileno(rl_instream != NULL ? rl_instream : stdin);
    int result = 1;

    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &orig);
    input_interrupted = 0;
    rl_line = NULL;
    rl_line_done = 0;
    rl_callback_handler_install(prompt, on_readline_line);
    while (!rl_line_done) {
        fd_set in;
        FD_ZERO(&in);
        FD_SET(fd, &in);
        if (pselect(fd + 1, &in, NULL, NULL, NULL, &orig) < 0) {
            if (errno == EINTR && !input_interrupted) continue;
            if (errno == EINTR) {
                rl_free_line_state();
                rl_callback_sigcleanup();
                result = INPUT_INTERRUPTED;
            } else {
                result = INPUT_EOF;
            }
            rl_callback_handler_remove();
            fputc('\n', stdout);
            fflush(stdout);
            break;
        }
        rl_callback_read_char();
    }
    sigprocmask(SIG_SETMASK, &orig, NULL);
    if (result == 1 && rl_line == NULL) result = INPUT_EOF;
    if (result == 1) *line = rl_line;
    return result;
}

static lua_State *completion_L;
static char *completion_list[COMPLETIONS_MAX + 1];
static int completion_next;

/* Runs protected: the candidates corral.repl.complete(text) returns, copied into
 * completion_list (malloc'ed, NULL-terminated). */
static int collect_completions(lua_State *L)
{
    const char *text = lua_touserdata(L, 1);
    int n = 0;
    if (repl_field(L, "complete") != LUA_TFUNCTION) return 0;
    lua_pushstring(L, text);
    lua_call(L, 1, 1);
    if (!lua_istable(L, -1)) return 0;
    for (lua_Integer i = 1; n < COMPLETIONS_MAX; i++) {
        if (lua_geti(L, -1, i) != LUA_TSTRING) break;
        char *copy = strdup(lua_tostring(L, -1));
        lua_pop(L, 1);
        if (copy == NULL) break;
        completion_list[n++] = copy;
    }
    return 0;
}

static char *completion_generator(const char *text, int state)
{
    (void)text;
    if (state == 0) completion_next = 0;
    if (completion_list[completion_next] == NULL) return NULL;
    char *match = completion_list[completion_next];
    completion_list[completion_next++] = NULL; /* readline frees what it is given */
    return match;
}

/* Names and fields from the Lua state; a word that looks like a path (a '/', or a
 * leading '.' or '~') is left to readline's file-name completion. A Lua error only
 * means no candidates: it must never unwind through readline. */
static char **complete(const char *text, int start, int end)
{
    (void)start;
    (void)end;
    rl_attempted_completion_over = 0;
    if (strchr(text, '/') != NULL || text[0] == '.' || text[0] == '~') return NULL;
    for (int i = 0; completion_list[i] != NULL; i++) {
        free(completion_list[i]);
        completion_list[i] = NULL;
    }
    lua_State *L = completion_L;
    int top = lua_gettop(L);
    lua_pushcfunction(L, collect_completions);
    lua_pushlightuserdata(L, (void *)text);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) lua_pop(L, 1);
    lua_settop(L, top);
    rl_attempted_completion_over = 1; /* a Lua word: no file names mixed in */
    return rl_completion_matches(text, completion_generator);
}
#endif

static int plain_read(const char *prompt, char **line)
{
    size_t cap = 0;
    ssize_t n;

    input_interrupted = 0;
    fputs(prompt, stdout);
    fflush(stdout);
    *line = NULL;
    n = getline(line, &cap, stdin);
    if (n >= 0) return 1;
    free(*line);
    *line = NULL;
    if (errno == EINTR && input_interrupted) {
        clearerr(stdin);
        fputc('\n', stdout);
        fflush(stdout);
        return INPUT_INTERRUPTED;
    }
    return INPUT_EOF;
}

/* One line, malloc'ed, without its newline: 1, INPUT_EOF or INPUT_INTERRUPTED. */
static int read_line(lua_State *L, int firstline, char **line)
{
    const char *prompt;
    int r;
    size_t n;

    lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2");
    prompt = lua_tostring(L, -1);
    if (prompt == NULL) prompt = firstline ? CORRAL_PROMPT : CORRAL_PROMPT2;
#ifdef CORRAL_USE_READLINE
    if (use_readline)
        r = readline_read(prompt, line);
    else
#endif
        r = plain_read(prompt, line);
    lua_pop(L, 1);
    if (r == 1) {
        n = strlen(*line);
        if (n > 0 && (*line)[n - 1] == '\n') (*line)[n - 1] = '\0';
    }
    return r;
}

static int incomplete(lua_State *L, int status)
{
    if (status == LUA_ERRSYNTAX) {
        size_t len;
        const char *msg = lua_tolstring(L, -1, &len);
        size_t marklen = sizeof EOF_MARK - 1;
        if (len >= marklen && strcmp(msg + len - marklen, EOF_MARK) == 0) {
            lua_pop(L, 1);
            return 1;
        }
    }
    return 0;
}

/*
 * Reads one chunk into a function on an otherwise empty stack (or an error message):
 * first as `return <line>;` so expressions print, then as statements, reading more
 * lines while the only error is an early <eof>.
 */
static int load_input(lua_State *L)
{
    char *line;
    const char *retline;
    int r, status;

    lua_settop(L, 0);
    r = read_line(L, 1, &line);
    if (r != 1) return r;
    lua_pushstring(L, line);
    retline = lua_pushfstring(L, "return %s;", line);
    free(line);
    if (luaL_loadbuffer(L, retline, strlen(retline), "=stdin") == LUA_OK) {
        history_save(lua_tostring(L, 1));
        lua_remove(L, 2);
        lua_remove(L, 1);
        return LUA_OK;
    }
    lua_settop(L, 1);
    for (;;) {
        size_t len;
        const char *src = lua_tolstring(L, 1, &len);
        status = luaL_loadbuffer(L, src, len, "=stdin");
        if (!incomplete(L, status)) break;
        r = read_line(L, 0, &line);
        if (r == INPUT_INTERRUPTED) return r;
        if (r == INPUT_EOF) {
            /* Report why the unfinished chunk cannot run; the next read sees the EOF. */
            status = luaL_loadbuffer(L, src, len, "=stdin");
            break;
        }
        lua_pushliteral(L, "\n");
        lua_pushstring(L, line);
        free(line);
        lua_concat(L, 3);
    }
    history_save(lua_tostring(L, 1));
    lua_remove(L, 1);
    return status;
}

/* Results go through corral.repl.print (tables shown as tables), or the global print
 * when that module is not there. */
static void print_results(lua_State *L)
{
    int n = lua_gettop(L);
    if (n > 0) {
        luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
        if (repl_field(L, "print") != LUA_TFUNCTION) {
            lua_pop(L, 1);
            lua_getglobal(L, "print");
        }
        lua_insert(L, 1);
        if (lua_pcall(L, n, 0, 0) != LUA_OK)
            print_message(progname,
                          lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
    }
}

/* Binds global `name` = require(module); a failure is one warning line, not fatal. */
static void require_global(lua_State *L, const char *name, const char *module)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    if (docall(L, 1, 1) == LUA_OK) {
        lua_setglobal(L, name);
        return;
    }
    const char *msg = lua_tostring(L, -1);
    size_t firstline = msg != NULL ? strcspn(msg, "\n") : 0;
    fprintf(stderr, "corral: warning: require \"%s\" failed: %.*s\n", module, (int)firstline,
            msg != NULL ? msg : "");
    fflush(stderr);
    lua_pop(L, 1);
}

static void repl(lua_State *L)
{
    const char *saved_progname = progname;
    struct sigaction sa, old;
    int status;

    progname = NULL;
#ifdef CORRAL_USE_READLINE
    use_readline = isatty(STDIN_FILENO);
    if (use_readline) {
        rl_readline_name = CORRAL_PROGNAME;
        /* Ctrl-C is ours: readline_read decides what it means at the prompt. */
        rl_catch_signals = 0;
        using_history();
        stifle_history(CORRAL_HISTORY_LINES);
        completion_L = L;
        rl_attempted_completion_function = complete;
        /* `corral.sand` and `t.k` are one word; '.' and ':' stay inside it. */
        rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,[]+*%^#";
        rl_completion_append_character = '\0';
    }
#endif
    history_open();

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint_reading;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);

    fputs(CORRAL_PROGNAME " " CORRAL_VERSION " — " LUA_VERSION "; `corral` and `core` are loaded\n",
          stdout);
    fflush(stdout);
    require_global(L, "corral", "corral");
    require_global(L, "core", "corral.core");
    require_global(L, "conformance", "corral.conformance"); /* conformance("native") */
    /* help(), sandboxes(), why(…), step{…} … as globals, and the printer and completer
     * above. */
    lua_getglobal(L, "require");
    lua_pushliteral(L, REPL_MODULE);
    if (docall(L, 1, 1) != LUA_OK) {
        report(L, LUA_ERRRUN);
    } else if (lua_istable(L, -1)) {
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
        if (lua_getfield(L, -1, "install") == LUA_TFUNCTION && docall(L, 0, 0) != LUA_OK)
            report(L, LUA_ERRRUN);
    }
    lua_settop(L, 0);

    while ((status = load_input(L)) != INPUT_EOF) {
        if (status == INPUT_INTERRUPTED) continue;
        if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
        if (status == LUA_OK)
            print_results(L);
        else
            report(L, status);
    }
    lua_settop(L, 0);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
    sigaction(SIGINT, &old, NULL);
    free(history_path);
    history_path = NULL;
    progname = saved_progname;
}

/* corral.host.repl(): the REPL, from Lua (`corral attach` opens it once it has chosen
 * the sandbox). Returns when the user ends it (EOF); os.exit ends the process. */
static int l_host_repl(lua_State *L)
{
    lua_settop(L, 0);
    repl(L);
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
        return push_exit(L, run_command(L, 2, help_argv));
    }

    if (script == 1 && argv[1][0] != '-' && is_command(L, argv[1], &failed)) {
        create_arg_table(L, argv, argc, 0);
        if (handle_luainit(L) != LUA_OK) return push_exit(L, EXIT_FAILURE);
        return push_exit(L, run_command(L, argc, argv));
    }
    if (failed) return push_exit(L, EXIT_FAILURE);

    create_arg_table(L, argv, argc, script);
    if (!(args & ARGS_NOENV) && handle_luainit(L) != LUA_OK) return push_exit(L, EXIT_FAILURE);
    if (!run_args(L, argv, script > 0 ? script : argc)) return push_exit(L, EXIT_FAILURE);
    if (script > 0 && handle_script(L, argv, script) != LUA_OK) return push_exit(L, EXIT_FAILURE);
    if (args & ARGS_INTERACTIVE) {
        repl(L);
    } else if (script == 0 && !(args & (ARGS_EXEC | ARGS_VERSION))) {
        if (isatty(STDIN_FILENO))
            repl(L);
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

/* A standard fd the caller closed (`corral run -- cat <&-`) would be the next fd corral
 * opens (its signalfd became the engine client's stdin, which then hung): each closed
 * one is opened on /dev/null first, the lowest free fd being that one. */
static void open_closed_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd) return;
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

int main(int argc, char **argv)
{
    lua_State *L;
    int status, code;

    open_closed_std_fds();

    /* On every confined launch: no Lua state, nothing loaded. */
    if (argc > 1 && strcmp(argv[1], "exec-confined") == 0 && !confined_wants_help(argc, argv))
        return corral_exec_confined_main(argc - 1, argv + 1);

    L = luaL_newstate();
    if (L == NULL) {
        print_message(progname, "cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    lua_gc(L, LUA_GCSTOP);
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    status = lua_pcall(L, 2, 1, 0);
    code = status == LUA_OK ? (int)lua_tointeger(L, -1) : EXIT_FAILURE;
    report(L, status);
    lua_setallocf(L, exit_alloc, NULL);
    lua_close(L);
    return code;
}
