/*
 * The fast path of `corral confine --exec`: the launch spec built in C, before any Lua
 * state exists, for a line that needs nothing but its flags and the probe cache, then
 * the wrapper run in this process (core/host/confine.c). Anything it does not cover
 * (another flag, no valid probe cache, a layer the cache does not show holding, a path
 * Lua would refuse or warn about) is declined, and the Lua path runs as it always does:
 * it reports what cannot be enforced (fail closed).
 *
 * The spec is exactly lua/corral/confinement.lua's: the same wrapper arguments (the
 * repository read-only defaults of lua/corral/confinement/protected.lua included), the
 * same working directory and environment. Its tables are generated from those modules
 * (core/gen/confine_fast_tables.lua); tests/confine_fast_spec.lua compares the two specs.
 */
#ifndef CORRAL_CONFINE_FAST_H
#define CORRAL_CONFINE_FAST_H

/* What confine_fast_main returns when it leaves the line to the Lua path. */
#define CORRAL_CONFINE_FAST_DECLINE (-1)

/* The variable that, set to "spec", makes the fast path print the spec it built as JSON
 * (as `corral confine --json` prints Lua's) instead of running it, and say why when it
 * declines (exit CORRAL_CONFINE_FAST_DECLINED_EXIT); set to "run", say on stderr that it
 * runs the line ("corral confine: fast path"). For tests and diagnosis. */
#define CORRAL_CONFINE_FAST_DEBUG "CORRAL_CONFINE_FAST_DEBUG"
#define CORRAL_CONFINE_FAST_DECLINED_EXIT 99

/* argv is the host's: argv[1] is "confine". host: the Lua host's path, whose probe cache
 * and wrapper the line would use (the front names corral-host beside it); NULL when this
 * executable is the host. Returns CORRAL_CONFINE_FAST_DECLINE, or (debug only) an exit
 * status; once the wrapper starts the process exits with its status and this never
 * returns. */
int confine_fast_main(int argc, char **argv, const char *host);

#endif
