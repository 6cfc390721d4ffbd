/*
 * Resource cgroups beneath this process's own cgroup (see cgroup.h). On a hybrid host
 * the v2 mount (/sys/fs/cgroup/unified) may offer no memory/pids/cpu controller, but its
 * cgroups still have cgroup.kill and cpu.stat, so that hierarchy is used too:
 * cgroup.kill ends a whole tree in one write. A zombie is listed in no cgroup.procs and
 * does not keep rmdir from succeeding.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "util.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

struct cg_dir {
    char *path;
    int procs_fd;
    unsigned roles;
    int version;
};

struct corral_cgroup {
    size_t n;
    struct cg_dir d[CORRAL_CG_MAXHIER];
    unsigned held;
};

static int read_all(const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = buf ? 0 : -ENOMEM;
    while (rc == 0) {
        if (cap - n < 2) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                rc = -ENOMEM;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = -errno;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return 0;
}

static int read_in(const char *dir, const char *file, char **out)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return -ENAMETOOLONG;
    return read_all(path, out, NULL);
}

static int write_in(const char *dir, const char *file, const char *text)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return -ENAMETOOLONG;
    return corral_write_file(path, text, strlen(text));
}

static int exists_in(const char *dir, const char *file)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path) return 0;
    return access(path, F_OK) == 0;
}

/* The value of "key N" in a flat-keyed file (memory.events, cpu.stat, oom_control). */
static int keyed_u64(const char *text, const char *key, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *line = text; *line;) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
            *out = strtoull(line + klen + 1, NULL, 10);
            return 0;
        }
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return -ENOENT;
}

static int read_u64(const char *dir, const char *file, uint64_t *out)
{
    _cleanup_free_ char *text = NULL;
    int rc = read_in(dir, file, &text);
    if (rc < 0) return rc;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || errno) return -EINVAL;
    *out = v;
    return 0;
}

/* Undoes mountinfo's octal escapes (\040 for a space, ...) in place. */
static void unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

static int has_token(const char *list, const char *tok)
{
    size_t tlen = strlen(tok);
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        if (n == tlen && strncmp(p, tok, n) == 0) return 1;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

static unsigned v1_roles(const char *list)
{
    unsigned r = 0;
    if (has_token(list, "memory")) r |= CORRAL_CG_MEMORY;
    if (has_token(list, "pids")) r |= CORRAL_CG_PIDS;
    if (has_token(list, "cpu")) r |= CORRAL_CG_CPU;
    if (has_token(list, "cpuacct")) r |= CORRAL_CG_CPUACCT;
    return r;
}

static int all_tokens(const char *need, const char *have)
{
    char tok[64];
    for (const char *p = need; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof tok) return 0;
        memcpy(tok, p, n);
        tok[n] = '\0';
        if (!has_token(have, tok)) return 0;
        p += n;
        if (*p == ',') p++;
    }
    return 1;
}

/* Finds the mount of the hierarchy that /proc/self/cgroup lists with controllers ctrls
 * (empty: v2) and sets dir to where cgpath is visible. 0 or -ENOENT. Modifies
 * mountinfo (splits it into fields). */
static int locate(char *mountinfo, const char *ctrls, const char *cgpath, char *dir, size_t size)
{
    char *save_line = NULL;
    for (char *line = strtok_r(mountinfo, "\n", &save_line); line;
         line = strtok_r(NULL, "\n", &save_line)) {
        /* id parent maj:min root mountpoint options [optional...] - fstype source super */
        char *f[32], *save = NULL;
        int n = 0, dash = -1;
        for (char *t = strtok_r(line, " ", &save); t && n < 32; t = strtok_r(NULL, " ", &save)) {
            if (dash < 0 && n >= 6 && strcmp(t, "-") == 0) dash = n;
            f[n++] = t;
        }
        if (dash < 0 || dash + 3 >= n) continue;
        const char *fstype = f[dash + 1], *super = f[dash + 3];
        int match = *ctrls ? strcmp(fstype, "cgroup") == 0 && all_tokens(ctrls, super)
                           : strcmp(fstype, "cgroup2") == 0;
        if (!match) continue;
        char *root = f[3], *mnt = f[4];
        unescape(root);
        unescape(mnt);
        size_t rlen = strcmp(root, "/") == 0 ? 0 : strlen(root);
        /* A mount of a subtree shows only the paths beneath its root. */
        if (strncmp(cgpath, root, rlen) != 0 || (cgpath[rlen] != '/' && cgpath[rlen] != '\0'))
            continue;
        const char *rest = cgpath + rlen;
        if (strcmp(rest, "/") == 0) rest = "";
        int w = snprintf(dir, size, "%s%s", mnt, rest);
        return w > 0 && (size_t)w < size ? 0 : -ENAMETOOLONG;
    }
    return -ENOENT;
}

