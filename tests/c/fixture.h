/*
 * A fixture directory for the C unit tests. fixture_make(name) makes
 * /tmp/corral-test-<name>-XXXXXX and keeps its resolved path in fixture_root (half of
 * PATH_MAX, so that every path built on it fits PATH_MAX); at(rel) is fixture_root/rel in
 * one of eight rotating buffers, so one call may take several; fixture_remove() removes
 * the tree without following a link.
 */
#ifndef CORRAL_FIXTURE_H
#define CORRAL_FIXTURE_H

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fixture_root[PATH_MAX / 2];

/* Returns 0, or -1 having said why on stderr. */
static inline int fixture_make(const char *name)
{
    char tmpl[PATH_MAX], rp[PATH_MAX];
    snprintf(tmpl, sizeof tmpl, "/tmp/corral-test-%s-XXXXXX", name);
    if (!mkdtemp(tmpl) || !realpath(tmpl, rp) || strlen(rp) >= sizeof fixture_root) {
        perror("fixture");
        return -1;
    }
    memcpy(fixture_root, rp, strlen(rp) + 1);
    return 0;
}

static inline const char *at(const char *rel)
{
    static char bufs[8][2 * PATH_MAX];
    static int n;
    char *b = bufs[n++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", fixture_root, rel);
    return b;
}

static inline int fixture_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static inline int fixture_remove(void)
{
    return nftw(fixture_root, fixture_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
