/*
 * Namespace fds, setns/unshare, id maps, and steps run inside another netns.
 *
 * A namespace is identified by the (st_dev, st_ino) pair of its nsfs inode; inode
 * numbers alone are only unique within one nsfs instance.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <linux/sockios.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ns.h"
#include "util.h"

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

static int write_proc(pid_t pid, const char *name, const char *text, size_t len)
{
    char path[64];
    if (pid == 0)
        snprintf(path, sizeof path, "/proc/self/%s", name);
    else
        snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    return corral_write_file(path, text, len);
}

int corral_ns_write_maps(pid_t pid, const struct corral_id_map *uid, size_t nuid,
                         const struct corral_id_map *gid, size_t ngid)
{
    if (pid < 0) return -EINVAL;
    char buf[4000];
    int len, rc;

    if (nuid > 0) {
        if ((len = format_map(buf, sizeof buf, uid, nuid)) < 0) return len;
        if ((rc = write_proc(pid, "uid_map", buf, (size_t)len)) < 0) return rc;
    }
    if (ngid > 0) {
        if ((len = format_map(buf, sizeof buf, gid, ngid)) < 0) return len;
        rc = write_proc(pid, "gid_map", buf, (size_t)len);
        /* A refused write leaves gid_map unwritten, so setgroups may still be set. */
        if (rc == -EPERM && write_proc(pid, "setgroups", "deny", 4) == 0)
            rc = write_proc(pid, "gid_map", buf, (size_t)len);
        if (rc < 0) return rc;
    }
    return 0;
}

int corral_ns_owner(int ns_fd, int *foreign)
{
    *foreign = -1;
    _cleanup_close_ int owner = ioctl(ns_fd, NS_GET_USERNS);
    /* ENOTTY/EINVAL: not a namespace fd; EPERM: an owner beyond the caller's own user
     * namespace, which it could never enter. Either way setns decides, as before. */
    if (owner < 0) return errno == ENOTTY || errno == EINVAL || errno == EPERM ? 0 : -errno;
    struct stat mine, theirs;
    /* Unreadable: setns decides, as before (the caller's own is the usual case). */
    if (stat("/proc/self/ns/user", &mine) < 0 || fstat(owner, &theirs) < 0) return 0;
    if (mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino)
        *foreign = corral_take_fd(&owner);
    return 0;
}

struct thread_job {
    int userns_fd;  /* >= 0: entered before the netns (only in run_in_child) */
    int new_userns; /* 1: a new user namespace of the caller's own first (run_in_child) */
    int netns_fd;   /* -1: a new netns (unshare) instead of setns */
    int (*fn)(void *);
    void *arg;
    int rc;
};

/* A user namespace owned by the caller, mapping its own uid and gid to themselves (the
 * one map an unprivileged writer may set: setgroups denied first), entered by the caller.
 * Identity maps keep every id the caller's host id, so a child user namespace made
 * under it maps the same host id as one made directly under the host's. */
static int enter_own_userns(void)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER) < 0) return -errno;
    struct corral_id_map u = {uid, uid, 1}, g = {gid, gid, 1};
    return corral_ns_write_maps(0, &u, 1, &g, 1);
}

static int enter_and_run(struct thread_job *job)
{
    int r = 0;
    if (job->userns_fd >= 0)
        r = setns(job->userns_fd, CLONE_NEWUSER) < 0 ? -errno : 0;
    else if (job->new_userns)
        r = enter_own_userns();
    if (r < 0) return r;
    r = job->netns_fd >= 0 ? setns(job->netns_fd, CLONE_NEWNET) : unshare(CLONE_NEWNET);
    return r < 0 ? -errno : job->fn(job->arg);
}

static void *job_thread(void *arg)
{
    struct thread_job *job = arg;
    /* The thread exits right after fn; its netns reference goes with it, and no other
     * code ever runs on it, so nothing else is created in that netns by mistake. */
    job->rc = enter_and_run(job);
    return NULL;
}

