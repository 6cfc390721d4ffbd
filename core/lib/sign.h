/*
 * Ed25519 signatures through OpenSSL 3's EVP_PKEY interface, never code of our own: the
 * host key (made at first use, a PKCS#8 PEM file of mode 0600), signing with it, the
 * public key as PEM and raw bytes, verification against a public key, and the base64 of
 * the receipts' envelope (EVP_EncodeBlock / EVP_DecodeBlock).
 *
 * This unit and its binding (core/lua/l_sign.c) are the only code linked against
 * libcrypto, and only into corral/sign.so, which `require "corral.sign"` loads when a
 * receipt is signed or verified: neither the host, core.so nor the confinement wrapper
 * maps libcrypto at start-up.
 *
 * Every function returns 0 (or a length) or -errno: -ENOENT no key file, -EINVAL a key
 * or input OpenSSL cannot parse (or a key that is not Ed25519), -EBADMSG a signature
 * that does not verify, -ENOMEM. Nothing prints.
 */
#ifndef CORRAL_SIGN_H
#define CORRAL_SIGN_H

#include <stddef.h>
#include <stdint.h>

#define CORRAL_ED25519_RAW_LEN 32
#define CORRAL_ED25519_SIG_LEN 64

/* Makes an Ed25519 key at path unless one is there: written to a temporary file beside
 * it (O_EXCL, 0600, O_NOFOLLOW), synced, then linked into place, so that a reader never
 * sees half a key and two first uses at once keep one key. *created is 1 when this call
 * made it. The directory must exist. */
int corral_key_ensure(const char *path, int *created);

/* The public half of the private key at path: its SubjectPublicKeyInfo PEM (malloc'd,
 * NUL-terminated, into *pem) and its 32 raw bytes. */
int corral_key_public(const char *path, char **pem, uint8_t raw[CORRAL_ED25519_RAW_LEN]);

/* Signs msg with the private key at path. */
int corral_key_sign(const char *path, const void *msg, size_t len,
                    uint8_t sig[CORRAL_ED25519_SIG_LEN]);

/* The raw bytes of an Ed25519 public key given as PEM (SubjectPublicKeyInfo). */
int corral_pub_raw(const char *pem, size_t pem_len, uint8_t raw[CORRAL_ED25519_RAW_LEN]);

/* 0 when sig is pub_pem's signature of msg, -EBADMSG when it is not, -EINVAL when the
 * key cannot be read. */
int corral_pub_verify(const char *pub_pem, size_t pem_len, const void *msg, size_t len,
                      const uint8_t *sig, size_t sig_len);

/* Base64 (RFC 4648, padded, no line breaks). encode: out holds 4 * ceil(len / 3) + 1
 * bytes; returns the text's length. decode: out holds 3 * (len / 4) bytes; returns the
 * decoded length, or -EINVAL for anything but padded base64 text. */
int corral_b64_encode(const void *in, size_t len, char *out);
int corral_b64_decode(const char *in, size_t len, uint8_t *out);

#endif
