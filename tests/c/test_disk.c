/*
 * core/lib/disk.c against the real kernel: an image is created sparse and reopened at its
 * size; a symlink, a file others may write and one another user owns are refused; the
 * image, formatted, mounts as a detached tree on a loop device set to clear itself; a
 * write past its size fails with ENOSPC and a small one after it succeeds; and once the
 * last mount fd closes the loop device is free again and no fd is left open.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "disk.h"
#include "fs.h"

#define SIZE (16u << 20)

/* The loop device's backing file as sysfs shows it ("" once it is detached). */
static void backing_file(int loop, char *out, size_t len)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/block/loop%d/loop/backing_file", loop);
    out[0] = '\0';
    FILE *f = fopen(path, "re");
    if (f) {
        if (!fgets(out, (int)len, f)) out[0] = '\0';
        fclose(f);
    }
    out[strcspn(out, "\n")] = '\0';
}

static void refusals(void)
{
    uint64_t bytes = 0;
    CHECK(symlink(at("disk.img"), at("link.img")) == 0);
    CHECK(corral_disk_open(at("link.img"), 0, &bytes) == -ELOOP);
    int fd = open(at("wide.img"), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0 && fchmod(fd, 0666) == 0);
    if (fd >= 0) close(fd);
    CHECK(corral_disk_open(at("wide.img"), 0, &bytes) == -EPERM);
    fd = open(at("theirs.img"), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0 && fchown(fd, 4242, 4242) == 0);
    if (fd >= 0) close(fd);
    CHECK(corral_disk_open(at("theirs.img"), 0, &bytes) == -EPERM);
    /* An existing image is not created over. */
    CHECK(corral_disk_open(at("wide.img"), SIZE, &bytes) == -EEXIST);
}

static void a_disk_of_its_own(void)
{
    uint64_t bytes = 0;
    int img = corral_disk_open(at("disk.img"), SIZE, &bytes);
    CHECK(img >= 0 && bytes == SIZE);
    struct stat st;
    CHECK(fstat(img, &st) == 0 && st.st_blocks * 512 < SIZE / 4); /* sparse */
    if (img >= 0) close(img);
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "mkfs.ext4 -q -F -m 0 -E nodiscard %s", at("disk.img"));
    CHECK(system(cmd) == 0);
    img = corral_disk_open(at("disk.img"), 0, &bytes);
    CHECK(img >= 0 && bytes == SIZE);
    int loop = -1;
    int m = corral_disk_attach(img, "ext4", &loop);
    CHECK(m >= 0 && loop >= 0);
    close(img);
    char backing[PATH_MAX];
    backing_file(loop, backing, sizeof backing);
    CHECK(strcmp(backing, at("disk.img")) == 0);
    char flag[96];
    snprintf(flag, sizeof flag, "/sys/block/loop%d/loop/autoclear", loop);
    FILE *f = fopen(flag, "re");
    CHECK(f && fgetc(f) == '1');
    if (f) fclose(f);
    /* Attempt: twice the disk's size. */
    int fill = openat(m, "fill", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    CHECK(fill >= 0);
    static char block[1 << 20];
    size_t written = 0;
    int err = 0;
    for (int i = 0; i < 32; i++) {
        ssize_t n = write(fill, block, sizeof block);
        if (n < 0) {
            err = errno;
            break;
        }
        written += (size_t)n;
    }
    if (fill >= 0) close(fill);
    CHECK(err == ENOSPC && written < SIZE);
    /* Control: with room made, a small write lands. */
    CHECK(unlinkat(m, "fill", 0) == 0);
    int small = openat(m, "small", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    CHECK(small >= 0 && write(small, "ok\n", 3) == 3);
    if (small >= 0) close(small);
    close(m);
    /* The device clears itself once its last mount is gone. */
    for (int i = 0; i < 100; i++) {
        backing_file(loop, backing, sizeof backing);
        if (!backing[0]) break;
        struct timespec ms = {0, 10 * 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    CHECK(backing[0] == '\0');
}

int main(void)
{
    if (geteuid() != 0 || access("/dev/loop-control", W_OK) < 0 ||
        system("command -v mkfs.ext4 >/dev/null") != 0) {
        printf("%s: skipped (needs root, /dev/loop-control and mkfs.ext4)\n", __FILE__);
        return 0;
    }
    if (fixture_make("disk") < 0) return 1;
    int fds = count_fds();
    refusals();
    a_disk_of_its_own();
    CHECK(count_fds() == fds);
    CHECK(corral_remove_tree(fixture_root) == 0);
    return DONE();
}
