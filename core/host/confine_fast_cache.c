/*
 * The probe cache as `corral confine --exec`'s C fast path reads it (core/host/confine_fast.c):
 * lua/corral/probe_cache.lua's file and key, computed here before any Lua state exists. The
 * key's lists are generated from that module (core/gen/confine_fast_tables.lua); the order of
 * its lines is this file's copy of `key()`, so a change there that is not made here makes every
 * key differ, and the fast path declines every call (tests/confine_fast_spec.lua fails).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine_fast_cache.h"
#include "confine_fast_tables.h" /* generated, see core/gen/confine_fast_tables.lua */
#include "jsontext.h"
#include "landlock.h"
#include "rundir.h"

/* A whole file, or NULL. */
static char *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return NULL;
    struct corral_textbuf b = {0};
    char chunk[16384];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            corral_textbuf_free(&b);
            return NULL;
        }
        if (n == 0) break;
        corral_textbuf_add(&b, chunk, (size_t)n);
    }
    close(fd);
    corral_textbuf_add(&b, "", 0);
    if (b.failed) return NULL;
    if (!b.data) b.data = strdup("");
    *len = b.len;
    return b.data;
}

/* One `k=v` line of the key, its newlines written as \n. */
static void key_add(struct corral_textbuf *key, const char *k, const char *v, size_t n)
{
    corral_textbuf_add(key, "\n", 1);
    corral_textbuf_addstr(key, k);
    corral_textbuf_add(key, "=", 1);
    for (size_t i = 0; i < n; i++) {
        if (v[i] == '\n')
            corral_textbuf_add(key, "\\n", 2);
        else
            corral_textbuf_add(key, v + i, 1);
    }
}

static void key_file(struct corral_textbuf *key, const char *k, const char *path)
{
    size_t n;
    char *s = slurp(path, &n);
    key_add(key, k, s ? s : "-", s ? n : 1);
    free(s);
}

static void key_identity(struct corral_textbuf *key, const char *k, const char *path)
{
    struct stat st;
    char id[128] = "-";
    if (path && lstat(path, &st) == 0)
        snprintf(id, sizeof id, "%lld:%lld:%lld:%lld", (long long)st.st_dev, (long long)st.st_ino,
                 (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
    key_add(key, k, id, strlen(id));
}

/* package.searchpath(module, package.path) for the host's own entries, which come first
 * (core/host/main.c's setup_host); NULL when the module is not there (the rest of the
 * path is LUA_PATH's: the Lua path's). */
static char *module_file(const char *host, const char *module)
{
    char root[PATH_MAX], name[256];
    if (snprintf(root, sizeof root, "%s", host) >= (int)sizeof root) return NULL;
    for (int cut = 0; cut < 2; cut++) {
        char *slash = strrchr(root, '/');
        if (!slash) return NULL;
        *slash = '\0';
    }
    if (snprintf(name, sizeof name, "%s", module) >= (int)sizeof name) return NULL;
    for (char *c = name; *c; c++)
        if (*c == '.') *c = '/';
    static const char *const templates[][2] = {{"/lua/", ".lua"},
                                               {"/lua/", "/init.lua"},
                                               {"/share/lua/5.4/", ".lua"},
                                               {"/share/lua/5.4/", "/init.lua"}};
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s%s%s%s", root, templates[i][0], name, templates[i][1]) >=
            (int)sizeof path)
            continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            return strdup(path);
        }
    }
    return NULL;
}

/* corral.probe_cache.key(), as this process would compute it; NULL when a part of it is
 * one this code cannot compute (a module outside the host's tree). */
