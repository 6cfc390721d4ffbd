/*
 * build/bench/egress (run by scripts/bench/egress): three processes on loopback —
 * a server (sink, banner or echo), a relay (an acceptor listener and
 * corral_relay in one epoll loop, as the host runs it: accept,
 * corral_relay_add_connect with mark 42) and the client (main), which measures
 * the same thing direct to the server and through the relay, interleaved so
 * both see the same background load. egress [MiB [rounds [connects
 * [concurrent]]]]
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "listen.h"
#include "relay.h"
#include "sock.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what, int err)
{
    fprintf(stderr, "egress bench: %s: %s\n", what, strerror(err < 0 ? -err : err));
    exit(1);
}

/* ---- server: sink (count, reply with the count at EOF), banner (1 byte,
 * close), echo ---- */
enum { SINK, BANNER, ECHO };
struct sconn {
    int fd;
    uint64_t count;
};

static void server(int l, int mode)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    static char buf[1 << 18];
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            struct sconn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
                    if (mode == BANNER) {
                        if (write(fd, "!", 1) != 1) {
                        }
                        close(fd);
                        continue;
                    }
                    c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            ssize_t r = read(c->fd, buf, sizeof buf);
            if (r > 0) {
                c->count += (uint64_t)r;
                if (mode == ECHO && write(c->fd, buf, (size_t)r) != r) {
                }
                continue;
            }
            if (mode == SINK && write(c->fd, &c->count, sizeof c->count) < 0) {
            }
            close(c->fd);
            free(c);
        }
    }
}

/* ---- relay: the acceptor and the loop ---- */
static void relay_proc(int l, int upstream_port)
{
    struct corral_relay *r;
    int err = corral_relay_new(&r);
    if (err) die("relay", err);
    struct sockaddr_storage ss;
    socklen_t len;
    corral_sockaddr_from("127.0.0.1", upstream_port, &ss, &len);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    fcntl(l, F_SETFL, O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 1};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    ev.data.u32 = 2;
    epoll_ctl(ep, EPOLL_CTL_ADD, corral_relay_fd(r), &ev);
    struct corral_relay_event events[256];
    for (;;) {
        struct epoll_event evs[8];
        int n = epoll_wait(ep, evs, 8, -1);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == 1) {
                int fd;
                while ((fd = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0)
                    corral_relay_add_connect(r, fd, (struct sockaddr *)&ss, len, 42, 5000, NULL,
                                             NULL);
            } else {
                while (corral_relay_run(r, 0, events, 256) == 256) {
                }
            }
        }
    }
}

static int connect_to(int port)
{
    int fd = corral_tcp_connect("127.0.0.1", port, 5000);
    if (fd < 0) die("connect", fd);
    return fd;
}

/* ---- client measurements ---- */
static double transfer(int port, uint64_t bytes)
{
    static char buf[1 << 18];
    memset(buf, 'x', sizeof buf);
    int fd = connect_to(port);
    double t0 = now_s();
    uint64_t sent = 0;
    while (sent < bytes) {
        size_t k = bytes - sent < sizeof buf ? (size_t)(bytes - sent) : sizeof buf;
        ssize_t w = write(fd, buf, k);
        if (w <= 0) die("write", errno);
        sent += (uint64_t)w;
    }
    shutdown(fd, SHUT_WR);
    uint64_t got = 0;
    if (read(fd, &got, sizeof got) != sizeof got || got != bytes) die("sink count", EPROTO);
    double t = now_s() - t0;
    close(fd);
    return (double)bytes / t;
}

/* CPU seconds (user + system) a process has used so far. */
static double cpu_s(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long ut = 0, st = 0;
    if (f) {
        if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
            ut = st = 0;
        fclose(f);
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double one_connect(int port)
{
    double t0 = now_s();
    int fd = connect_to(port);
    char b;
    if (read(fd, &b, 1) != 1) die("banner", EPROTO);
    double t = now_s() - t0;
    close(fd);
    return t * 1e6;
}

/* Direct and relayed samples alternate, so both see the same background load.
 */
static void latency(int dport, int rport, int n, double q[4])
{
    double *d = malloc(sizeof *d * (size_t)n), *r = malloc(sizeof *r * (size_t)n);
    for (int i = -200; i < n; i++) {
        double x = one_connect(dport), y = one_connect(rport);
        if (i >= 0) d[i] = x, r[i] = y;
    }
    qsort(d, (size_t)n, sizeof *d, cmp);
    qsort(r, (size_t)n, sizeof *r, cmp);
    q[0] = d[n / 2], q[1] = d[n * 99 / 100], q[2] = r[n / 2], q[3] = r[n * 99 / 100];
    free(d);
    free(r);
}

static double round_trip(int fd, char *buf, int size)
{
    double t0 = now_s();
    if (write(fd, buf, (size_t)size) != size) die("write", errno);
    int got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf, (size_t)(size - got));
        if (r <= 0) die("echo", EPROTO);
        got += (int)r;
    }
    return (now_s() - t0) * 1e6;
}

