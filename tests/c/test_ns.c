/*
 * Namespace fds against the real kernel: comparing namespaces of live processes,
 * entering a child's network namespace and coming back, and id maps that make a child
 * root in its user namespace (as root, and as an unprivileged writer that needs
 * setgroups "deny"), and steps run inside another network namespace.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ns.h"

/* A child that runs step(i) each time the parent says "go", reporting an int back. */
struct child {
    pid_t pid;
    int to, from;
};

typedef int (*step_fn)(int i);

static int start_child(struct child *c, step_fn step)
{
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) < 0 || pipe2(up, O_CLOEXEC) < 0) return -1;
    c->pid = fork();
    if (c->pid < 0) return -1;
    if (c->pid == 0) {
        close(down[1]);
        close(up[0]);
        char go;
        for (int i = 0; read(down[0], &go, 1) == 1; i++) {
            int v = step(i);
            if (write(up[1], &v, sizeof v) != sizeof v) _exit(1);
        }
        _exit(0);
    }
    close(down[0]);
    close(up[1]);
    c->to = down[1];
    c->from = up[0];
    return 0;
}

static int child_step(struct child *c)
{
    int v = -1000;
    if (write(c->to, "g", 1) != 1 || read(c->from, &v, sizeof v) != sizeof v) return -1000;
    return v;
}

static int stop_child(struct child *c)
{
    int status = -1;
    close(c->to);
    close(c->from);
    waitpid(c->pid, &status, 0);
    return status;
}

static int step_unshare_net(int i)
{
    return i == 0 ? (unshare(CLONE_NEWNET) < 0 ? -errno : 0) : 0;
}

static int step_userns(int i)
{
    if (i == 0) return unshare(CLONE_NEWUSER) < 0 ? -errno : (int)getuid();
    return getuid() == 0 && getgid() == 0 ? 0 : (int)getuid();
}

static int read_int(const char *path)
{
    char buf[32] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n > 0 ? atoi(buf) : -1;
}

static void test_kinds(void)
{
    CHECK(corral_ns_type("net") == CLONE_NEWNET);
    CHECK(corral_ns_type("time") == 0x80);
    CHECK(corral_ns_type("network") == -EINVAL);
    CHECK(strcmp(corral_ns_kind(CLONE_NEWUSER), "user") == 0);
    CHECK(corral_ns_kind(0) == NULL);

    /* Every kind opens on this kernel (the control for the refusals below). */
    static const char *const all[] = {"user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        int fd = corral_ns_open(0, all[i]);
        struct corral_ns_info info;
        CHECK(fd >= 0 && corral_ns_info(fd, &info) == 0 && info.nstype == corral_ns_type(all[i]) &&
              info.ino != 0);
        CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
        close(fd);
    }
    CHECK(corral_ns_open(0, "pid_for_children") == -EINVAL);
    CHECK(corral_ns_open(0, "../status") == -EINVAL);

    /* A regular file is not a namespace fd. */
    int f = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    struct corral_ns_info info;
    CHECK(f >= 0 && corral_ns_info(f, &info) == -ENOTTY);
    close(f);
}

static void test_compare_and_setns(void)
{
    struct child c;
    CHECK(start_child(&c, step_unshare_net) == 0);
    int self = corral_ns_open(0, "net");
    int before = corral_ns_open(c.pid, "net");
    /* Control: two processes in one network namespace compare equal. */
    CHECK(corral_ns_same(self, before) == 1);
    CHECK(child_step(&c) == 0);
    int after = corral_ns_open(c.pid, "net");
    CHECK(corral_ns_same(self, after) == 0);
    CHECK(corral_ns_same(before, after) == 0);

    /* Into the child's netns and back. The wrong nstype is refused before anything
     * changes; the right one and 0 (any) are accepted. */
    CHECK(corral_ns_setns(after, CLONE_NEWUTS) == -EINVAL);
    int cur = corral_ns_open(0, "net");
    CHECK(corral_ns_same(cur, self) == 1);
    close(cur);
    CHECK(corral_ns_setns(after, CLONE_NEWNET) == 0);
    cur = corral_ns_open(0, "net");
    CHECK(corral_ns_same(cur, after) == 1 && corral_ns_same(cur, self) == 0);
    close(cur);
    CHECK(corral_ns_setns(self, 0) == 0);
    cur = corral_ns_open(0, "net");
    CHECK(corral_ns_same(cur, self) == 1);
    close(cur);

    CHECK(stop_child(&c) == 0);
    close(self);
    close(before);
    close(after);
}

static void test_unshare(void)
{
    /* In a forked child so that this process keeps its namespaces. */
    pid_t pid = fork();
    if (pid == 0) {
        int orig = corral_ns_open(0, "uts");
        int ok = corral_ns_unshare(CLONE_NEWUTS) == 0;
        int now = corral_ns_open(0, "uts");
        ok = ok && corral_ns_same(orig, now) == 0;
        ok = ok && corral_ns_unshare(-1) == -EINVAL;
        _exit(ok ? 0 : 1);
    }
    int status;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && status == 0);
}