static char *cache_key(const char *host, const char *wrapper)
{
    struct corral_textbuf key = {0};
    char path[PATH_MAX];
    corral_textbuf_addstr(&key, CACHE_FORMAT);
    key_file(&key, "boot", "/proc/sys/kernel/random/boot_id");
    key_file(&key, "release", "/proc/sys/kernel/osrelease");
    key_file(&key, "kernel", "/proc/sys/kernel/version");
    for (const char *const *ns = cache_namespaces; *ns; ns++) {
        char k[64], target[PATH_MAX];
        snprintf(k, sizeof k, "ns.%s", *ns);
        snprintf(path, sizeof path, "/proc/self/ns/%s", *ns);
        ssize_t n = readlink(path, target, sizeof target - 1);
        key_add(&key, k, n >= 0 ? target : "-", n >= 0 ? (size_t)n : 1);
    }
    size_t slen = 0;
    char *raw = slurp("/proc/self/status", &slen);
    struct corral_textbuf text = {0};
    corral_textbuf_addstr(&text, "\n");
    corral_textbuf_addstr(&text, raw ? raw : "-");
    free(raw);
    if (text.failed) return NULL;
    char *status = text.data;
    for (const char *const *field = cache_status_fields; *field; field++) {
        char k[64], needle[64];
        snprintf(k, sizeof k, "status.%s", *field);
        snprintf(needle, sizeof needle, "\n%s:", *field);
        const char *at = strstr(status, needle);
        if (!at) {
            key_add(&key, k, "-", 1);
            continue;
        }
        const char *v = at + strlen(needle);
        const char *end = strchr(v - 1, '\n');
        if (!end) end = v + strlen(v);
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        key_add(&key, k, v, (size_t)(end - v));
    }
    free(status);
    key_file(&key, "cgroup", "/proc/self/cgroup");
    for (const char *const *s = cache_sysctls; *s; s++) {
        char k[128];
        snprintf(k, sizeof k, "sysctl.%s", *s);
        snprintf(path, sizeof path, "/proc/sys/%s", *s);
        key_file(&key, k, path);
    }
    key_file(&key, "lsm", "/sys/kernel/security/lsm");
    char abi[16] = "-";
    int a = corral_landlock_abi();
    if (a >= 0) snprintf(abi, sizeof abi, "%d", a);
    key_add(&key, "landlock", abi, strlen(abi));
    key_identity(&key, "host", host);
    key_identity(&key, "wrapper", wrapper);
    key_add(&key, "core", "host", 4);
    for (const char *const *m = cache_modules; *m; m++) {
        char k[128];
        char *file = module_file(host, *m);
        if (!file) {
            corral_textbuf_free(&key);
            return NULL;
        }
        snprintf(k, sizeof k, "module.%s", *m);
        key_identity(&key, k, file);
        free(file);
    }
    for (const char *const *p = cache_programs; *p; p++) {
        char k[PATH_MAX];
        snprintf(k, sizeof k, "program.%s", *p);
        key_identity(&key, k, *p);
    }
    for (const char *const *e = cache_environment; *e; e++) {
        const char *v = getenv(*e);
        struct corral_textbuf line = {0};
        corral_textbuf_addstr(&line, *e);
        corral_textbuf_addstr(&line, "=");
        corral_textbuf_addstr(&line, v ? v : "");
        if (line.failed) key.failed = 1;
        key_add(&key, "env", line.data ? line.data : "", line.len);
        corral_textbuf_free(&line);
    }
    corral_textbuf_add(&key, "\n", 1); /* the file's head is the key and a newline */
    if (key.failed) return NULL;
    return key.data;
}

/* corral.probe_cache.path(): the runtime directory's file for this host. */
static char *cache_path(const char *host)
{
    char dir[PATH_MAX];
    if (corral_rundir_path(dir, sizeof dir, geteuid(), getenv("XDG_RUNTIME_DIR")) < 0 ||
        corral_rundir_check(dir, geteuid()) < 0)
        return NULL;
    struct corral_textbuf name = {0};
    for (const char *c = host; *c; c++)
        corral_textbuf_addstr(&name, *c == '%' ? "%25" : *c == '/' ? "%2F" : (char[]){*c, 0});
    if (name.failed || name.len > CACHE_NAME_PATH_MAX) return NULL; /* named by a digest */
    char *path = malloc(strlen(dir) + strlen(CACHE_NAME) + name.len + 3);
    if (path) sprintf(path, "%s/%s-%s", dir, CACHE_NAME, name.data);
    corral_textbuf_free(&name);
    return path;
}

/* A kept result's line, `holds\tNAME\tAT\tDETAIL\tEXTRA` with NAME escaped; its name
 * into name (cap bytes), or -1 when the line is not one (the whole file is then not). */
static int cache_line(const char *line, size_t n, char *name, size_t cap)
{
    const char *tab[4];
    size_t tabs = 0;
    if (n < 6 || memcmp(line, "holds\t", 6) != 0) return -1;
    for (size_t i = 6; i < n; i++)
        if (line[i] == '\t') {
            if (tabs == 4) return -1;
            tab[tabs++] = line + i;
        }
    if (tabs != 3 || tab[0] == line + 6 || tab[1] == tab[0] + 1) return -1;
    for (const char *d = tab[0] + 1; d < tab[1]; d++)
        if (*d < '0' || *d > '9') return -1;
    size_t o = 0;
    for (const char *c = line + 6; c < tab[0]; c++) {
        char hex[3] = {c[0] == '%' && c + 2 < tab[0] ? c[1] : 0,
                       c[0] == '%' && c + 2 < tab[0] ? c[2] : 0, 0};
        char ch = *c;
        if (isxdigit((unsigned char)hex[0]) && isxdigit((unsigned char)hex[1])) {
            ch = (char)strtol(hex, NULL, 16);
            c += 2;
        }
        if (o + 1 < cap) name[o++] = ch;
    }
    name[o] = '\0';
    return 0;
}

char *corral_fast_probe_cache(const char *host, const char *wrapper, const char **why)
{
    char *path = cache_path(host);
    struct stat st;
    *why = "no valid probe cache";
    if (!path || lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) || st.st_size > 1024 * 1024)
        return NULL;
    size_t len;
    char *text = slurp(path, &len);
    char *key = cache_key(host, wrapper);
    *why = "the probe cache cannot be read";
    if (!text || !key) return NULL;
    size_t klen = strlen(key);
    *why = "the probe cache is another host state's";
    if (len < klen || memcmp(text, key, klen) != 0) return NULL;
    int ns = 0, landlock = 0;
    for (size_t i = klen; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
        char name[256];
        *why = "a probe cache line that is not one";
        if (n > 0) {
            if (memchr(text + i, '\0', n) || cache_line(text + i, n, name, sizeof name) < 0)
                return NULL;
            ns |= strcmp(name, "confinement.namespace") == 0;
            landlock |= strcmp(name, "confinement.landlock") == 0;
        }
        i += n + 1;
    }
    free(text);
    free(key);
    *why = "the probe cache does not show both layers holding";
    return ns && landlock ? path : NULL;
}
