/*
 * The fuzz targets' regression corpora replayed on every `make test`, not only under
 * `make fuzz` (which needs clang and libFuzzer): each file of tests/fuzz/corpus/sni and
 * tests/fuzz/corpus/dns (seeds and every crash ever found) goes through its target's
 * own entry point, with the target's own checks (tests/fuzz/fuzz_sni.c, fuzz_dns.c), in
 * a child of its own so that a failed check (a trap) names the input instead of ending
 * the run. Run from the repository's root (scripts/run-tests does).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define LLVMFuzzerTestOneInput fuzz_sni_one
#define check_name sni_check_name
#include "../fuzz/fuzz_sni.c"
#undef LLVMFuzzerTestOneInput
#undef check_name
#undef ASSERT

#define LLVMFuzzerTestOneInput fuzz_dns_one
#define check_name dns_check_name
#include "../fuzz/fuzz_dns.c"
#undef LLVMFuzzerTestOneInput
#undef check_name
#undef ASSERT

#define CORPUS "tests/fuzz/corpus/"
#define INPUT_MAX (1 << 20)

typedef int (*target_fn)(const uint8_t *, size_t);

/* Runs fn on the file's bytes in a child: 1 when its checks held, else 0. */
static int replay_one(target_fn fn, const char *path)
{
    static uint8_t buf[INPUT_MAX];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 0) return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        fn(buf, (size_t)n);
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Replays every regular file of CORPUS<name>; returns how many there were. */
static int replay(const char *name, target_fn fn)
{
    char dir[256], path[512];
    snprintf(dir, sizeof dir, CORPUS "%s", name);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "FAIL %s: %s (run from the repository's root)\n", dir, strerror(errno));
        return 0;
    }
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
        count++;
        int ok = replay_one(fn, path);
        if (!ok) fprintf(stderr, "FAIL %s: the target's checks did not hold\n", path);
        CHECK(ok);
    }
    closedir(d);
    return count;
}

int main(void)
{
    int sni = replay("sni", fuzz_sni_one);
    int dns = replay("dns", fuzz_dns_one);
    NOTE("replayed %d SNI and %d DNS corpus inputs\n", sni, dns);
    CHECK(sni >= 9); /* the corpora as committed: an empty or missing one is a failure */
    CHECK(dns >= 30);
    return DONE();
}