static void test_maps_as_root(void)
{
    int overflow = read_int("/proc/sys/kernel/overflowuid");
    struct child c;
    CHECK(start_child(&c, step_userns) == 0);
    /* Control: unmapped, the child is the overflow uid, not root. */
    CHECK(overflow > 0 && child_step(&c) == overflow);
    struct corral_id_map m = {0, 0, 1};
    CHECK(corral_ns_write_maps(c.pid, &m, 1, &m, 1) == 0);
    CHECK(child_step(&c) == 0);
    /* The kernel takes one write per map. */
    CHECK(corral_ns_write_maps(c.pid, &m, 1, NULL, 0) == -EPERM);
    CHECK(stop_child(&c) == 0);

    struct corral_id_map empty = {0, 0, 0};
    CHECK(corral_ns_write_maps(getpid(), &empty, 1, NULL, 0) == -EINVAL);
}

/* An unprivileged writer may map only its own ids, and its own gid only once setgroups
 * is "deny": write_maps must take that route by itself. */
static void test_maps_unprivileged(void)
{
    int status = -1, p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    pid_t writer = fork();
    if (writer == 0) {
        const uid_t id = 64999;
        int r[3] = {-1, -1, -1};
        if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
            _exit(2);
        /* Changing uid made the process non-dumpable, which gives its /proc files (and
         * its child's) to root. */
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        struct child c;
        if (start_child(&c, step_userns) < 0) _exit(3);
        if (child_step(&c) < 0) _exit(4); /* the child unshared its user namespace */
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/gid_map", (int)c.pid);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        /* Denial: a plain gid_map write without setgroups "deny". */
        r[0] = fd >= 0 && write(fd, "0 64999 1\n", 10) < 0 ? errno : 0;
        close(fd);
        struct corral_id_map m = {0, id, 1};
        r[1] = corral_ns_write_maps(c.pid, &m, 1, &m, 1);
        r[2] = child_step(&c);
        if (write(p[1], r, sizeof r) != sizeof r) _exit(5);
        _exit(stop_child(&c) == 0 ? 0 : 6);
    }
    close(p[1]);
    int r[3] = {-1, -1, -1};
    CHECK(read(p[0], r, sizeof r) == sizeof r);
    close(p[0]);
    CHECK(waitpid(writer, &status, 0) == writer && status == 0);
    CHECK(r[0] == EPERM);
    CHECK(r[1] == 0);
    CHECK(r[2] == 0); /* root inside, uid and gid */
}

/* What a corral_ns_run_in step saw of its own thread. */
struct seen {
    struct stat net;
    int all_blocked;
};

static int look(void *arg)
{
    struct seen *s = arg;
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    s->all_blocked = sigismember(&cur, SIGTERM) == 1 && sigismember(&cur, SIGUSR1) == 1 &&
                     sigismember(&cur, SIGCHLD) == 1;
    if (stat("/proc/thread-self/ns/net", &s->net) < 0) return -errno;
    return 7; /* passed back as it is */
}

