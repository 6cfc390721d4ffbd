/*
 * core/lib/sbpl.c: the emitted profile is read back with a small s-expression reader
 * (strings with `\` escapes, `;` comments) and its forms are checked, not its bytes, so
 * a test passes only when the text means what it should to a Scheme reader.
 * Paths that need escaping are created for real and resolved, as a caller's would be.
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "path.h"
#include "sbpl.h"

/* ---- a tiny SBPL reader ---- */

struct node {
    bool list, string;
    char *text; /* atom or decoded string */
    struct node **kids;
    size_t n;
};

static void node_free(struct node *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->n; i++)
        node_free(n->kids[i]);
    free(n->kids);
    free(n->text);
    free(n);
}

static void node_add(struct node *l, struct node *k)
{
    l->kids = realloc(l->kids, (l->n + 1) * sizeof *l->kids);
    l->kids[l->n++] = k;
}

static void skip_space(const char **s)
{
    for (;;) {
        while (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')
            (*s)++;
        if (**s != ';') return;
        while (**s && **s != '\n')
            (*s)++;
    }
}

/* Reads one datum; NULL on any syntax error (unbalanced parens, unterminated string). */
static struct node *read_datum(const char **s)
{
    skip_space(s);
    struct node *n = calloc(1, sizeof *n);
    if (**s == '(') {
        (*s)++;
        n->list = true;
        for (;;) {
            skip_space(s);
            if (**s == ')') {
                (*s)++;
                return n;
            }
            if (**s == '\0') break;
            struct node *k = read_datum(s);
            if (!k) break;
            node_add(n, k);
        }
    } else if (**s == '"') {
        (*s)++;
        n->string = true;
        size_t len = 0;
        n->text = malloc(strlen(*s) + 1);
        while (**s && **s != '"') {
            if (**s == '\\') {
                (*s)++;
                if (!**s) break;
            }
            n->text[len++] = *(*s)++;
        }
        n->text[len] = '\0';
        if (**s == '"') {
            (*s)++;
            return n;
        }
    } else if (**s && **s != ')') {
        const char *b = *s;
        while (**s && !strchr(" \t\r\n()\";", **s))
            (*s)++;
        n->text = strndup(b, (size_t)(*s - b));
        return n;
    }
    node_free(n);
    return NULL;
}

/* The whole text as a list of top-level forms, or NULL if it does not read cleanly. */
static struct node *read_all(const char *text)
{
    struct node *top = calloc(1, sizeof *top);
    top->list = true;
    const char *s = text;
    for (;;) {
        skip_space(&s);
        if (!*s) return top;
        struct node *k = read_datum(&s);
        if (!k || !k->list) {
            node_free(k);
            node_free(top);
            return NULL;
        }
        node_add(top, k);
    }
}

static bool is_atom(const struct node *n, const char *a)
{
    return n && !n->list && !n->string && strcmp(n->text, a) == 0;
}

static bool has_atom(const struct node *form, const char *a)
{
    for (size_t i = 0; i < form->n; i++)
        if (is_atom(form->kids[i], a)) return true;
    return false;
}

/* Index of the first `(allow ... (<filter> "<path>"))` with op among its operations and
 * from index `from`; -1 if none. */
static long find_grant(const struct node *top, size_t from, const char *op, const char *filter,
                       const char *path)
{
    for (size_t i = from; i < top->n; i++) {
        const struct node *f = top->kids[i];
        if (!f->n || !is_atom(f->kids[0], "allow") || !has_atom(f, op)) continue;
        for (size_t k = 1; k < f->n; k++) {
            const struct node *flt = f->kids[k];
            if (flt->list && flt->n == 2 && is_atom(flt->kids[0], filter) && flt->kids[1]->string &&
                strcmp(flt->kids[1]->text, path) == 0)
                return (long)i;
        }
    }
    return -1;
}

/* ---- fixtures ---- */

static const char *const runtime[] = {"/usr/lib", "/System", "/private/etc"};

static char *emit(const char *permit, const char *const *extras, size_t n_extras, int *err)
{
    struct corral_sbpl_spec spec = {.permit_path = permit,
                                    .extras = extras,
                                    .n_extras = n_extras,
                                    .runtime_reads = runtime,
                                    .n_runtime_reads = sizeof runtime / sizeof *runtime};
    char *out = NULL;
    *err = corral_sbpl_emit(&spec, &out);
    return out;
}

static void test_reader(void)
{
    /* The reader itself: a control that reads, then the shapes it must reject. */
    struct node *t = read_all("(a \"x\\\")(\\\\\" b) ; (unbalanced in a comment\n(c)");
    CHECK(t && t->n == 2 && t->kids[0]->n == 3 &&
          strcmp(t->kids[0]->kids[1]->text, "x\")(\\") == 0);
    node_free(t);
    CHECK(read_all("(a (b)") == NULL);
    CHECK(read_all("(a))") == NULL);
    CHECK(read_all("(a \"b)") == NULL);
    CHECK(read_all("(a \"b\\\")") == NULL);
}

static void test_structure(void)
{
    char permit[PATH_MAX], e1[PATH_MAX], e2[PATH_MAX];
    snprintf(permit, sizeof permit, "%s/work", fixture_root);
    snprintf(e1, sizeof e1, "%s/cache", fixture_root);
    snprintf(e2, sizeof e2, "%s/other/deep", fixture_root);
    const char *extras[] = {e1, e2};
    int err;
    char *text = emit(permit, extras, 2, &err);
    CHECK(err == 0 && text);
    if (!text) return;
    struct node *top = read_all(text);
    CHECK(top != NULL);
    if (!top) {
        free(text);
        return;
    }

    /* (version 1) first, (deny default) second, and one other deny only: unix-socket
     * connects, which (allow network*) grants, taken back before any socket is granted
     * (later rules win). A deny anywhere else would take a grant back. */
    CHECK(top->n > 2);
    CHECK(top->kids[0]->n == 2 && is_atom(top->kids[0]->kids[0], "version") &&
          is_atom(top->kids[0]->kids[1], "1"));
    CHECK(top->kids[1]->n == 2 && is_atom(top->kids[1]->kids[0], "deny") &&
          is_atom(top->kids[1]->kids[1], "default"));
    long socket_deny = -1, first_socket_grant = -1;
    for (size_t i = 2; i < top->n; i++) {
        const struct node *f = top->kids[i];
        int socket_rule = f->n == 3 && is_atom(f->kids[1], "network-outbound") &&
                          f->kids[2]->n >= 2 && is_atom(f->kids[2]->kids[0], "remote") &&
                          is_atom(f->kids[2]->kids[1], "unix-socket");
        if (is_atom(f->kids[0], "deny")) {
            CHECK(socket_deny == -1 && socket_rule && f->kids[2]->n == 2); /* that one only */
            socket_deny = (long)i;
        } else {
            CHECK(is_atom(f->kids[0], "allow"));
            if (socket_rule && first_socket_grant == -1) first_socket_grant = (long)i;
        }
    }
    CHECK(socket_deny > 0);
    CHECK(first_socket_grant == -1 || socket_deny < first_socket_grant);

    /* The runtime: egress, exec, and every runtime read path, read-only. */
    long net = -1, exec = -1;
    for (size_t i = 0; i < top->n; i++) {
        const struct node *f = top->kids[i];
        if (f->n == 2 && is_atom(f->kids[0], "allow") && is_atom(f->kids[1], "network*"))
            net = (long)i;
        if (f->n == 2 && is_atom(f->kids[0], "allow") && is_atom(f->kids[1], "process-exec"))
            exec = (long)i;
    }
    CHECK(net > 1 && exec > 1);
    long last_runtime = 0;
    for (size_t i = 0; i < sizeof runtime / sizeof *runtime; i++) {
        long r = find_grant(top, 0, "file-read*", "subpath", runtime[i]);
        CHECK(r > 1);
        CHECK(r >= 0 && !has_atom(top->kids[r], "file-write*"));
        if (r > last_runtime) last_runtime = r;
    }
    CHECK(find_grant(top, 0, "file-read*", "literal", "/") > 1);
    CHECK(find_grant(top, 0, "file-write*", "literal", "/dev/null") > 1);
    /* getcwd from inside the boundary: metadata on each ancestor, and only metadata. */
    CHECK(find_grant(top, 0, "file-read-metadata", "literal", fixture_root) > 1);
    CHECK(find_grant(top, 0, "file-read*", "literal", fixture_root) == -1);
    CHECK(find_grant(top, 0, "file-read*", "subpath", fixture_root) == -1);

    /* The boundary, read-write, after the whole runtime block; then each extra, in
     * order; and the last extra is the last form: nothing after it can re-deny. */
    long b = find_grant(top, 0, "file-write*", "subpath", permit);
    long x1 = find_grant(top, 0, "file-write*", "subpath", e1);
    long x2 = find_grant(top, 0, "file-write*", "subpath", e2);
    CHECK(b > last_runtime && b > net && b > exec);
    CHECK(b >= 0 && has_atom(top->kids[b], "file-read*"));
    CHECK(x1 > b && x2 > x1);
    CHECK(x2 == (long)top->n - 1);
    for (long i = 2; i < b; i++) /* nothing before the boundary writes outside /dev */
        CHECK(!has_atom(top->kids[i], "file-write*") ||
              strncmp(top->kids[i]->kids[top->kids[i]->n - 1]->kids[1]->text, "/dev/", 5) == 0);

    node_free(top);
    free(text);

    /* Without extras, the boundary is the last form. */
    text = emit(permit, NULL, 0, &err);
    top = text ? read_all(text) : NULL;
    CHECK(err == 0 && top &&
          find_grant(top, 0, "file-write*", "subpath", permit) == (long)top->n - 1);
    node_free(top);
    free(text);
}

/* A directory named a"b\c, created and resolved: the emitted literal must read back as
 * exactly that path. A second one carries a would-be injection through `"` and `)`. */
static void test_escaping(void)
{
    char dir[PATH_MAX], inj[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/a\"b\\c", fixture_root);
    CHECK(mkdir(dir, 0755) == 0);
    char *resolved = NULL;
    CHECK(corral_resolve_dir(dir, &resolved) == 0 && resolved && strcmp(resolved, dir) == 0);
    int err;
    char *text = emit(resolved ? resolved : dir, NULL, 0, &err);
    CHECK(err == 0 && text && strstr(text, "a\\\"b\\\\c\"") != NULL);
    struct node *top = text ? read_all(text) : NULL;
    CHECK(top && find_grant(top, 0, "file-write*", "subpath", dir) == (long)top->n - 1);
    node_free(top);
    free(text);
    free(resolved);

    /* <root>/x")) (allow file-write* (subpath "/")) ((" is two nested directories, so it
     * is real; written unescaped it would close the grant and add a top-level grant of /. */
    snprintf(inj, sizeof inj, "%s/x\")) (allow file-write* (subpath \"", fixture_root);
    CHECK(mkdir(inj, 0755) == 0);
    strncat(inj, "/\")) ((\"", sizeof inj - strlen(inj) - 1);
    CHECK(mkdir(inj, 0755) == 0);
    resolved = NULL;
    CHECK(corral_resolve_dir(inj, &resolved) == 0 && resolved);
    text = emit(resolved ? resolved : inj, NULL, 0, &err);
    top = text ? read_all(text) : NULL;
    CHECK(err == 0 && top);
    if (top) {
        /* Control: the grant is there, whole, as the last form; the root is not. */
        CHECK(find_grant(top, 0, "file-write*", "subpath", inj) == (long)top->n - 1);
        CHECK(find_grant(top, 0, "file-write*", "subpath", "/") == -1);
    }
    /* Control: the same rule written unescaped reads as a grant of / to this reader, so
     * the -1 above distinguishes an injection from its absence. */
    char naive[2 * PATH_MAX];
    snprintf(naive, sizeof naive, "(allow file-read* file-write* (subpath \"%s\"))", inj);
    struct node *ntop = read_all(naive);
    CHECK(ntop && find_grant(ntop, 0, "file-write*", "subpath", "/") >= 0);
    node_free(ntop);
    node_free(top);
    free(text);
    free(resolved);
}

/* Each bad path is refused in every position, and the same spec with a good path in
 * that position is accepted (the control). */
static void test_refusals(void)
{
    char good[PATH_MAX];
    snprintf(good, sizeof good, "%s/work", fixture_root);
    const char *bad[] = {"relative/path", "",      "/a/b\nc", "/a/b\rc", "/a/../b",
                         "/a/./b",        "/a//b", "/a/b/",   "/a/.."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int err;
        char *text = emit(bad[i], NULL, 0, &err);
        CHECK(err == -EINVAL && text == NULL);
        const char *ex[] = {good, bad[i]};
        text = emit(good, ex, 2, &err);
        CHECK(err == -EINVAL && text == NULL);
        struct corral_sbpl_spec spec = {
            .permit_path = good, .runtime_reads = &bad[i], .n_runtime_reads = 1};
        CHECK(corral_sbpl_emit(&spec, &text) == -EINVAL && text == NULL);
        CHECK(corral_sbpl_check_path(bad[i]) == -EINVAL);
    }
    const char *ok[] = {good, "/", "/a/b.c", "/a/..b", "/a/.b", "/a/b c", "/a/b\tc"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int err;
        const char *ex[] = {good, ok[i]};
        char *text = emit(good, ex, 2, &err);
        CHECK(err == 0 && text);
        free(text);
        CHECK(corral_sbpl_check_path(ok[i]) == 0);
    }
    char *out = (char *)1;
    CHECK(corral_sbpl_emit(NULL, &out) == -EINVAL && out == NULL);
}

/* SBPL matches resolved paths: a permit path reached through a symlink is granted as
 * its target, and the link's own spelling appears nowhere. */
static void test_symlinked_permit(void)
{
    char target[PATH_MAX], link[PATH_MAX];
    snprintf(target, sizeof target, "%s/real-work", fixture_root);
    snprintf(link, sizeof link, "%s/work-link", fixture_root);
    CHECK(mkdir(target, 0755) == 0);
    CHECK(symlink("real-work", link) == 0);
    char *resolved = NULL;
    CHECK(corral_resolve_dir(link, &resolved) == 0 && resolved && strcmp(resolved, target) == 0);
    int err;
    char *text = emit(resolved ? resolved : link, NULL, 0, &err);
    struct node *top = text ? read_all(text) : NULL;
    CHECK(err == 0 && top);
    CHECK(top && find_grant(top, 0, "file-write*", "subpath", target) == (long)top->n - 1);
    CHECK(text && strstr(text, "work-link") == NULL);
    node_free(top);
    free(text);
    free(resolved);
}

int main(void)
{
    if (fixture_make("sbpl") < 0) return 1;
    test_reader();
    test_structure();
    test_escaping();
    test_refusals();
    test_symlinked_permit();
    CHECK(fixture_remove() == 0);
    return DONE();
}
