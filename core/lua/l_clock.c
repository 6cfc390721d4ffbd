/* core.clock.monotime() -> seconds (CLOCK_MONOTONIC): deadlines clock jumps cannot move. */
#include <time.h>

#include "lcorral.h"

static int l_monotime(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

int corral_open_clock(lua_State *L)
{
    lua_pushcfunction(L, l_monotime);
    lua_setfield(L, -2, "monotime");
    return 0;
}
