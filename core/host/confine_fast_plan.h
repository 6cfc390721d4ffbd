/*
 * What the two halves of the `corral confine --exec` fast path share (confine_fast.c:
 * the line, the checks, the spec; confine_fast_protected.c: the read-only plan): the
 * line's state and the string lists and sets they build it with. Private to them.
 */
#ifndef CORRAL_CONFINE_FAST_PLAN_H
#define CORRAL_CONFINE_FAST_PLAN_H

#include <stddef.h>

/* A growing list of strings (NULL-terminated once anything was added). */
struct list {
    char **v;
    size_t n, cap;
};

/* The candidates judged already (the plan's `seen`): a hash set, as a boundary may hold
 * thousands of repositories, each with its dozen names. */
struct set {
    char **slot;
    size_t cap, n;
};

struct fast {
    const char *why; /* why the line was declined */
    const char *permit_arg, *cd_arg;
    struct list extra_args, ro_args, wr_args;
    int exec;
    char **cmdv; /* the command and its arguments (after `--`) */
    int cmdc;
    char *host, *wrapper; /* the host executable, and the wrapper program a spec names */
    char *cache_path;
    char *permit, *cd, *cmd;
    struct list extras, extra_kinds; /* kinds: "dir", "file", "socket" */
    struct list roots, read_only, writable, env;
    /* the read-only plan (corral.confinement.protected.plan) */
    struct list paths, absent, unprotected, unprotected_why;
    struct set seen;
    int stopped;
};

/* Records why the line is declined (the first reason kept); returns -1. */
int cf_decline(struct fast *f, const char *why);

/* Set by any allocation that failed on the way: a list missing an entry (a protected
 * path) would be a weaker spec than Lua's, so the line is then declined. */
extern int cf_alloc_failed;

/* Appends s (NULL: an allocation failed) to l; 0, or -1 with cf_alloc_failed set. */
int cf_list_add(struct list *l, char *s);
/* Adds s to t; 1 when it was there already (or cannot be added: cf_alloc_failed). */
int cf_set_add(struct set *t, char *s);
int cf_set_has(const struct set *t, const char *s);
/* a, b and c joined in a new string, or NULL with cf_alloc_failed set. */
char *cf_concat3(const char *a, const char *b, const char *c);
/* qsort's comparison of two char *. */
int cf_compare_strings(const void *a, const void *b);

/* The read-only plan (corral.confinement.protected.plan) of f's boundary into f->paths,
 * f->absent and f->unprotected; -1 (declined) when it cannot be made as Lua would. */
int cf_plan_read_only(struct fast *f);

#endif
