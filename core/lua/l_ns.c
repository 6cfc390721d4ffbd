/* placeholder: replaced by the real binding */
#include "lcorral.h"
int corral_open_ns(lua_State *L)
{
    (void)L;
    return 0;
}