int corral_cgroup_info(struct corral_cgroup_info *out)
{
    memset(out, 0, sizeof *out);
    _cleanup_free_ char *self = NULL, *mountinfo = NULL, *scratch = NULL;
    size_t mlen = 0;
    int rc = read_all("/proc/self/cgroup", &self, NULL);
    if (rc == 0) rc = read_all("/proc/self/mountinfo", &mountinfo, &mlen);
    if (rc < 0) return rc;
    if (!(scratch = malloc(mlen + 1))) return -ENOMEM;

    for (char *line = self; line && *line;) {
        char *next = strchr(line, '\n'), *id = line;
        if (next) *next++ = '\0';
        /* hierarchy-id:controller-list:path */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        line = next;
        if (!c2 || out->n == CORRAL_CG_MAXHIER) continue;
        *c1 = *c2 = '\0';
        const char *ctrls = c1 + 1, *cgpath = c2 + 1;
        /* "(deleted)" or a path outside our cgroup namespace root cannot be used. */
        if (cgpath[0] != '/' || strstr(cgpath, "(deleted)")) continue;
        int v2 = *ctrls == '\0' && strcmp(id, "0") == 0;
        unsigned roles = v2 ? 0 : v1_roles(ctrls);
        if (!v2 && !roles) continue;

        struct corral_cgroup_hier *h = &out->hier[out->n];
        memcpy(scratch, mountinfo, mlen + 1);
        if (locate(scratch, ctrls, cgpath, h->dir, sizeof h->dir) < 0) continue;
        if (v2) {
            /* Children get what this cgroup's subtree_control enables; corral does not
             * enable controllers on a cgroup it did not create. cpu.stat (usage_usec)
             * exists in every v2 cgroup. */
            _cleanup_free_ char *sub = NULL;
            if (read_in(h->dir, "cgroup.subtree_control", &sub) == 0) {
                for (char *s = sub; *s; s++)
                    if (*s == ' ' || *s == '\n') *s = ',';
                roles = v1_roles(sub) & (CORRAL_CG_MEMORY | CORRAL_CG_PIDS | CORRAL_CG_CPU);
            }
            roles |= CORRAL_CG_CPUACCT;
        }
        h->controllers = roles;
        h->version = v2 ? CORRAL_CGROUP_V2 : CORRAL_CGROUP_V1;
        out->version |= h->version;
        out->controllers |= roles;
        out->n++;
    }
    return out->n ? 0 : -ENOENT;
}

int corral_cgroup_version(void)
{
    struct corral_cgroup_info *info = malloc(sizeof *info);
    if (!info) return -ENOMEM;
    int rc = corral_cgroup_info(info);
    if (rc == 0) rc = info->version;
    free(info);
    return rc;
}