static int run_on_thread(struct thread_job *job)
{
    sigset_t all, old;
    pthread_t t;
    /* Every signal blocked on the thread (it inherits the mask): no handler of the
     * host's ever runs while a thread of this process sits in another netns. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&t, NULL, job_thread, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) return -err;
    pthread_join(t, NULL);
    return job->rc;
}

CORRAL_OWN_STACK static int job_child(void *arg)
{
    struct thread_job *job = arg;
    job->rc = enter_and_run(job);
    return 0;
}

/* Stack of a corral_ns_run_in_child child, above one guard page. What runs there is
 * small (a socket, a libmnl handle), but a clone3 made there leaves its child (a
 * tenant's init, for its whole life) on a copy of it; pages are only ever touched as
 * used. */
#define CHILD_STACK_SIZE (1024 * 1024)
#define CHILD_GUARD_SIZE 4096

int corral_ns_run_in_child(int (*fn)(void *), void *arg, int exit_signal)
{
    char *stack = mmap(NULL, CHILD_GUARD_SIZE + CHILD_STACK_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return -errno;
    if (mprotect(stack, CHILD_GUARD_SIZE, PROT_NONE) < 0) {
        int err = errno;
        munmap(stack, CHILD_GUARD_SIZE + CHILD_STACK_SIZE);
        return -err;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = clone(fn, stack + CHILD_GUARD_SIZE + CHILD_STACK_SIZE,
                      CLONE_VM | CLONE_FILES | CLONE_VFORK | (exit_signal & CSIGNAL), arg);
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid > 0)
        while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
            ;
    munmap(stack, CHILD_GUARD_SIZE + CHILD_STACK_SIZE);
    return pid < 0 ? -err : 0;
}

static int run_in_child(struct thread_job *job)
{
    int r = corral_ns_run_in_child(job_child, job, 0);
    return r < 0 ? r : job->rc;
}

/* 1 when netns_fd is the calling thread's own netns; 0 when not, or when that cannot be
 * read (setns then decides, as before). */
static int is_own_netns(int netns_fd)
{
    struct stat mine, target;
    if (stat("/proc/thread-self/ns/net", &mine) < 0 || fstat(netns_fd, &target) < 0) return 0;
    return mine.st_dev == target.st_dev && mine.st_ino == target.st_ino;
}

/* fn on the calling thread, already in the netns: setns into the netns one is in
 * needs CAP_SYS_ADMIN all the same, which an unprivileged caller lacks. */
static int run_here(struct thread_job *job)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = job->fn(job->arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

int corral_ns_run_in(int netns_fd, int (*fn)(void *), void *arg)
{
    if (netns_fd < 0) return -EBADF;
    int r;
    if (is_own_netns(netns_fd)) {
        struct thread_job here = {-1, 0, netns_fd, fn, arg, -EINVAL};
        return run_here(&here);
    }
    int owner;
    r = corral_ns_owner(netns_fd, &owner);
    if (r < 0) return r;
    struct thread_job job = {owner, 0, netns_fd, fn, arg, -EINVAL};
    r = owner >= 0 ? run_in_child(&job) : run_on_thread(&job);
    if (owner >= 0) close(owner);
    return r;
}

int corral_ns_socket_is(int sock_fd, int netns_fd)
{
    _cleanup_close_ int ns = ioctl(sock_fd, SIOCGSKNS);
    if (ns < 0) return -errno;
    struct stat a, b;
    if (fstat(ns, &a) < 0 || fstat(netns_fd, &b) < 0) return -errno;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

struct socket_req {
    int domain, type, protocol;
};

static int open_socket(void *arg)
{
    struct socket_req *r = arg;
    int fd = socket(r->domain, r->type | SOCK_CLOEXEC, r->protocol);
    return fd < 0 ? -errno : fd;
}

int corral_ns_socket(int netns_fd, int domain, int type, int protocol)
{
    struct socket_req req = {domain, type, protocol};
    _cleanup_close_ int fd = corral_ns_run_in(netns_fd, open_socket, &req);
    if (fd < 0) return fd;
    int same = corral_ns_socket_is(fd, netns_fd);
    /* SIOCGSKNS needs CAP_NET_ADMIN over the socket's netns, which an unprivileged
     * caller lacks over the one it runs in; that one is where corral_ns_run_in made the
     * socket on the calling thread, after comparing it with netns_fd. */
    if (same == -EPERM && is_own_netns(netns_fd) == 1) same = 1;
    if (same < 0) return same;
    if (!same) return -EXDEV;
    return corral_take_fd(&fd);
}

static int open_own_netns(void *arg)
{
    (void)arg;
    int fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int corral_ns_new_net(void)
{
    struct thread_job job = {-1, 0, -1, open_own_netns, NULL, -EIO};
    return run_on_thread(&job);
}

int corral_ns_new_net_in_userns(void)
{
    struct thread_job job = {-1, 1, -1, open_own_netns, NULL, -EIO};
    return run_in_child(&job);
}
