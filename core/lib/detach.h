/*
 * A process that outlives its caller and any terminal: a session's keeper. Two forks
 * and a setsid between them, so it leads no session (it can never acquire a
 * controlling terminal) and is nobody's child but init's (or the nearest subreaper's).
 */
#ifndef CORRAL_DETACH_H
#define CORRAL_DETACH_H

/* In the caller: returns 1 once the intermediate child has exited, *fd the read end of
 * a CLOEXEC pipe whose write end the detached process holds (end of file: it exited or
 * closed it). In the detached process: returns 0, *fd that write end, its stdin, stdout
 * and stderr on /dev/null, in a new session. -errno when nothing could be made (nothing
 * is left then). Async-signal-safe calls only between the forks: the caller may hold
 * threads. */
int corral_detach(int *fd);

#endif