/* Round trips of `size` bytes on one open connection each to the echo server,
 * direct and relayed alternating. */
static void pingpong(int dport, int rport, int n, int size, double q[4])
{
    double *d = malloc(sizeof *d * (size_t)n), *r = malloc(sizeof *r * (size_t)n);
    char buf[4096];
    memset(buf, 'p', sizeof buf);
    int fd = connect_to(dport), fr = connect_to(rport);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fr, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = -500; i < n; i++) {
        double x = round_trip(fd, buf, size), y = round_trip(fr, buf, size);
        if (i >= 0) d[i] = x, r[i] = y;
    }
    close(fd);
    close(fr);
    qsort(d, (size_t)n, sizeof *d, cmp);
    qsort(r, (size_t)n, sizeof *r, cmp);
    q[0] = d[n / 2], q[1] = d[n * 99 / 100], q[2] = r[n / 2], q[3] = r[n * 99 / 100];
    free(d);
    free(r);
}

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static int count_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    if (!d) return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 2;
}

static int netns = -1;

/* Listeners as the acceptor makes them (backlog SOMAXCONN), in this netns. */
static int listener(int *port)
{
    if (netns < 0) netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    return corral_listen_in_netns(netns, SOCK_STREAM, "127.0.0.1", 0, port);
}

static pid_t spawn_server(int mode, int *port)
{
    int l = listener(port);
    if (l < 0) die("listen", l);
    fcntl(l, F_SETFL, O_NONBLOCK);
    pid_t pid = fork();
    if (pid == 0) server(l, mode);
    close(l);
    return pid;
}

static pid_t spawn_relay(int upstream_port, int *port)
{
    int l = listener(port);
    if (l < 0) die("listen", l);
    pid_t pid = fork();
    if (pid == 0) relay_proc(l, upstream_port);
    close(l);
    return pid;
}

static void stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void pin(pid_t pid, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(pid, sizeof set, &set);
}

/* Connect + first byte, and 64-byte round trips. With one_cpu, all three processes share
 * CPU 0: what the relay's own work adds, without the cost of waking another CPU (in a
 * VM, possibly a halted vCPU) at each hop. */
static void latency_report(int n, int one_cpu)
{
    int sport, rport;
    double q[4];
    cpu_set_t saved;
    sched_getaffinity(0, sizeof saved, &saved);
    pid_t s = spawn_server(BANNER, &sport), r = spawn_relay(sport, &rport);
    if (one_cpu) {
        pin(s, 0);
        pin(r, 0);
        pin(0, 0);
    }
    latency(sport, rport, n, q);
    stop(r);
    stop(s);
    printf("connect + first byte, %d connections (us)%s:\n", n,
           one_cpu ? ", all three processes on one CPU" : "");
    printf("  direct                 p50 %7.1f   p99 %7.1f\n", q[0], q[1]);
    printf("  through the relay      p50 %7.1f   p99 %7.1f\n", q[2], q[3]);
    printf("  added by the relay     p50 %7.1f   p99 %7.1f   (target p50 <= 100)\n", q[2] - q[0],
           q[3] - q[1]);
    printf("  relay / direct         p50 %7.2f\n", q[2] / q[0]);

    s = spawn_server(ECHO, &sport);
    r = spawn_relay(sport, &rport);
    if (one_cpu) {
        pin(s, 0);
        pin(r, 0);
    }
    pingpong(sport, rport, n * 4, 64, q);
    stop(r);
    stop(s);
    printf("round trip of 64 bytes on an open connection, %d round trips (us)%s:\n", n * 4,
           one_cpu ? ", one CPU" : "");
    printf("  direct                 p50 %7.1f   p99 %7.1f\n", q[0], q[1]);
    printf("  through the relay      p50 %7.1f   p99 %7.1f\n", q[2], q[3]);
    printf("  added by the relay     p50 %7.1f   p99 %7.1f\n", q[2] - q[0], q[3] - q[1]);
    sched_setaffinity(0, sizeof saved, &saved);
}

