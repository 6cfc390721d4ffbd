/* A sandbox's own disk (see disk.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk.h"
#include "mountapi.h"
#include "util.h"

#ifndef LOOP_CONFIGURE
#define LOOP_CONFIGURE 0x4C0A
#endif

int corral_disk_open(const char *path, uint64_t create_bytes, uint64_t *bytes)
{
    int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC | (create_bytes ? O_CREAT | O_EXCL : 0);
    _cleanup_close_ int fd = open(path, flags, 0600);
    if (fd < 0) return -errno;
    if (create_bytes && ftruncate(fd, (off_t)create_bytes) < 0) {
        int err = -errno;
        unlink(path);
        return err;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) return -EPERM;
    *bytes = (uint64_t)st.st_size;
    return corral_take_fd(&fd);
}

/* The image on a free loop device: its fd, or -errno. */
static int configure_loop(int image_fd, int *nr)
{
    _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) return -errno;
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (__u32)image_fd;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    /* Between GET_FREE and CONFIGURE another process may take the same device: EBUSY,
     * and the next free one is asked for. */
    for (int attempt = 0; attempt < 16; attempt++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) return -errno;
        char dev[32];
        snprintf(dev, sizeof dev, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) return -errno;
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
            *nr = n;
            return fd;
        }
        int err = errno;
        close(fd);
        if (err != EBUSY) return -err;
    }
    return -EBUSY;
}

int corral_disk_attach(int image_fd, const char *fstype, int *loop)
{
    int nr = -1;
    /* Closed on every path: once the mount holds the device, AUTOCLEAR waits for it. */
    _cleanup_close_ int dev = configure_loop(image_fd, &nr);
    if (dev < 0) return dev;
    _cleanup_close_ int fs = sys_fsopen(fstype, FSOPEN_CLOEXEC);
    if (fs < 0) return -errno;
    char source[32];
    snprintf(source, sizeof source, "/dev/loop%d", nr);
    if (sys_fsconfig(fs, FSCONFIG_SET_STRING, "source", source, 0) < 0 ||
        sys_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        return -errno;
    int m = sys_fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (m < 0) return -errno;
    if (loop) *loop = nr;
    return m;
}
