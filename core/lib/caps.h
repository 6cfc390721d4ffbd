/* Capabilities through libcap: read the current sets, drop every one of them. */
#ifndef CORRAL_CAPS_H
#define CORRAL_CAPS_H

#include <stddef.h>

/* Clears the bounding, ambient, inheritable, permitted and effective sets and locks
 * the securebits so that a uid-0 process regains nothing across execve. The bounding set
 * shrinks only while CAP_SETPCAP is held (it is dropped last); without it the bounding
 * set is left whole when no_new_privs is already set, and -EPERM returned otherwise.
 * Returns 0 or -errno. */
int corral_caps_drop_all(void);

/* The async-signal-safe form for a child forked from a possibly multi-threaded parent:
 * `empty` comes from corral_caps_empty() in the parent, so nothing allocates here. */
int corral_caps_drop_all_with(void *empty);

/* As corral_caps_drop_all, but keep stays held in every set and survives execve (as an
 * ambient capability). Returns 0 or -errno. */

int corral_caps_drop_all_but(int keep);

/* An empty capability state for corral_caps_drop_all_with; free with corral_caps_free. */
void *corral_caps_empty(void);
void corral_caps_free(void *caps);

/* Writes the current effective/permitted/inheritable sets as libcap text ("=" when
 * empty) into buf. Returns 0 or -errno. */
int corral_caps_text(char *buf, size_t len);

/* 1 when the calling process holds the capability in its effective set, 0 when not,
 * -errno on failure. */
int corral_caps_have(int cap);

#endif
