/*
 * The init of a pid namespace: reap every process (orphans reparent to it), forward the
 * caller's termination signals to the one child that matters, and report its status.
 * pid 1 ignores any signal it has no handler for, so the command itself must not be
 * pid 1 or a SIGTERM from outside would be lost; this loop is what sits there instead.
 */
#ifndef CORRAL_REAPER_H
#define CORRAL_REAPER_H

#include <signal.h>
#include <sys/types.h>

/* Blocks SIGCHLD and the forwarded signals (HUP INT QUIT TERM USR1 USR2 WINCH) into
 * *mask, saving the previous mask in *old (restore it in the child before exec). */
void corral_reaper_block(sigset_t *mask, sigset_t *old);

/* Waits for `child` while forwarding the signals in mask to it and reaping everything
 * else; returns its exit status, or 128+N when signal N killed it. */
int corral_reaper_wait(pid_t child, const sigset_t *mask);

/* As corral_reaper_wait, for a child that leads its own process group (a job): HUP, INT,
 * QUIT, TERM and WINCH go to the whole group, as a terminal sends them to its foreground
 * job; USR1 and USR2 to the child alone. */
int corral_reaper_wait_job(pid_t child, const sigset_t *mask);

/* Whether a job's whole group gets sig (HUP, INT, QUIT, TERM, WINCH), as a terminal sends
 * them to its foreground job. */
int corral_is_terminal_signal(int sig);

/* The status convention: exit code, or 128+signal. */
int corral_status_code(int wstatus);

#endif
