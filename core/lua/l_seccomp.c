/* placeholder: replaced by the real binding */
#include "lcorral.h"
int corral_open_seccomp(lua_State *L)
{
    (void)L;
    return 0;
}