static int same_inode(const struct stat *a, int fd)
{
    struct stat b;
    return fstat(fd, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

static void test_run_in(void)
{
    int host = corral_ns_open(0, "net"), mnt = corral_ns_open(0, "mnt");
    int a = corral_ns_new_net(), b = corral_ns_new_net();
    CHECK(host >= 0 && mnt >= 0 && a >= 0 && b >= 0);
    CHECK(corral_ns_same(a, b) == 0 && corral_ns_same(a, host) == 0);

    struct seen s = {.all_blocked = 0};
    CHECK(corral_ns_run_in(a, look, &s) == 7);
    CHECK(same_inode(&s.net, a));
    CHECK(!same_inode(&s.net, b) && !same_inode(&s.net, host));
    CHECK(s.all_blocked);
    /* Control: another netns is seen as itself, not as a. */
    memset(&s, 0, sizeof s);
    CHECK(corral_ns_run_in(b, look, &s) == 7);
    CHECK(same_inode(&s.net, b) && !same_inode(&s.net, a));

    /* The caller never moved, and its own mask is as it was. */
    struct stat self;
    sigset_t cur;
    CHECK(stat("/proc/thread-self/ns/net", &self) == 0 && same_inode(&self, host));
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    CHECK(sigismember(&cur, SIGUSR1) == 0);

    /* No netns entered, no step run. */
    memset(&s, 0, sizeof s);
    CHECK(corral_ns_run_in(-1, look, &s) == -EBADF);
    CHECK(corral_ns_run_in(mnt, look, &s) == -EINVAL);
    CHECK(s.net.st_ino == 0);

    /* A socket made in a belongs to a (the identity check's control: not to b). */
    int fd = corral_ns_socket(a, AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    CHECK(corral_ns_socket_is(fd, a) == 1 && corral_ns_socket_is(fd, b) == 0);
    CHECK(corral_ns_socket(mnt, AF_INET, SOCK_DGRAM, 0) == -EINVAL);
    close(fd);
    close(a);
    close(b);
    close(mnt);
    close(host);
}

static void *idle_thread(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static int userns_same(int a_fd, const char *path)
{
    struct stat a, b;
    return fstat(a_fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

static void *setns_thread(void *arg)
{
    int *fd = arg;
    *fd = setns(*fd, CLONE_NEWNET) < 0 ? errno : 0;
    return NULL;
}

/* What an unprivileged, threaded caller can do with a netns in a user namespace of its
 * own; each entry of r is 1 when it held. */
enum {
    U_HOST_NETNS_REFUSED, /* the attempt: new_net needs CAP_SYS_ADMIN it lacks */
    U_MADE,               /* the control: one in a user namespace of its own */
    U_OWNER_FOREIGN,      /* corral_ns_owner names that user namespace */
    U_OWNER_OWN,          /* and -1 for the caller's own netns */
    U_THREAD_REFUSED,     /* a thread of it cannot enter that netns */
    U_RUN_IN,             /* corral_ns_run_in does, with every signal blocked */
    U_CALLER_UNMOVED,     /* the caller is still in its own netns and user namespace */
    U_SOCKET,             /* a socket made there belongs to it */
    U_BIND_LOW,           /* the caller (its owner) binds port 53 there */
    U_BIND_LOW_HOST,      /* control of the capability: not in its own netns */
    U_OWN_NETNS,          /* its own netns needs no entering: a socket is made there */
    U_NO_FD_LEFT,         /* nothing left open */
    U_COUNT
};

static void test_run_in_unprivileged(void)
{
    int p[2], status = -1;
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        const uid_t id = 64998;
        int r[U_COUNT] = {0};
        if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
            _exit(2);
        /* As a process started by this uid is: its own /proc files (uid_map) are its own. */
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        pthread_t idle;
        if (pthread_create(&idle, NULL, idle_thread, NULL) != 0) _exit(3);
        int fds = count_fds();
        int host = corral_ns_open(0, "net");
        int made = corral_ns_new_net();
        r[U_HOST_NETNS_REFUSED] = made == -EPERM;
        int a = corral_ns_new_net_in_userns();
        r[U_MADE] = a >= 0;
        int owner = -2, own = -2;
        r[U_OWNER_FOREIGN] = corral_ns_owner(a, &owner) == 0 && owner >= 0 &&
                             !userns_same(owner, "/proc/self/ns/user");
        r[U_OWNER_OWN] = corral_ns_owner(host, &own) == 0 && own == -1;
        int arg = a;
        pthread_t t;
        r[U_THREAD_REFUSED] = pthread_create(&t, NULL, setns_thread, &arg) == 0 &&
                              pthread_join(t, NULL) == 0 && arg == EPERM;
        struct seen s = {.all_blocked = 0};
        r[U_RUN_IN] = corral_ns_run_in(a, look, &s) == 7 && same_inode(&s.net, a) && s.all_blocked;
        struct stat self;
        r[U_CALLER_UNMOVED] = stat("/proc/thread-self/ns/net", &self) == 0 &&
                              same_inode(&self, host) && !userns_same(owner, "/proc/self/ns/user");
        int fd = corral_ns_socket(a, AF_INET, SOCK_DGRAM, 0);
        r[U_SOCKET] = fd >= 0 && corral_ns_socket_is(fd, a) == 1 &&
                      corral_ns_socket_is(fd, host) == 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC);
        struct sockaddr_in low = {.sin_family = AF_INET, .sin_port = htons(53)};
        r[U_BIND_LOW] = fd >= 0 && bind(fd, (struct sockaddr *)&low, sizeof low) == 0;
        int hfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        r[U_BIND_LOW_HOST] =
            hfd >= 0 && bind(hfd, (struct sockaddr *)&low, sizeof low) < 0 && errno == EACCES;
        close(hfd);
        hfd = corral_ns_socket(host, AF_INET, SOCK_DGRAM, 0);
        /* in the host's netns, not a: there port 53 stays refused */
        r[U_OWN_NETNS] =
            hfd >= 0 && bind(hfd, (struct sockaddr *)&low, sizeof low) < 0 && errno == EACCES;
        close(hfd);
        close(fd);
        close(owner);
        close(a);
        close(host);
        r[U_NO_FD_LEFT] = count_fds() == fds;
        if (write(p[1], r, sizeof r) != sizeof r) _exit(4);
        _exit(0);
    }
    close(p[1]);
    int r[U_COUNT] = {0};
    CHECK(read(p[0], r, sizeof r) == sizeof r);
    close(p[0]);
    CHECK(waitpid(pid, &status, 0) == pid && status == 0);
    for (int i = 0; i < U_COUNT; i++) {
        if (!r[i]) fprintf(stderr, "unprivileged run_in: entry %d did not hold\n", i);
        CHECK(r[i]);
    }
}

int main(void)
{
    test_kinds();
    test_compare_and_setns();
    test_unshare();
    test_maps_as_root();
    test_maps_unprivileged();
    test_run_in();
    test_run_in_unprivileged();
    return DONE();
}
