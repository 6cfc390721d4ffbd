/*
 * `corral exec ID [--env NAME|NAME=VALUE]... [--cwd DIR] [-t|--tty] -- CMD ARGS...`: a
 * command run inside a live sandbox by its keeper (`corral create ID`), as a client of
 * the sandbox's session socket. It runs in C, before any Lua state exists, because it
 * sits on every exec into a warm sandbox; the keeper applies every policy, the client
 * only passes the request, its stdin/stdout/stderr (or a terminal), signals, and the
 * command's status back.
 */
#ifndef CORRAL_SESSION_EXEC_H
#define CORRAL_SESSION_EXEC_H

/* argv[0] is "exec". Whether -h or --help stands where an option does, before the
 * command: the usage is then cli.lua's, through the Lua path. */
int corral_session_exec_wants_help(int argc, char **argv);

/* argv[0] is "exec". Returns the exit status: the command's (128+S when signal S ended
 * it), a refusal's (2 bad argument, 125, 126, 127), 2 when no live keeper answers. */
int corral_session_exec_main(int argc, char **argv);

#endif
