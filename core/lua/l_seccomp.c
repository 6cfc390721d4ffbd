/*
 * core.seccomp.install_tenant(): builds the tenant filter and installs it on the calling
 * process (irreversibly; useful in a child, e.g. a test's subprocess).
 * core.seccomp.tenant_program(): the exported classic-BPF program as a byte string, so
 * that Lua can commit to the exact policy (a tier's SHA-256 seal).
 */
#include <string.h>

#include "lcorral.h"
#include "seccomp.h"
#include "seccomp_tables.h" /* generated */

/* Both use the tenant program as built at build time (core/gen/seccomp_tables.c),
 * which tests/c/test_seccomp.c keeps equal to what libseccomp builds now. */
static const struct corral_bpf tenant = {(struct sock_filter *)corral_tenant_filter,
                                         sizeof corral_tenant_filter /
                                             sizeof corral_tenant_filter[0]};

static int l_install_tenant(lua_State *L)
{
    int rc = corral_seccomp_install(&tenant);
    return corral_result(L, rc, "seccomp");
}

static int l_tenant_program(lua_State *L)
{
    lua_pushlstring(L, (const char *)corral_tenant_filter, sizeof corral_tenant_filter);
    return 1;
}

int corral_open_seccomp(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"install_tenant", l_install_tenant}, {"tenant_program", l_tenant_program}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
