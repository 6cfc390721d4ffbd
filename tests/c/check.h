/*
 * A minimal test harness for the C unit tests: CHECK(cond) records a pass or a
 * failure with its location; DONE() prints "N passed, N failed" and returns the exit
 * status. Each test binary is a plain main().
 */
#ifndef CORRAL_CHECK_H
#define CORRAL_CHECK_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                          \
    } while (0)

/* Open fds of this process, so a test can show a verb leaves the count as it found it. */
static inline int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A figure a test measured, printed as "note: ..." only with CORRAL_TEST_VERBOSE set:
 * `make test` shows a passing binary's tally and nothing else. */
#define NOTE(...)                                                                                  \
    do {                                                                                           \
        if (getenv("CORRAL_TEST_VERBOSE")) {                                                       \
            fputs("note: ", stdout);                                                               \
            printf(__VA_ARGS__);                                                                   \
        }                                                                                          \
    } while (0)

#define DONE()                                                                                     \
    (printf("%s: %d passed, %d failed\n", __FILE__, check_passed, check_failed),                   \
     check_failed ? 1 : 0)

#endif
