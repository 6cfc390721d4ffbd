/*
 * core/lib/procscan.c against real processes: a child running as an otherwise unused
 * uid is found, its zombie is not, and with no such process nothing is.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "procscan.h"

/* A uid in the range no login account uses, and no sandbox path here hashes to. */
#define UNUSED_UID 1999999991

/* A child that becomes UNUSED_UID, then pauses (live) or exits at once (a zombie until
 * reaped); the parent learns through the pipe that the ids have changed. */
static pid_t child_as_unused_uid(int live)
{
    int p[2];
    if (pipe(p) < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        if (setresgid(UNUSED_UID, UNUSED_UID, UNUSED_UID) < 0 ||
            setresuid(UNUSED_UID, UNUSED_UID, UNUSED_UID) < 0)
            _exit(1);
        if (write(p[1], "x", 1) != 1) _exit(1);
        if (live) pause();
        _exit(0);
    }
    close(p[1]);
    char c;
    ssize_t n = pid > 0 ? read(p[0], &c, 1) : -1;
    close(p[0]);
    return n == 1 ? pid : -1;
}

int main(void)
{
    if (geteuid() != 0) {
        printf("%s: skipped (changing ids needs root)\n", __FILE__);
        return 0;
    }
    pid_t found = 0;
    /* control: nothing runs as the uid yet */
    CHECK(corral_proc_find_owned(UNUSED_UID, &found) == 0);

    pid_t live = child_as_unused_uid(1);
    CHECK(live > 0);
    found = 0;
    CHECK(corral_proc_find_owned(UNUSED_UID, &found) == 1);
    CHECK(found == live);
    /* the same scan finds this process by its own uid (root) */
    CHECK(corral_proc_find_owned(0, &found) == 1);

    /* a zombie (exited, not yet reaped) holds nothing */
    kill(live, SIGKILL);
    siginfo_t si;
    CHECK(waitid(P_PID, (id_t)live, &si, WEXITED | WNOWAIT) == 0);
    CHECK(corral_proc_find_owned(UNUSED_UID, &found) == 0);
    CHECK(waitpid(live, NULL, 0) == live);

    pid_t brief = child_as_unused_uid(0);
    CHECK(brief > 0);
    CHECK(waitid(P_PID, (id_t)brief, &si, WEXITED | WNOWAIT) == 0);
    CHECK(corral_proc_find_owned(UNUSED_UID, &found) == 0);
    CHECK(waitpid(brief, NULL, 0) == brief);

    return DONE();
}
