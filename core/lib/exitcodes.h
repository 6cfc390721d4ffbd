/*
 * The exit statuses corral gives of its own, in one place: the C wrapper and spawn
 * child use these macros, the Lua side reads them as core.exit.<NAME>. Any other status
 * is the command's own (128+N when signal N ended it).
 *
 *   name            code  meaning
 *   USAGE              2  bad arguments or an invalid request (`corral …`)
 *   CANNOT             3  a protection asked for cannot be enforced on this host
 *   START_REFUSED    120  `corral run`, `create`, `exec`: the sandbox (or the command in it)
 *                         could not start
 *   MEMORY           121  `corral run`: the memory cap ended the sandbox
 *   TEARDOWN         122  `corral run`: the mechanism's destroy failed (said on stderr);
 *                         something of the sandbox may be left behind
 *   WALL             124  `corral run`: the --wall limit ended the sandbox
 *   SETUP            125  a confinement layer could not be built, or the front found no
 *                         host to hand over to: nothing was executed
 *   NOEXEC           126  the command exists but could not be executed (as a shell says)
 *   NOTFOUND         127  the command was not found (as a shell says); also a spawn
 *                         child whose setup failed before exec
 */
#ifndef CORRAL_EXITCODES_H
#define CORRAL_EXITCODES_H

#define CORRAL_EXIT_CODES(X)                                                                       \
    X(USAGE, 2)                                                                                    \
    X(CANNOT, 3)                                                                                   \
    X(START_REFUSED, 120)                                                                          \
    X(MEMORY, 121)                                                                                 \
    X(TEARDOWN, 122)                                                                               \
    X(WALL, 124)                                                                                   \
    X(SETUP, 125)                                                                                  \
    X(NOEXEC, 126)                                                                                 \
    X(NOTFOUND, 127)

#define CORRAL_EXIT_DEFINE(name, code) CORRAL_EXIT_##name = code,
enum corral_exit { CORRAL_EXIT_CODES(CORRAL_EXIT_DEFINE) };
#undef CORRAL_EXIT_DEFINE

#endif
