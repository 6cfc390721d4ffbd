/*
 * core/lib/rootplan.c: the boundary rules (the one set exec-confined, confinement.lua
 * and sbpl.lua apply) and the tables they read.
 */
#include <string.h>

#include "check.h"
#include "rootplan.h"

static int in_list(const char *const *list, size_t n, const char *want)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], want) == 0) return 1;
    return 0;
}

static void test_tables(void)
{
    size_t n;
    const char *const *runtime = corral_rootplan_runtime(&n);
    CHECK(n > 0 && n <= CORRAL_ROOTPLAN_RUNTIME_MAX);
    CHECK(in_list(runtime, n, "/usr") && in_list(runtime, n, "/etc"));
    CHECK(!in_list(runtime, n, "/tmp"));
    const char *const *masked = corral_rootplan_masked(&n);
    CHECK(in_list(masked, n, "/etc/shadow") && !in_list(masked, n, "/etc/passwd"));
    const char *const *sys = corral_rootplan_system(&n);
    CHECK(n == 4 && in_list(sys, n, "/proc") && in_list(sys, n, "/boot"));
    const char *const *dev = corral_rootplan_devices(&n);
    CHECK(in_list(dev, n, "/dev/null") && !in_list(dev, n, "/dev/mem"));
    CHECK(in_list(dev, n, "/dev/tty"));
    const char *const *data = corral_rootplan_data_devices(&n);
    CHECK(in_list(data, n, "/dev/urandom") && !in_list(data, n, "/dev/tty"));
    /* The programs are the runtime read set without /etc, in the same order. */
    size_t n_runtime, n_programs;
    runtime = corral_rootplan_runtime(&n_runtime);
    const char *const *programs = corral_rootplan_programs(&n_programs);
    CHECK(n_programs == n_runtime - 1 && !in_list(programs, n_programs, "/etc"));
    for (size_t i = 0; i < n_programs; i++)
        CHECK(strcmp(programs[i], runtime[i]) == 0);
    const char *const *startup = corral_rootplan_startup_files(&n);
    CHECK(in_list(startup, n, "/etc/ld.so.cache") && !in_list(startup, n, "/etc/shadow"));
    CHECK(!in_list(startup, n, "/etc/resolv.conf"));
    const char *const *net = corral_rootplan_network_files(&n);
    CHECK(in_list(net, n, "/etc/resolv.conf") && !in_list(net, n, "/etc/shadow"));
    /* The tenant's own name files: every one a network file but nsswitch.conf (a start-up
     * file) and hostname (the tenant's own name), /etc/hosts among them. */
    size_t n_names;
    const char *const *names = corral_rootplan_name_files(&n_names);
    CHECK(in_list(names, n_names, "/etc/hosts") && in_list(names, n_names, "/etc/nsswitch.conf"));
    CHECK(in_list(names, n_names, "/etc/hostname"));
    for (size_t i = 0; i < n_names; i++)
        CHECK(in_list(net, n, names[i]) || strcmp(names[i], "/etc/nsswitch.conf") == 0 ||
              strcmp(names[i], "/etc/hostname") == 0);
}

static void test_boundary(void)
{
    char why[128];
    CHECK(corral_rootplan_check_boundary("/", why, sizeof why) == CORRAL_BOUNDARY_ROOT);
    CHECK(strcmp(why, "would confine nothing") == 0);
    CHECK(corral_rootplan_check_boundary("/proc/self", why, sizeof why) == CORRAL_BOUNDARY_SYSTEM);
    CHECK(strcmp(why, "would confine nothing") == 0);
    CHECK(corral_rootplan_check_boundary("/dev", why, sizeof why) == CORRAL_BOUNDARY_SYSTEM);
    CHECK(corral_rootplan_check_boundary("/etc/ssl", why, sizeof why) == CORRAL_BOUNDARY_RUNTIME);
    CHECK(strcmp(why, "is inside the runtime read set (/etc), which stays read-only") == 0);
    CHECK(corral_rootplan_check_boundary("/usr", NULL, 0) == CORRAL_BOUNDARY_RUNTIME);
    /* Controls: a shared prefix is not "inside", and an ordinary directory passes. */
    CHECK(corral_rootplan_check_boundary("/usrdata", why, sizeof why) == CORRAL_BOUNDARY_OK);
    CHECK(corral_rootplan_check_boundary("/procfs-copy", why, sizeof why) == CORRAL_BOUNDARY_OK);
    CHECK(corral_rootplan_check_boundary("/tmp/box", why, sizeof why) == CORRAL_BOUNDARY_OK);
    CHECK(strcmp(corral_boundary_name(CORRAL_BOUNDARY_RUNTIME), "runtime") == 0);
    CHECK(strcmp(corral_boundary_name(CORRAL_BOUNDARY_OK), "ok") == 0);
}

/* A file granted alone (--extra FILE): never a credential store, nor what the runtime
 * shows already, nor the kernel's. */
static void test_file_grant(void)
{
    char why[128];
    CHECK(corral_rootplan_check_file("/etc/shadow", why, sizeof why) == CORRAL_BOUNDARY_MASKED);
    CHECK(strcmp(why, "is a credential store, which a confined process never reads") == 0);
    CHECK(corral_rootplan_check_file("/etc/ssl/private/k.pem", NULL, 0) == CORRAL_BOUNDARY_MASKED);
    CHECK(corral_rootplan_check_file("/etc/passwd", why, sizeof why) == CORRAL_BOUNDARY_RUNTIME);
    CHECK(corral_rootplan_check_file("/proc/self/environ", NULL, 0) == CORRAL_BOUNDARY_SYSTEM);
    CHECK(strcmp(corral_boundary_name(CORRAL_BOUNDARY_MASKED), "masked") == 0);
    /* Controls: an agent's socket and a file beside a masked name pass. */
    CHECK(corral_rootplan_check_file("/run/user/0/ssh-agent.sock", NULL, 0) == CORRAL_BOUNDARY_OK);
    CHECK(corral_rootplan_check_file("/srv/shadow", NULL, 0) == CORRAL_BOUNDARY_OK);
    size_t n;
    const struct corral_tmpfs *t = corral_rootplan_scratch(&n);
    CHECK(n == 3 && strcmp(t[1].path, "/var/tmp") == 0 &&
          strncmp(t[1].options, "mode=1777,", 10) == 0);
}

int main(void)
{
    test_tables();
    test_boundary();
    test_file_grant();
    return DONE();
}
