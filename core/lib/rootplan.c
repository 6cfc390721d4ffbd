/* The root plan's tables and boundary rules (see rootplan.h). */
#include <stdio.h>
#include <string.h>

#include "rootplan.h"
#include "util.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Generous on purpose: a profile that names too little kills every program as it starts
 * (exit 134), the control included. */
#define PROGRAM_PATHS "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"
static const char *const runtime_paths[] = {PROGRAM_PATHS, "/etc"};
static const char *const program_paths[] = {PROGRAM_PATHS};

_Static_assert(N(runtime_paths) <= CORRAL_ROOTPLAN_RUNTIME_MAX, "runtime set too long");

/* Data, not runtime, and never needed to start a program. The caller is usually root,
 * and root owns them, so dropping capabilities alone leaves /etc/shadow readable. The
 * namespace layer covers them; Landlock without it grants /etc entry by entry around
 * them. */
static const char *const masked_paths[] = {
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/krb5.keytab",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/.git", /* etckeeper: every past /etc/shadow */
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/wireguard",
    "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
    "/etc/NetworkManager/system-connections",
    "/etc/letsencrypt/archive",
    "/etc/letsencrypt/live",
    "/etc/kubernetes/pki",
    "/etc/mysql/debian.cnf",
    "/etc/default/cacerts",
};

/* A boundary here would confine nothing or make the runtime writable (as root,
 * `--permit /etc` would give a writable /etc). */
static const char *const system_paths[] = {"/proc", "/sys", "/dev", "/boot"};

/* Not all of /etc, for a grant that must leave its credential stores out entry by
 * entry (tier S1): what a dynamic program reads to start, and what it reads besides when
 * it uses the network. */
static const char *const startup_files[] = {
    "/etc/ld.so.cache",  "/etc/ld.so.conf",    "/etc/ld.so.conf.d",  "/etc/ld.so.preload",
    "/etc/localtime",    "/etc/nsswitch.conf", "/etc/passwd",        "/etc/group",
    "/etc/locale.alias", "/etc/locale.conf",   "/etc/default/locale"};
static const char *const network_files[] = {
    "/etc/resolv.conf", "/etc/hosts",     "/etc/host.conf", "/etc/gai.conf",
    "/etc/services",    "/etc/protocols", "/etc/ssl/certs", "/etc/ca-certificates.conf"};

/* The name-service files a tenant sandbox is given of its own, over the runtime's: with
 * the host's, a name its /etc/hosts lists (or a hosts: source of its nsswitch.conf)
 * would resolve without reaching the sandbox's own DNS responder; /etc/hostname would
 * tell it the host's name. Their text is lua/corral/name_files.lua's. */
static const char *const name_files[] = {"/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf",
                                         "/etc/host.conf", "/etc/hostname"};

#define DATA_DEVICES "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"
static const char *const device_paths[] = {DATA_DEVICES, "/dev/tty"};
static const char *const data_device_paths[] = {DATA_DEVICES};

/* Capped like a tenant's /tmp: inodes too, 256 per MiB, since empty files take no blocks
 * (mount.c). 1 GiB each: a tmpfs takes memory only for what is written. */
#define SCRATCH_CAP "size=1024m,nr_inodes=262144"
static const struct corral_tmpfs scratch[] = {
    {"/tmp", "mode=1777," SCRATCH_CAP},
    {"/var/tmp", "mode=1777," SCRATCH_CAP},
    {"/run", "mode=0755,size=64m,nr_inodes=16384"},
};

const struct corral_tmpfs *corral_rootplan_scratch(size_t *n)
{
    *n = N(scratch);
    return scratch;
}

const char *corral_rootplan_home_options(void)
{
    return "mode=0700," SCRATCH_CAP;
}

/* Each list's accessor: the table and, through n, its length. */
#define LIST_ACCESSOR(name, table)                                                                 \
    const char *const *name(size_t *n)                                                             \
    {                                                                                              \
        *n = N(table);                                                                             \
        return table;                                                                              \
    }

LIST_ACCESSOR(corral_rootplan_runtime, runtime_paths)
LIST_ACCESSOR(corral_rootplan_programs, program_paths)
LIST_ACCESSOR(corral_rootplan_startup_files, startup_files)
LIST_ACCESSOR(corral_rootplan_network_files, network_files)
LIST_ACCESSOR(corral_rootplan_name_files, name_files)
LIST_ACCESSOR(corral_rootplan_masked, masked_paths)
LIST_ACCESSOR(corral_rootplan_system, system_paths)
LIST_ACCESSOR(corral_rootplan_devices, device_paths)
LIST_ACCESSOR(corral_rootplan_data_devices, data_device_paths)

/* The entry of paths that resolved lies beneath (or is), or NULL. */
static const char *beneath_any(const char *resolved, const char *const *paths, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (corral_is_beneath(resolved, paths[i])) return paths[i];
    return NULL;
}

/* SYSTEM or RUNTIME (with the runtime entry in *inside) for a path beneath one, else OK. */
static enum corral_boundary system_or_runtime(const char *resolved, const char **inside)
{
    if (beneath_any(resolved, system_paths, N(system_paths))) return CORRAL_BOUNDARY_SYSTEM;
    *inside = beneath_any(resolved, runtime_paths, N(runtime_paths));
    return *inside ? CORRAL_BOUNDARY_RUNTIME : CORRAL_BOUNDARY_OK;
}

enum corral_boundary corral_rootplan_check_boundary(const char *resolved, char *why, size_t len)
{
    const char *inside = NULL;
    enum corral_boundary b =
        strcmp(resolved, "/") == 0 ? CORRAL_BOUNDARY_ROOT : system_or_runtime(resolved, &inside);
    if (b && why && len) {
        if (b == CORRAL_BOUNDARY_RUNTIME)
            snprintf(why, len, "is inside the runtime read set (%s), which stays read-only",
                     inside);
        else
            snprintf(why, len, "would confine nothing");
    }
    return b;
}

enum corral_boundary corral_rootplan_check_file(const char *resolved, char *why, size_t len)
{
    const char *inside = NULL;
    enum corral_boundary b = beneath_any(resolved, masked_paths, N(masked_paths))
                                 ? CORRAL_BOUNDARY_MASKED
                                 : system_or_runtime(resolved, &inside);
    if (b && why && len) {
        if (b == CORRAL_BOUNDARY_MASKED)
            snprintf(why, len, "is a credential store, which a confined process never reads");
        else if (b == CORRAL_BOUNDARY_RUNTIME)
            snprintf(why, len, "is inside the runtime read set (%s), which shows it already",
                     inside);
        else
            snprintf(why, len, "is on the kernel's or the devices' filesystems");
    }
    return b;
}

const char *corral_boundary_name(enum corral_boundary b)
{
    switch (b) {
    case CORRAL_BOUNDARY_OK:
        return "ok";
    case CORRAL_BOUNDARY_ROOT:
        return "root";
    case CORRAL_BOUNDARY_SYSTEM:
        return "system";
    case CORRAL_BOUNDARY_RUNTIME:
        return "runtime";
    case CORRAL_BOUNDARY_MASKED:
        return "masked";
    }
    return "unknown";
}
