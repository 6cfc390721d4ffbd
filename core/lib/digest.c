/*
 * SHA-256 (see digest.h). The kernel's AF_ALG socket is tried first on every call: it is
 * two syscalls, and a kernel built without it answers EAFNOSUPPORT at once. libcrypto is
 * opened once with dlopen and kept for the life of the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/if_alg.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "digest.h"

#ifndef AF_ALG
#define AF_ALG 38
#endif

static int send_all(int fd, const uint8_t *p, size_t len)
{
    /* MSG_MORE on every chunk but the last: the kernel finishes the hash only then. An
     * empty message still has to be sent once, so that the empty string hashes. */
    do {
        size_t n = len > 65536 ? 65536 : len;
        ssize_t w = send(fd, p, n, len > n ? MSG_MORE : 0);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        p += w;
        len -= (size_t)w;
    } while (len > 0);
    return 0;
}

static int sha256_af_alg(const void *data, size_t len, uint8_t out[CORRAL_SHA256_LEN])
{
    int tfm = socket(AF_ALG, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (tfm < 0) return -errno;
    struct sockaddr_alg sa = {.salg_family = AF_ALG};
    memcpy(sa.salg_type, "hash", 5);
    memcpy(sa.salg_name, "sha256", 7);
    int r = 0, op = -1;
    if (bind(tfm, (struct sockaddr *)&sa, sizeof sa) < 0) r = -errno;
    if (r == 0 && (op = accept4(tfm, NULL, 0, SOCK_CLOEXEC)) < 0) r = -errno;
    if (r == 0) r = send_all(op, data, len);
    if (r == 0) {
        ssize_t n;
        do
            n = read(op, out, CORRAL_SHA256_LEN);
        while (n < 0 && errno == EINTR);
        if (n < 0)
            r = -errno;
        else if (n != CORRAL_SHA256_LEN)
            r = -EIO;
    }
    if (op >= 0) close(op);
    close(tfm);
    return r;
}

/* OpenSSL's one-shot EVP_Digest, stable across 1.1 and 3.x. */
typedef const void *(*evp_md_fn)(void);
typedef int (*evp_digest_fn)(const void *, size_t, unsigned char *, unsigned int *, const void *,
                             void *);
static evp_md_fn evp_sha256;
static evp_digest_fn evp_digest;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void open_libcrypto(void)
{
    static const char *const names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        evp_md_fn md = (evp_md_fn)dlsym(h, "EVP_sha256");
        evp_digest_fn dg = (evp_digest_fn)dlsym(h, "EVP_Digest");
        if (md && dg) {
            evp_sha256 = md;
            evp_digest = dg;
            return; /* kept open for the process's life */
        }
        dlclose(h);
    }
}

static int sha256_libcrypto(const void *data, size_t len, uint8_t out[CORRAL_SHA256_LEN])
{
    pthread_once(&crypto_once, open_libcrypto);
    if (!evp_digest) return -ENOSYS;
    unsigned int size = 0;
    if (evp_digest(data, len, out, &size, evp_sha256(), NULL) != 1 || size != CORRAL_SHA256_LEN)
        return -EIO;
    return 0;
}

int corral_sha256(const void *data, size_t len, uint8_t out[CORRAL_SHA256_LEN],
                  const char **backend)
{
    int r = sha256_af_alg(data, len, out);
    if (r == 0) {
        if (backend) *backend = "af_alg";
        return 0;
    }
    /* Only "the kernel has no such API" falls back; any other failure of a kernel that
     * has it is reported. */
    if (r != -EAFNOSUPPORT && r != -ENOENT && r != -EPROTONOSUPPORT) return r;
    r = sha256_libcrypto(data, len, out);
    if (r == 0 && backend) *backend = "libcrypto";
    return r;
}