static int valid_name(const char *name)
{
    size_t len = strlen(name);
    return len > 0 && len < 200 && !strchr(name, '/') && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

static int write_limits(struct corral_cgroup *cg, const struct corral_cgroup_limits *lim)
{
    char num[64];
    int rc;
    for (size_t i = 0; i < cg->n; i++) {
        const struct cg_dir *d = &cg->d[i];
        int v1 = d->version == CORRAL_CGROUP_V1;
        if ((d->roles & CORRAL_CG_MEMORY) && v1) {
            /* Inherited from the parent at creation in v1; an OOM that cannot kill
             * would freeze the tenant instead of ending it. */
            if ((rc = write_in(d->path, "memory.oom_control", "0")) < 0) return rc;
        }
        if ((d->roles & CORRAL_CG_MEMORY) && lim->memory_bytes) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)lim->memory_bytes);
            if ((rc = write_in(d->path, v1 ? "memory.limit_in_bytes" : "memory.max", num)) < 0)
                return rc;
            cg->held |= CORRAL_CG_MEMORY;
            /* Without these, swap is memory the cap does not see. memsw may only be set
             * at or above limit_in_bytes, hence after it. */
            const char *sw = v1 ? "memory.memsw.limit_in_bytes" : "memory.swap.max";
            if (exists_in(d->path, sw)) {
                if ((rc = write_in(d->path, sw, v1 ? num : "0")) < 0) return rc;
                cg->held |= CORRAL_CG_MEMSW;
            }
        }
        if ((d->roles & CORRAL_CG_PIDS) && lim->pids) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)lim->pids);
            if ((rc = write_in(d->path, "pids.max", num)) < 0) return rc;
            cg->held |= CORRAL_CG_PIDS;
        }
        if ((d->roles & CORRAL_CG_CPU) && lim->cpu_quota_us) {
            unsigned period = lim->cpu_period_us ? lim->cpu_period_us : 100000;
            if (v1) {
                snprintf(num, sizeof num, "%u", period);
                if ((rc = write_in(d->path, "cpu.cfs_period_us", num)) < 0) return rc;
                snprintf(num, sizeof num, "%u", lim->cpu_quota_us);
                if ((rc = write_in(d->path, "cpu.cfs_quota_us", num)) < 0) return rc;
            } else {
                snprintf(num, sizeof num, "%u %u", lim->cpu_quota_us, period);
                if ((rc = write_in(d->path, "cpu.max", num)) < 0) return rc;
            }
            cg->held |= CORRAL_CG_CPU;
        }
    }
    return 0;
}

