/*
 * What the host (core/host/main.c) and the front (core/front/front.c) both check before
 * anything is loaded, to decide who serves a command line.
 */
#ifndef CORRAL_DISPATCH_H
#define CORRAL_DISPATCH_H

/* Whether the program runs as `corral-runtime` (its name, a link to it): an engine calls
 * an OCI runtime with runc's command line, whose `exec` is an engine's, never corral's. */
int corral_invoked_as_runtime(const char *argv0);

/* Whether a broker outside serves this process's corral requests: CORRAL_BROKER named and
 * no_new_privs set (the confinement wrapper sets it; the broker client checks the rest). */
int corral_brokered(void);

/* A standard fd the caller closed (`corral run -- cat <&-`) would be the next fd corral
 * opens (its signalfd became the engine client's stdin, which then hung): each closed
 * one is opened on /dev/null first, the lowest free fd being that one. */
void corral_open_closed_std_fds(void);

#endif
