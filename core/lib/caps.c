/*
 * Capability dropping through libcap. A uid-0 process that clears only its effective
 * set gets everything back at the next execve; clearing the bounding and inheritable
 * sets, the ambient set, and locking SECBIT_NOROOT is what makes the drop survive exec.
 */
#include <errno.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <linux/securebits.h>

#include "caps.h"

int corral_caps_drop_all(void)
{
    /* Bounding set first: removing from it needs CAP_SETPCAP, which goes last. */
    /* cap_max_bits() is the running kernel's count, which may exceed the headers'. */
    for (cap_value_t c = 0; c < (cap_value_t)cap_max_bits(); c++) {
        if (cap_drop_bound(c) < 0 && errno != EINVAL) return -errno;
    }
    if (CAP_AMBIENT_SUPPORTED() && cap_reset_ambient() < 0) return -errno;
    /* Lock the securebits so uid 0 gains nothing from execve or setuid fixups. Fails
     * with EPERM where we no longer hold CAP_SETPCAP; the empty bounding set already
     * ensures that, so only a real error is reported. */
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0 && errno != EPERM) return -errno;
    cap_t empty = cap_init();
    if (!empty) return -errno;
    int r = cap_set_proc(empty);
    int err = errno;
    cap_free(empty);
    return r < 0 ? -err : 0;
}

int corral_caps_text(char *buf, size_t len)
{
    cap_t cur = cap_get_proc();
    if (!cur) return -errno;
    ssize_t n;
    char *text = cap_to_text(cur, &n);
    int err = errno;
    cap_free(cur);
    if (!text) return -err;
    if ((size_t)n >= len) {
        cap_free(text);
        return -ENAMETOOLONG;
    }
    memcpy(buf, text, (size_t)n + 1);
    cap_free(text);
    return 0;
}

int corral_caps_have(int cap)
{
    cap_t cur = cap_get_proc();
    if (!cur) return -errno;
    cap_flag_value_t v = CAP_CLEAR;
    int r = cap_get_flag(cur, (cap_value_t)cap, CAP_EFFECTIVE, &v);
    int err = errno;
    cap_free(cur);
    if (r < 0) return -err;
    return v == CAP_SET;
}
