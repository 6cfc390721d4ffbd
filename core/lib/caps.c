/*
 * Capability dropping through libcap. A uid-0 process that clears only its effective set
 * gets everything back at the next execve; the bounding, inheritable and ambient sets and
 * a locked SECBIT_NOROOT make the drop survive exec.
 */
#include <errno.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <linux/securebits.h>

#include "caps.h"

void *corral_caps_empty(void)
{
    return cap_init();
}

void corral_caps_free(void *caps)
{
    if (caps) cap_free(caps);
}

/* keep < 0: every capability goes; otherwise keep stays in the bounding, inheritable,
 * permitted, effective and ambient sets, so that it survives execve under NOROOT. */
static int drop_all_but(void *empty, int keep)
{
    /* Lock the securebits first, while CAP_SETPCAP is still held, so uid 0 gains
     * nothing from execve or setuid fixups. EPERM means CAP_SETPCAP is already gone;
     * the empty bounding set below then ensures the same. */
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0 && errno != EPERM) return -errno;
    /* Bounding set next: removing from it needs CAP_SETPCAP, which goes last.
     * cap_max_bits() is the running kernel's count, which may exceed the headers'. Each
     * is dropped unread (dropping one already gone succeeds; reading each first cost ~40
     * system calls more) and read only when its drop fails. */
    for (cap_value_t c = 0; c < (cap_value_t)cap_max_bits(); c++) {
        if (c == keep || cap_drop_bound(c) == 0) continue;
        int err = errno;
        if (cap_get_bound(c) <= 0) continue; /* gone already (EPERM), or unknown */
        /* Without CAP_SETPCAP (e.g. inside bubblewrap as root) the bounding set
         * cannot shrink; under no_new_privs execve can gain nothing from it
         * (the new permitted set is capped by the old, empty one). */
        if (err == EPERM && prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1) break;
        return -err;
    }
    /* One call clears the ambient set (libcap's cap_reset_ambient reads every
     * capability's ambient bit first: ~40 system calls more). */
    if (CAP_AMBIENT_SUPPORTED() && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return -errno;
    if (keep >= 0) {
        cap_value_t v = (cap_value_t)keep;
        cap_flag_t sets[] = {CAP_EFFECTIVE, CAP_PERMITTED, CAP_INHERITABLE};
        for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
            if (cap_set_flag((cap_t)empty, sets[i], 1, &v, CAP_SET) < 0) return -errno;
    }
    if (cap_set_proc((cap_t)empty) < 0) return -errno;
    if (keep >= 0 && cap_set_ambient((cap_value_t)keep, CAP_SET) < 0) return -errno;
    return 0;
}

int corral_caps_drop_all_with(void *empty)
{
    return drop_all_but(empty, -1);
}

int corral_caps_drop_all_but(int keep)
{
    void *caps = corral_caps_empty();
    if (!caps) return -errno;
    int r = drop_all_but(caps, keep);
    corral_caps_free(caps);
    return r;
}

int corral_caps_drop_all(void)
{
    void *empty = corral_caps_empty();
    if (!empty) return -errno;
    int r = corral_caps_drop_all_with(empty);
    corral_caps_free(empty);
    return r;
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
