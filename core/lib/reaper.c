/*
 * Init loop for pid namespaces (see reaper.h). sigwaitinfo on blocked signals rather
 * than handlers: no async-signal-safety questions, and no signal is lost between a
 * check and a wait.
 */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "exitcodes.h"
#include "reaper.h"

static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH};

void corral_reaper_block(sigset_t *mask, sigset_t *old)
{
    sigemptyset(mask);
    sigaddset(mask, SIGCHLD);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaddset(mask, forwarded[i]);
    sigprocmask(SIG_BLOCK, mask, old);
}

int corral_status_code(int wstatus)
{
    if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
    return CORRAL_EXIT_SETUP;
}

/* What a terminal sends its foreground job: the whole group gets it, as a shell's child
 * does under Ctrl-C. dash running `sleep 4; echo after`, told by pid alone, defers
 * SIGINT until its sleep returns (measured: 4.0 s; the group: 0.3 s). */
int corral_is_terminal_signal(int sig)
{
    return sig == SIGHUP || sig == SIGINT || sig == SIGQUIT || sig == SIGTERM || sig == SIGWINCH;
}

static void forward(pid_t child, int sig, int to_group)
{
    /* the group is gone (every member exited) or was never made: the child alone */
    if (to_group && corral_is_terminal_signal(sig) && kill(-child, sig) == 0) return;
    kill(child, sig);
}

static int reaper_wait(pid_t child, const sigset_t *mask, int to_group)
{
    for (;;) {
        /* Reap first: the child may have exited before we started waiting. */
        for (;;) {
            int ws;
            pid_t p = waitpid(-1, &ws, WNOHANG);
            if (p == child) return corral_status_code(ws);
            if (p <= 0) break;
        }
        siginfo_t si;
        int sig = sigwaitinfo(mask, &si);
        if (sig < 0) {
            if (errno == EINTR) continue;
            return CORRAL_EXIT_SETUP;
        }
        if (sig != SIGCHLD) forward(child, sig, to_group);
    }
}

int corral_reaper_wait(pid_t child, const sigset_t *mask)
{
    return reaper_wait(child, mask, 0);
}

int corral_reaper_wait_job(pid_t child, const sigset_t *mask)
{
    return reaper_wait(child, mask, 1);
}
