/*
 * core.seccomp.install_tenant(): builds the tenant filter and installs it on the calling
 * process (irreversibly; useful in a child, e.g. a test's subprocess).
 * core.seccomp.tenant_program(): the exported classic-BPF program as a byte string, so
 * that Lua can commit to the exact policy (a tier's SHA-256 seal).
 */
#include <string.h>

#include "lcorral.h"
#include "seccomp.h"

static int l_install_tenant(lua_State *L)
{
    struct corral_bpf prog;
    int rc = corral_seccomp_tenant_program(&prog);
    if (rc == 0) rc = corral_seccomp_install(&prog);
    corral_bpf_free(&prog);
    if (rc < 0) return corral_pushfail(L, "seccomp", rc);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_tenant_program(lua_State *L)
{
    /* The buffer is reserved before the program exists: a memory error raised by Lua
     * can then never leak the malloc'd instructions. */
    luaL_Buffer b;
    char *dst = luaL_buffinitsize(L, &b, BPF_MAXINSNS * sizeof(struct sock_filter));
    struct corral_bpf prog;
    int rc = corral_seccomp_tenant_program(&prog);
    if (rc < 0) return corral_pushfail(L, "seccomp", rc);
    size_t n = prog.len * sizeof prog.insns[0];
    memcpy(dst, prog.insns, n);
    corral_bpf_free(&prog);
    luaL_pushresultsize(&b, n);
    return 1;
}

int corral_open_seccomp(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"install_tenant", l_install_tenant}, {"tenant_program", l_tenant_program}, {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_setfield(L, -2, "seccomp");
    return 0;
}
