/*
 * Namespace fds, setns/unshare, and id maps.
 *
 * A namespace is identified by the (st_dev, st_ino) pair of its nsfs inode; inode
 * numbers alone are only unique within one nsfs instance.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ns.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static const struct {
    const char *name;
    int type;
} kinds[] = {
    {"user", CLONE_NEWUSER},     {"mnt", CLONE_NEWNS},    {"pid", CLONE_NEWPID},
    {"net", CLONE_NEWNET},       {"ipc", CLONE_NEWIPC},   {"uts", CLONE_NEWUTS},
    {"cgroup", CLONE_NEWCGROUP}, {"time", CLONE_NEWTIME},
};

int corral_ns_type(const char *kind)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kind, kinds[i].name) == 0) return kinds[i].type;
    return -EINVAL;
}

const char *corral_ns_kind(int nstype)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (nstype == kinds[i].type) return kinds[i].name;
    return NULL;
}

int corral_ns_open(pid_t pid, const char *kind)
{
    if (corral_ns_type(kind) < 0 || pid < 0) return -EINVAL;
    char path[64];
    if (pid == 0)
        snprintf(path, sizeof path, "/proc/self/ns/%s", kind);
    else
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)pid, kind);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int corral_ns_setns(int fd, int nstype)
{
    return setns(fd, nstype) < 0 ? -errno : 0;
}

int corral_ns_unshare(int flags)
{
    return unshare(flags) < 0 ? -errno : 0;
}

int corral_ns_info(int fd, struct corral_ns_info *out)
{
    int type = ioctl(fd, NS_GET_NSTYPE);
    if (type < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    out->nstype = type;
    out->ino = (uint64_t)st.st_ino;
    out->dev = (uint64_t)st.st_dev;
    return 0;
}

int corral_ns_same(int fd1, int fd2)
{
    struct corral_ns_info a, b;
    int rc = corral_ns_info(fd1, &a);
    if (rc == 0) rc = corral_ns_info(fd2, &b);
    if (rc < 0) return rc;
    return a.ino == b.ino && a.dev == b.dev;
}

/* The kernel takes a map in one write() of less than a page (kernel/user_namespace.c
 * map_write: count >= PAGE_SIZE is EINVAL) and rejects a second write. */
static int format_map(char *buf, size_t size, const struct corral_id_map *m, size_t n)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (m[i].count == 0) return -EINVAL;
        int w =
            snprintf(buf + len, size - len, "%u %u %u\n", m[i].inside, m[i].outside, m[i].count);
        if (w < 0 || (size_t)w >= size - len) return -EINVAL;
        len += (size_t)w;
    }
    return (int)len;
}

static int write_file(pid_t pid, const char *name, const char *text, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t w = write(fd, text, len);
    int err = errno;
    close(fd);
    if (w < 0) return -err;
    return (size_t)w == len ? 0 : -EIO;
}

int corral_ns_write_maps(pid_t pid, const struct corral_id_map *uid, size_t nuid,
                         const struct corral_id_map *gid, size_t ngid)
{
    if (pid <= 0) return -EINVAL;
    char buf[4000];
    int len, rc;

    if (nuid > 0) {
        if ((len = format_map(buf, sizeof buf, uid, nuid)) < 0) return len;
        if ((rc = write_file(pid, "uid_map", buf, (size_t)len)) < 0) return rc;
    }
    if (ngid > 0) {
        if ((len = format_map(buf, sizeof buf, gid, ngid)) < 0) return len;
        rc = write_file(pid, "gid_map", buf, (size_t)len);
        /* A refused write leaves gid_map unwritten, so setgroups may still be set. */
        if (rc == -EPERM && write_file(pid, "setgroups", "deny", 4) == 0)
            rc = write_file(pid, "gid_map", buf, (size_t)len);
        if (rc < 0) return rc;
    }
    return 0;
}

struct new_net_job {
    int fd;
};

static void *new_net_thread(void *arg)
{
    struct new_net_job *job = arg;
    if (unshare(CLONE_NEWNET) < 0) {
        job->fd = -errno;
        return NULL;
    }
    job->fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (job->fd < 0) job->fd = -errno;
    return NULL;
}

int corral_ns_new_net(void)
{
    struct new_net_job job = {.fd = -EIO};
    pthread_t t;
    int r = pthread_create(&t, NULL, new_net_thread, &job);
    if (r != 0) return -r;
    pthread_join(t, NULL);
    return job.fd;
}
