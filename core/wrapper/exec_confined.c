/*
 * `corral-exec-confined`: the confinement wrapper alone, the program a `corral confine`
 * spec names (docs/architecture.md, "The confinement wrapper").
 *
 * It is the same code as `corral exec-confined` (core/host/confine.c), linked without the
 * Lua host: no interpreter, readline or netlink libraries to load. Where musl is
 * installed the Makefile links it statically against musl, whose start-up does no CPU
 * feature probing: under a hypervisor that traps `cpuid`, glibc's probing costs ~1.2 ms
 * of every exec, and the wrapper is one exec of every confined launch
 * (scripts/bench/launch measures both).
 *
 *   corral-exec-confined [exec-confined] --permit DIR … -- CMD ARGS…
 *
 * The leading `exec-confined` is optional, so a spec's arguments are the host's.
 * `--help` is the host's usage: handed to the `corral` beside this program.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "confine.h"

/* Whether an option position before `--` asks for the usage (each option takes one
 * value, so a directory named -h given as a value is still a value). */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i += 2)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

/* Replaces this process with `corral help exec-confined` from this program's directory. */
static int host_usage(void)
{
    char self[PATH_MAX], host[PATH_MAX + 8];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(host, sizeof host, "%s/corral", self);
            char *argv[] = {host, "help", "exec-confined", NULL};
            execv(host, argv);
        }
    }
    fputs("usage: corral-exec-confined --permit DIR [--extra PATH]... [--cd DIR] [--layers L] "
          "-- CMD ARGS...\n(see `corral help exec-confined`)\n",
          stderr);
    return CORRAL_EXIT_SETUP;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "exec-confined") == 0) {
        argc--;
        argv++;
    } else {
        argv[0] = "exec-confined";
    }
    if (wants_help(argc, argv)) return host_usage();
    return corral_exec_confined_main(argc, argv);
}
