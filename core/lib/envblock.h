/*
 * This process's own environment, and the block of it the kernel shows to others.
 *
 * unsetenv and clearenv only edit the `environ` array: the strings the process was
 * started with stay in the block on its stack, and /proc/PID/environ reads that block
 * (mm->env_start..env_end), so a same-user process can still read a variable "removed".
 */
#ifndef CORRAL_ENVBLOCK_H
#define CORRAL_ENVBLOCK_H

#include <stddef.h>

/*
 * Replaces this process's environment with the `n` strings of `keep` ("NAME=value"
 * each, copied; a string without a name and '=' is -EINVAL and nothing changes), and
 * overwrites the original block in place: zeros, except where a kept string still sits
 * as the process started with it, which stays where it is (a pointer a library took to
 * it keeps reading the same bytes). /proc/PID/environ then shows the kept strings and
 * nothing else. Returns 0 or -errno (-ENOMEM: the environment may then be partly
 * rebuilt). Not thread-safe, as setenv is not.
 */
int corral_environ_replace(const char *const *keep, size_t n);

#endif
