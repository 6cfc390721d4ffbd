/*
 * The read-only plan of the `corral confine --exec` fast path: the C form of
 * corral.confinement.protected.plan, the repository and home names kept read-only inside
 * the boundary (tables generated from protected.lua), each judged as Lua judges it.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine_fast_plan.h"
#include "confine_fast_tables.h" /* generated, see core/gen/confine_fast_tables.lua */
#include "util.h"

/* ---- the read-only plan (corral.confinement.protected.plan) ----------------------------- */

/* listdir: the names in byte order without . and .., or an empty list. */
static struct list listdir(const char *dir)
{
    struct list names = {0};
    DIR *d = opendir(dir);
    if (!d) return names;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            cf_list_add(&names, strdup(e->d_name));
    closedir(d);
    if (names.n) qsort(names.v, names.n, sizeof *names.v, cf_compare_strings);
    return names;
}

/* Every git repository beneath root, breadth first within the bounds. */
static void repositories(struct fast *f, const char *root, struct list *found)
{
    struct stat rst;
    long long dev = lstat(root, &rst) == 0 ? (long long)rst.st_dev : -1;
    long left = PROTECTED_ENTRIES;
    struct list queue = {0};
    int *depths = malloc(sizeof *depths * 16);
    size_t depths_cap = 16;
    if (!depths) {
        cf_alloc_failed = 1;
        return;
    }
    cf_list_add(&queue, (char *)root);
    depths[0] = 0;
    for (size_t head = 0; head < queue.n; head++) {
        int depth = depths[head];
        struct list names = depth < PROTECTED_DEPTH ? listdir(queue.v[head]) : (struct list){0};
        for (size_t i = 0; i < names.n; i++) {
            if (left == 0) {
                f->stopped = 1;
                return;
            }
            left--;
            if (strcmp(names.v[i], ".git") == 0) continue;
            char *path = cf_concat3(queue.v[head], "/", names.v[i]);
            struct stat st, git;
            if (!path || lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) ||
                (long long)st.st_dev != dev)
                continue;
            char *dotgit = cf_concat3(path, "/.git", "");
            if (dotgit && lstat(dotgit, &git) == 0 &&
                (S_ISDIR(git.st_mode) || S_ISLNK(git.st_mode)))
                cf_list_add(found, path);
            if (queue.n + 1 > depths_cap) {
                depths_cap *= 2;
                depths = realloc(depths, sizeof *depths * depths_cap);
                if (!depths) {
                    cf_alloc_failed = 1;
                    return;
                }
            }
            depths[queue.n] = depth + 1;
            cf_list_add(&queue, path);
        }
    }
}

static int unprotected(struct fast *f, char *path, char *why)
{
    return cf_list_add(&f->unprotected, path) < 0 || cf_list_add(&f->unprotected_why, why) < 0 ? -1
                                                                                               : 0;
}

/* judge: held, absent, or not protected and why. */
static void judge(struct fast *f, char *path)
{
    if (cf_set_add(&f->seen, path)) return;
    struct stat st;
    if (lstat(path, &st) < 0) {
        cf_list_add(&f->absent, path);
    } else if (S_ISLNK(st.st_mode)) {
        unprotected(f, path, WHY_LINK);
    } else if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        unprotected(f, path, WHY_SPECIAL);
    } else if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
        char n[32];
        snprintf(n, sizeof n, "%lu", (unsigned long)st.st_nlink);
        unprotected(f, path, cf_concat3(n, WHY_HARD_LINKS, ""));
    } else {
        cf_list_add(&f->paths, path);
    }
}

/* The first symlink among the directories of name beneath base, or NULL. */
static char *linked_on_the_way(const char *base, const char *name)
{
    for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
        if (slash == name || slash[-1] == '/') continue;
        char *at = malloc(strlen(base) + 2 + (size_t)(slash - name));
        struct stat st;
        if (!at) return NULL;
        sprintf(at, "%s/%.*s", base, (int)(slash - name), name);
        if (lstat(at, &st) == 0 && S_ISLNK(st.st_mode)) return at;
        free(at);
    }
    return NULL;
}

static void add_names(struct fast *f, const char *base, char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *path = cf_concat3(base, "/", names[i]);
        if (!path) continue;
        int dropped = 0;
        for (size_t w = 0; w < f->writable.n; w++)
            dropped |= corral_is_beneath(path, f->writable.v[w]);
        if (dropped || cf_set_has(&f->seen, path)) continue;
        char *link = linked_on_the_way(base, names[i]);
        if (link) {
            cf_set_add(&f->seen, path);
            unprotected(f, path, cf_concat3(link, WHY_ON_THE_WAY, ""));
        } else {
            judge(f, path);
        }
    }
}

static size_t count(const char *const *v)
{
    size_t n = 0;
    while (v[n])
        n++;
    return n;
}

int cf_plan_read_only(struct fast *f)
{
    for (size_t i = 0; i < f->read_only.n; i++)
        judge(f, f->read_only.v[i]);
    for (size_t r = 0; r < f->roots.n; r++) {
        const char *root = f->roots.v[r];
        add_names(f, root, (char *const *)protected_home, count(protected_home));
        struct list repos = {0};
        cf_list_add(&repos, (char *)root);
        repositories(f, root, &repos);
        for (size_t i = 0; i < repos.n; i++) {
            add_names(f, repos.v[i], (char *const *)protected_repository,
                      count(protected_repository));
            char *modules = cf_concat3(repos.v[i], "/.git/modules", "");
            struct list subs = modules ? listdir(modules) : (struct list){0};
            struct list names = {0};
            for (size_t s = 0; s < subs.n; s++) {
                cf_list_add(&names, cf_concat3(".git/modules/", subs.v[s], "/config"));
                cf_list_add(&names, cf_concat3(".git/modules/", subs.v[s], "/hooks"));
            }
            add_names(f, repos.v[i], names.v, names.n);
        }
    }
    /* a --writable inside a path that stays read-only is refused there */
    for (size_t w = 0; w < f->writable.n; w++)
        for (size_t p = 0; p < f->paths.n; p++)
            if (strcmp(f->writable.v[w], f->paths.v[p]) != 0 &&
                corral_is_beneath(f->writable.v[w], f->paths.v[p]))
                return cf_decline(f, "a --writable inside a read-only path");
    if (f->paths.n) qsort(f->paths.v, f->paths.n, sizeof *f->paths.v, cf_compare_strings);
    if (f->absent.n) qsort(f->absent.v, f->absent.n, sizeof *f->absent.v, cf_compare_strings);
    return 0;
}
