/*
 * `corral`, the front: the program a user's `corral …` runs. It serves the subcommands
 * that sit on a hot path itself, in C and without the Lua host, and hands every other
 * command line to the host program, `corral-host` beside it, with execv: the same argv
 * (argv[0] kept, so the host's own dispatch, `corral-runtime` included, is unchanged) and
 * the same environment.
 *
 * Why a program of its own: `corral exec ID -- CMD` into a live sandbox is a few
 * syscalls of work, yet the host is a 2.4 MB glibc binary that links liblua, libseccomp,
 * libcap and the netfilter libraries; mapping and relocating those and glibc's start-up
 * (its CPU feature probing, which a hypervisor that traps `cpuid` makes slow) cost more
 * than the exec itself. Where musl-gcc is installed the Makefile links the front
 * statically against musl, as it does the confinement wrapper (core/wrapper).
 *
 * Served here (docs/architecture.md, "The front"):
 *   exec      `corral exec ID … -- CMD` (core/host/session_exec.c); its --help, and a
 *             process a broker serves (lua/corral/broker/client.lua), go to the host
 *   confine   the place for a `corral confine --exec` fast path: none is built yet, so
 *             every confine line goes to the host
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dispatch.h"
#include "exitcodes.h"
#include "session_exec.h"
#include "confine_fast.h"

/* The host program's file name, beside the front. */
#define HOST_NAME "corral-host"
/* What a served subcommand returns to hand its line to the host after all. */
#define HAND_OVER (-1)

static int serve_exec(int argc, char **argv)
{
    if (corral_session_exec_wants_help(argc - 1, argv + 1) || corral_brokered()) return HAND_OVER;
    corral_open_closed_std_fds();
    return corral_session_exec_main(argc - 1, argv + 1);
}

static int host_path(const char *argv0, char *out, size_t size);

/* `corral confine --exec …` that needs no Lua (core/host/confine_fast.h): the spec built
 * from the host's probe cache and the wrapper run in this process; any other confine
 * line goes to the host. */
static int serve_confine(int argc, char **argv)
{
    char host[PATH_MAX];
    if (host_path(argv[0], host, sizeof host) < 0) return HAND_OVER;
    int status = confine_fast_main(argc, argv, host);
    return status == CORRAL_CONFINE_FAST_DECLINE ? HAND_OVER : status;
}

/* The subcommands served here, each handed the whole command line (argv[1] its name). */
static const struct {
    const char *name;
    int (*serve)(int argc, char **argv);
} served[] = {
    {"exec", serve_exec},
    {"confine", serve_confine},
};

/* The host's path, into out: HOST_NAME in this program's directory (/proc/self/exe,
 * resolved; argv[0]'s directory where /proc is absent). Returns 0, or -1 when there is
 * no directory to look in. */
static int host_path(const char *argv0, char *out, size_t size)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
    } else if (argv0 == NULL || strchr(argv0, '/') == NULL || realpath(argv0, self) == NULL) {
        return -1;
    }
    char *slash = strrchr(self, '/');
    if (slash == NULL) return -1;
    *slash = '\0';
    return snprintf(out, size, "%s/" HOST_NAME, self) < (int)size ? 0 : -1;
}

/* Replaces this process with the host, argv unchanged. Returns only on failure: nothing
 * was executed, so the status is SETUP's. */
static int hand_to_host(char **argv)
{
    char host[PATH_MAX];
    if (host_path(argv[0], host, sizeof host) < 0) {
        fputs("corral: cannot find the corral host program (" HOST_NAME
              ", beside this one): /proc/self/exe unreadable\n",
              stderr);
        return CORRAL_EXIT_SETUP;
    }
    execv(host, argv);
    fprintf(stderr, "corral: cannot run the corral host program %s: %s\n", host, strerror(errno));
    return CORRAL_EXIT_SETUP;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !corral_invoked_as_runtime(argv[0])) /* runc's argv: the host's */
        for (size_t i = 0; i < sizeof served / sizeof served[0]; i++)
            if (strcmp(argv[1], served[i].name) == 0) {
                int status = served[i].serve(argc, argv);
                if (status != HAND_OVER) return status;
                break;
            }
    return hand_to_host(argv);
}