int main(int argc, char **argv)
{
    uint64_t bytes = (argc > 1 ? strtoull(argv[1], NULL, 10) : 1024) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int lat_n = argc > 3 ? atoi(argv[3]) : 5000;
    int conc = argc > 4 ? atoi(argv[4]) : 1000;
    struct rlimit rl = {65536, 65536};
    setrlimit(RLIMIT_NOFILE, &rl);
    signal(SIGPIPE, SIG_IGN);

    int sport, rport;
    /* throughput: best of `rounds`, alternating direct and relayed */
    pid_t s = spawn_server(SINK, &sport), r = spawn_relay(sport, &rport);
    double direct = 0, relayed = 0, cpu_direct = 0, cpu_relayed = 0, cpu_relay = 0;
    for (int i = 0; i < rounds; i++) {
        double c0 = cpu_s(getpid()) + cpu_s(s) + cpu_s(r);
        double d = transfer(sport, bytes);
        double c1 = cpu_s(getpid()) + cpu_s(s) + cpu_s(r), rc1 = cpu_s(r);
        double x = transfer(rport, bytes);
        double c2 = cpu_s(getpid()) + cpu_s(s) + cpu_s(r);
        cpu_direct += c1 - c0;
        cpu_relayed += c2 - c1;
        cpu_relay += cpu_s(r) - rc1;
        if (d > direct) direct = d;
        if (x > relayed) relayed = x;
    }
    stop(r);
    stop(s);
    printf("throughput, %llu MiB one way (best of %d):\n", (unsigned long long)(bytes >> 20),
           rounds);
    printf("  direct loopback        %8.0f MiB/s\n", direct / 1048576);
    printf("  through the relay      %8.0f MiB/s\n", relayed / 1048576);
    printf("  relay / direct         %8.2f   (target >= 0.90)\n", relayed / direct);
    double gib = (double)bytes * rounds / 1073741824.0;
    printf("  CPU s per GiB, all processes: direct %.2f, relayed %.2f (the relay "
           "process %.2f)\n",
           cpu_direct / gib, cpu_relayed / gib, cpu_relay / gib);

    latency_report(lat_n, 0);
    latency_report(lat_n, 1);

    /* concurrency */
    s = spawn_server(ECHO, &sport);
    r = spawn_relay(sport, &rport);
    usleep(50000);
    long rss0 = rss_kb(r);
    int fds0 = count_fds(r);
    int *fds = malloc(sizeof *fds * (size_t)conc);
    double t0 = now_s();
    for (int i = 0; i < conc; i++)
        fds[i] = connect_to(rport);
    for (int i = 0; i < conc; i++)
        if (write(fds[i], &i, sizeof i) != sizeof i) die("write", errno);
    int ok = 0;
    for (int i = 0; i < conc; i++) {
        int v = -1;
        struct pollfd p = {fds[i], POLLIN, 0};
        if (poll(&p, 1, 5000) == 1 && read(fds[i], &v, sizeof v) == sizeof v && v == i) ok++;
    }
    double t = now_s() - t0;
    long rss1 = rss_kb(r);
    int fds1 = count_fds(r);
    printf("concurrency: %d connections through one relay loop, all open at once:\n", conc);
    printf("  echoed correctly       %d / %d   in %.1f ms (connect + round trip, "
           "all)\n",
           ok, conc, t * 1000);
    printf("  relay fds              %d -> %d   (%.1f per connection)\n", fds0, fds1,
           (double)(fds1 - fds0) / conc);
    printf("  relay RSS              %ld -> %ld KiB   (%.1f KiB per connection)\n", rss0, rss1,
           (double)(rss1 - rss0) / conc);
    for (int i = 0; i < conc; i++)
        close(fds[i]);
    free(fds);
    stop(r);
    stop(s);
    return ok == conc ? 0 : 1;
}
