/*
 * What a page and a process cost on this machine, the unit behind the launch figures
 * (docs/sessions.md, "What a page costs here"): the first write to a fresh anonymous
 * page, the same after MADV_POPULATE_WRITE and inside a transparent huge page, a system
 * call, and vfork+exec+wait of a one-page static program and of /bin/true.
 *   cc -O2 -o /tmp/page_cost scripts/bench/page_cost.c && /tmp/page_cost
 * (the static program: cc -O2 -static -nostdlib -o /tmp/noop with _start calling exit).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { PAGES = 2048, SPAWNS = 200 };

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static char *fresh(size_t len)
{
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* microseconds per first write of each of PAGES pages from p */
static double touch(char *p)
{
    double t = now_us();
    for (long i = 0; i < PAGES; i++)
        p[i * 4096L] = 1;
    return (now_us() - t) / PAGES;
}

static double spawn(const char *path)
{
    double t = now_us();
    for (int i = 0; i < SPAWNS; i++) {
        pid_t c = vfork();
        if (c == 0) {
            execl(path, path, (char *)NULL);
            _exit(127);
        }
        if (c < 0) return -1;
        waitpid(c, NULL, 0);
    }
    return (now_us() - t) / SPAWNS;
}

int main(int argc, char **argv)
{
    size_t len = (size_t)PAGES * 4096;
    char *a = fresh(len), *b = fresh(len), *big = fresh(len + (2u << 20));
    if (!a || !b || !big) return perror("mmap"), 1;
    printf("first write to a fresh page:        %6.2f us\n", touch(a));
    if (madvise(b, len, MADV_POPULATE_WRITE) == 0)
        printf("the same, populated beforehand:     %6.2f us\n", touch(b));
    char *huge = (char *)(((uintptr_t)big + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    if (madvise(huge, len, MADV_HUGEPAGE) == 0)
        printf("the same, in a transparent huge page: %4.2f us\n", touch(huge));
    double t = now_us();
    for (int i = 0; i < 100000; i++)
        syscall(SYS_getppid);
    printf("a system call (getppid):            %6.2f us\n", (now_us() - t) / 100000);
    const char *noop = argc > 1 ? argv[1] : "/tmp/noop";
    if (access(noop, X_OK) == 0) printf("vfork+exec+wait, %s:     %6.0f us\n", noop, spawn(noop));
    printf("vfork+exec+wait, /bin/true:         %6.0f us\n", spawn("/bin/true"));
    return 0;
}
