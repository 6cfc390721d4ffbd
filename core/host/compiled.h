/*
 * Compiled twins of the Lua modules: `make` dumps each module's bytecode (with its debug
 * information, under the source's own chunk name) so that the host loads what a run
 * needs without compiling it on every start.
 */
#ifndef CORRAL_HOST_COMPILED_H
#define CORRAL_HOST_COMPILED_H

#include <lua.h>

/* Uses the twins in `dir` (one file `<module name>.luac` each) when it exists: inserts a
 * searcher before the Lua file searcher. A twin is taken only when it names, on its first
 * line, the source package.path finds for the module (a tree moved after the build does
 * not match) and is at least as new as it, so an edited source wins until the next
 * build; a twin that does not load (another Lua build) falls back to the source. */
void corral_host_use_compiled(lua_State *L, const char *dir);

#endif
