/*
 * The REPL: lines read with readline's history and Tab completion where the host was
 * built with it (plain getline otherwise), each run first as an expression so that its
 * results print, then as statements, reading more lines while a chunk is unfinished.
 * Results print and names complete through lua/corral/repl.lua. Ctrl-C at the prompt
 * drops the pending input; while a chunk runs, it interrupts the chunk (main.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

#ifdef CORRAL_USE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "console.h"

#define CORRAL_PROMPT "corral> "
#define CORRAL_PROMPT2 "corral>> "
#define CORRAL_HISTORY_LINES 1000
/* The syntax error of a chunk that merely stops early ends with this mark (lua.c). */
#define EOF_MARK "<eof>"
/* Registry key of the loaded corral.repl module while a REPL runs. */
#define REPL_MODULE "corral.repl"
/* Candidates offered for one Tab, at most. */
#define COMPLETIONS_MAX 256

/* Reading results besides a Lua status. */
enum { INPUT_EOF = -1, INPUT_INTERRUPTED = -2 };

static volatile sig_atomic_t input_interrupted;
static char *history_path;

static void on_sigint_reading(int sig)
{
    (void)sig;
    input_interrupted = 1;
}

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
            host_print_message(host_progname, lua_pushfstring(L, "error calling 'print' (%s)",
                                                              lua_tostring(L, -1)));
    }
}

/* Binds global `name` = require(module); a failure is one warning line, not fatal. */
static void require_global(lua_State *L, const char *name, const char *module)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    if (host_docall(L, 1, 1) == LUA_OK) {
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

void corral_console_run(lua_State *L)
{
    const char *saved_progname = host_progname;
    struct sigaction sa, old;
    int status;

    host_progname = NULL;
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
    if (host_docall(L, 1, 1) != LUA_OK) {
        host_report(L, LUA_ERRRUN);
    } else if (lua_istable(L, -1)) {
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
        if (lua_getfield(L, -1, "install") == LUA_TFUNCTION && host_docall(L, 0, 0) != LUA_OK)
            host_report(L, LUA_ERRRUN);
    }
    lua_settop(L, 0);

    while ((status = load_input(L)) != INPUT_EOF) {
        if (status == INPUT_INTERRUPTED) continue;
        if (status == LUA_OK) status = host_docall(L, 0, LUA_MULTRET);
        if (status == LUA_OK)
            print_results(L);
        else
            host_report(L, status);
    }
    lua_settop(L, 0);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REPL_MODULE);
    sigaction(SIGINT, &old, NULL);
    free(history_path);
    history_path = NULL;
    host_progname = saved_progname;
}