int corral_cgroup_create(const char *name, const struct corral_cgroup_limits *limits,
                         struct corral_cgroup **out)
{
    static unsigned counter;
    static const struct corral_cgroup_limits none;
    char generated[64];
    *out = NULL;
    if (!limits) limits = &none;
    if (!name) {
        snprintf(generated, sizeof generated, "corral-%d-%u", (int)getpid(),
                 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        name = generated;
    }
    if (!valid_name(name)) return -EINVAL;

    _cleanup_free_ struct corral_cgroup_info *info = malloc(sizeof *info);
    if (!info) return -ENOMEM;
    int rc = corral_cgroup_info(info);
    if (rc < 0) return rc;
    unsigned need = (limits->memory_bytes ? CORRAL_CG_MEMORY : 0) |
                    (limits->pids ? CORRAL_CG_PIDS : 0) |
                    (limits->cpu_quota_us ? CORRAL_CG_CPU : 0);
    if ((info->controllers & need) != need) return -EOPNOTSUPP;

    struct corral_cgroup *cg = calloc(1, sizeof *cg);
    if (!cg) return -ENOMEM;
    for (size_t i = 0; i < info->n && rc == 0; i++) {
        const struct corral_cgroup_hier *h = &info->hier[i];
        char *path;
        if (asprintf(&path, "%s/%s", h->dir, name) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (mkdir(path, 0755) < 0) {
            int err = errno;
            free(path);
            /* A hierarchy that only adds accounting may be unwritable (a read-only
             * cgroupfs in a container) without weakening any requested limit. */
            if (err == EEXIST || (h->controllers & need)) rc = -err;
            continue;
        }
        struct cg_dir *d = &cg->d[cg->n++];
        d->path = path;
        d->roles = h->controllers;
        d->version = h->version;
        if (d->version == CORRAL_CGROUP_V2 && exists_in(path, "cgroup.kill"))
            d->roles |= CORRAL_CG_KILL;
        char procs[PATH_MAX];
        snprintf(procs, sizeof procs, "%s/cgroup.procs", path);
        d->procs_fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (d->procs_fd < 0) rc = -errno;
    }
    if (rc == 0) rc = write_limits(cg, limits);
    if (rc == 0 && (cg->held & need) != need) rc = -EOPNOTSUPP;
    if (rc < 0) {
        corral_cgroup_destroy(cg);
        return rc;
    }
    *out = cg;
    return 0;
}

static int write_fd(int fd, const char *text, size_t len)
{
    ssize_t w;
    do
        w = write(fd, text, len);
    while (w < 0 && errno == EINTR);
    if (w < 0) return -errno;
    return (size_t)w == len ? 0 : -EIO;
}

int corral_cgroup_attach(struct corral_cgroup *cg, pid_t pid)
{
    if (!cg || pid <= 0) return -EINVAL;
    char num[24];
    int len = snprintf(num, sizeof num, "%d", (int)pid);
    for (size_t i = 0; i < cg->n; i++) {
        if (cg->d[i].procs_fd < 0) return -EBADF;
        int rc = write_fd(cg->d[i].procs_fd, num, (size_t)len);
        if (rc < 0) return rc;
    }
    return 0;
}

int corral_cgroup_attach_self_fds(const struct corral_cgroup *cg)
{
    if (!cg) return -EINVAL;
    for (size_t i = 0; i < cg->n; i++) {
        if (cg->d[i].procs_fd < 0) return -EBADF;
        int rc = write_fd(cg->d[i].procs_fd, "0", 1);
        if (rc < 0) return rc;
    }
    return 0;
}

int corral_cgroup_usage(const struct corral_cgroup *cg, struct corral_cgroup_usage *out)
{
    memset(out, 0, sizeof *out);
    if (!cg) return -EINVAL;
    int rc = 0;
    const struct cg_dir *cpu_v1 = NULL, *cpu_v2 = NULL;
    for (size_t i = 0; i < cg->n; i++) {
        const struct cg_dir *d = &cg->d[i];
        if (!d->path) continue;
        int v1 = d->version == CORRAL_CGROUP_V1;
        if (d->roles & CORRAL_CG_MEMORY) {
            _cleanup_free_ char *events = NULL;
            rc = read_u64(d->path, v1 ? "memory.usage_in_bytes" : "memory.current",
                          &out->memory_current);
            if (rc == 0 && read_u64(d->path, v1 ? "memory.max_usage_in_bytes" : "memory.peak",
                                    &out->memory_peak) < 0)
                out->memory_peak = out->memory_current;
            if (rc == 0)
                rc = read_in(d->path, v1 ? "memory.oom_control" : "memory.events", &events);
            if (rc == 0) rc = keyed_u64(events, "oom_kill", &out->oom_kills);
            if (rc < 0) return rc;
            out->have |= CORRAL_CG_MEMORY;
        }
        if (d->roles & CORRAL_CG_PIDS) {
            if ((rc = read_u64(d->path, "pids.current", &out->pids_current)) < 0) return rc;
            out->have |= CORRAL_CG_PIDS;
        }
        if (d->roles & CORRAL_CG_CPUACCT) {
            if (v1)
                cpu_v1 = d;
            else
                cpu_v2 = d;
        }
    }
    /* cpuacct counts nanoseconds; v2's cpu.stat microseconds. Prefer the finer one. */
    if (cpu_v1) {
        if ((rc = read_u64(cpu_v1->path, "cpuacct.usage", &out->cpu_ns)) < 0) return rc;
        out->have |= CORRAL_CG_CPUACCT;
    } else if (cpu_v2) {
        _cleanup_free_ char *stat = NULL;
        uint64_t usec;
        rc = read_in(cpu_v2->path, "cpu.stat", &stat);
        if (rc == 0) rc = keyed_u64(stat, "usage_usec", &usec);
        if (rc < 0) return rc;
        out->cpu_ns = usec * 1000;
        out->have |= CORRAL_CG_CPUACCT;
    }
    return 0;
}

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return (x > y) - (x < y);
}

static int list_procs(const char *dir, pid_t **pids, size_t *n)
{
    _cleanup_free_ char *text = NULL;
    int rc = read_in(dir, "cgroup.procs", &text);
    if (rc < 0) return rc;
    size_t count = 0, cap = 16;
    pid_t *v = malloc(cap * sizeof *v);
    if (!v) return -ENOMEM;
    for (char *p = text; *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) break;
        if (count == cap) {
            pid_t *bigger = realloc(v, cap * 2 * sizeof *v);
            if (!bigger) {
                free(v);
                return -ENOMEM;
            }
            v = bigger;
            cap *= 2;
        }
        v[count++] = (pid_t)pid;
        p = end;
        while (*p == '\n')
            p++;
    }
    qsort(v, count, sizeof *v, cmp_pid);
    *pids = v;
    *n = count;
    return 0;
}

/* One pass of SIGKILL over the processes listed in dir; returns how many were listed.
 * A pid is pinned with a pidfd, the listing is read again, and the signal goes through
 * the pidfd only to a pid listed both times: if the signal is delivered, the pinned
 * process was alive during the second listing, so it held that pid then and was in
 * this cgroup, never a recycled pid. */
