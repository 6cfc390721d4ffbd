/*
 * The host's REPL (console.c) and what it borrows from the interpreter (main.c): the
 * protected call with Ctrl-C armed and the error report, shared so that a chunk typed at
 * the prompt runs exactly as one given with -e.
 */
#ifndef CORRAL_CONSOLE_H
#define CORRAL_CONSOLE_H

#include <lua.h>

#define CORRAL_PROGNAME "corral"
#define CORRAL_VERSION "0.1"

/* The prefix of error messages: the program's name, NULL inside the REPL (as lua.c). */
extern const char *host_progname;

/* Calls the function below narg arguments with a traceback handler and Ctrl-C armed. */
int host_docall(lua_State *L, int narg, int nres);
/* Prints the error on top of the stack (and pops it) unless status is LUA_OK. */
int host_report(lua_State *L, int status);
void host_print_message(const char *prefix, const char *msg);

/* Runs the REPL on L until end of input; os.exit ends the process as usual. */
void corral_console_run(lua_State *L);

#endif
