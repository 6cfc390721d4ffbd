/*
 * The control-plane confinement wrapper: `corral exec-confined …` builds the mount +
 * pid namespace layer and the Landlock layer, then execs the command. It runs in C,
 * before any Lua state exists, because it sits on every confined launch.
 */
#ifndef CORRAL_CONFINE_H
#define CORRAL_CONFINE_H

/* Exit statuses of the wrapper itself: CORRAL_EXIT_SETUP, _NOEXEC, _NOTFOUND (the
 * command's own status passes through). */
#include "exitcodes.h"

/* argv[0] is "exec-confined". Never returns on success of the exec path in the child;
 * returns the exit status to use for the wrapper process. */
int corral_exec_confined_main(int argc, char **argv);

#endif