static int kill_pass(const char *dir)
{
    _cleanup_free_ pid_t *first = NULL, *second = NULL;
    _cleanup_free_ int *fds = NULL;
    size_t n1 = 0, n2 = 0;
    int rc = list_procs(dir, &first, &n1);
    if (rc < 0) return rc == -ENOENT ? 0 : rc;
    if (n1 == 0) return 0;
    if (!(fds = malloc(n1 * sizeof *fds))) return -ENOMEM;
    pid_t self = getpid();
    for (size_t i = 0; i < n1; i++) {
        if (first[i] == self) {
            for (size_t j = 0; j < i; j++)
                if (fds[j] >= 0) close(fds[j]);
            return -EDEADLK;
        }
        fds[i] = (int)syscall(SYS_pidfd_open, first[i], 0);
        if (fds[i] < 0 && errno == ENOSYS) fds[i] = -2; /* before Linux 5.3: kill(2) */
    }
    rc = list_procs(dir, &second, &n2);
    for (size_t i = 0; i < n1; i++) {
        int listed = rc == 0 && bsearch(&first[i], second, n2, sizeof *second, cmp_pid);
        if (listed && fds[i] >= 0)
            syscall(SYS_pidfd_send_signal, fds[i], SIGKILL, NULL, 0);
        else if (listed && fds[i] == -2)
            kill(first[i], SIGKILL);
        if (fds[i] >= 0) close(fds[i]);
    }
    return (int)n1;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

int corral_cgroup_kill(struct corral_cgroup *cg)
{
    if (!cg) return -EINVAL;
    /* cgroup.kill would take the caller with it. */
    pid_t self = getpid();
    for (size_t i = 0; i < cg->n; i++) {
        _cleanup_free_ pid_t *pids = NULL;
        size_t n = 0;
        if (cg->d[i].path && list_procs(cg->d[i].path, &pids, &n) == 0 &&
            bsearch(&self, pids, n, sizeof *pids, cmp_pid))
            return -EDEADLK;
    }
    for (size_t i = 0; i < cg->n; i++)
        if (cg->d[i].path && (cg->d[i].roles & CORRAL_CG_KILL))
            write_in(cg->d[i].path, "cgroup.kill", "1"); /* else the passes below */

    /* Bounded: 1, 2, 4 … 32 ms, then 32 ms steps, about 2 s in all. A process that
     * was SIGKILLed cannot fork again, so each pass can only shrink the set. */
    long waited = 0;
    for (long step = 1;; step = step < 32 ? step * 2 : 32) {
        int listed = 0;
        for (size_t i = 0; i < cg->n; i++) {
            if (!cg->d[i].path) continue;
            int rc = kill_pass(cg->d[i].path);
            if (rc < 0) return rc;
            listed += rc;
        }
        if (listed == 0) return 0;
        if (waited >= 2000) return -EBUSY;
        pause_ms(step);
        waited += step;
    }
}

int corral_cgroup_remove(struct corral_cgroup *cg)
{
    if (!cg) return 0;
    int rc = corral_cgroup_kill(cg);
    for (size_t k = cg->n; k-- > 0;) {
        struct cg_dir *d = &cg->d[k];
        if (!d->path) continue;
        /* An exiting task may still be uncharging for a moment after it left
         * cgroup.procs; rmdir then says EBUSY. */
        int err = 0;
        for (int attempt = 0; attempt < 50; attempt++) {
            err = rmdir(d->path) < 0 ? errno : 0;
            if (err != EBUSY) break;
            pause_ms(10);
        }
        if (err == 0 || err == ENOENT) {
            free(d->path);
            d->path = NULL;
        } else if (rc == 0) {
            rc = -err;
        }
    }
    return rc;
}

void corral_cgroup_free(struct corral_cgroup *cg)
{
    if (!cg) return;
    for (size_t i = 0; i < cg->n; i++) {
        if (cg->d[i].procs_fd >= 0) close(cg->d[i].procs_fd);
        free(cg->d[i].path);
    }
    free(cg);
}

int corral_cgroup_destroy(struct corral_cgroup *cg)
{
    int rc = corral_cgroup_remove(cg);
    corral_cgroup_free(cg);
    return rc;
}

unsigned corral_cgroup_held(const struct corral_cgroup *cg)
{
    return cg ? cg->held : 0;
}

const char *corral_cgroup_path(const struct corral_cgroup *cg, size_t i, unsigned *controllers)
{
    if (!cg || i >= cg->n) return NULL;
    if (controllers) *controllers = cg->d[i].roles;
    return cg->d[i].path;
}
