/*
 * SHA-256 through an implementation the system keeps, never one of our own: the
 * kernel's crypto API (AF_ALG "hash"/"sha256") where the kernel offers it, else
 * OpenSSL's libcrypto, loaded at the first use (no link-time dependency, so neither the
 * host's start-up nor core.so pays for it). A kernel without
 * CONFIG_CRYPTO_USER_API_HASH fails socket(AF_ALG) with EAFNOSUPPORT.
 */
#ifndef CORRAL_DIGEST_H
#define CORRAL_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define CORRAL_SHA256_LEN 32

/* Hashes len bytes at data into out. Returns 0, or -errno (-ENOSYS when neither the
 * kernel nor libcrypto can hash here); *backend, when not NULL, is set to a static
 * name: "af_alg" or "libcrypto". */
int corral_sha256(const void *data, size_t len, uint8_t out[CORRAL_SHA256_LEN],
                  const char **backend);

#endif
