/*
 * Ed25519 through OpenSSL 3 (see sign.h). Ed25519 signs the message itself (no
 * separate digest), so EVP_DigestSign is called once with a NULL digest.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sign.h"
#include "util.h"

static void free_pkey(EVP_PKEY **k)
{
    EVP_PKEY_free(*k);
}
static void free_bio(BIO **b)
{
    BIO_free(*b);
}
static void free_mdctx(EVP_MD_CTX **c)
{
    EVP_MD_CTX_free(*c);
}
#define _cleanup_pkey_ __attribute__((cleanup(free_pkey)))
#define _cleanup_bio_ __attribute__((cleanup(free_bio)))
#define _cleanup_mdctx_ __attribute__((cleanup(free_mdctx)))

static int is_ed25519(EVP_PKEY *k)
{
    return k != NULL && EVP_PKEY_get_id(k) == EVP_PKEY_ED25519;
}

/* The PEM of key (private: PKCS#8, unencrypted; else SubjectPublicKeyInfo), malloc'd. */
static int pem_of(EVP_PKEY *key, int private, char **out, size_t *out_len)
{
    _cleanup_bio_ BIO *bio = BIO_new(BIO_s_mem());
    if (bio == NULL) return -ENOMEM;
    int ok = private ? PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL)
                     : PEM_write_bio_PUBKEY(bio, key);
    if (!ok) return -EINVAL;
    char *data;
    long n = BIO_get_mem_data(bio, &data);
    if (n <= 0) return -EINVAL;
    *out = malloc((size_t)n + 1);
    if (*out == NULL) return -ENOMEM;
    memcpy(*out, data, (size_t)n);
    (*out)[n] = '\0';
    *out_len = (size_t)n;
    return 0;
}

static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The new key's PEM into a fresh 0600 file at tmp. */
static int write_new_key(const char *tmp)
{
    _cleanup_pkey_ EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (key == NULL) return -ENOMEM;
    _cleanup_free_ char *pem = NULL;
    size_t len = 0;
    int r = pem_of(key, 1, &pem, &len);
    if (r < 0) return r;
    _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    r = write_all(fd, pem, len);
    OPENSSL_cleanse(pem, len);
    if (r == 0 && fsync(fd) < 0) r = -errno;
    return r;
}

int corral_key_ensure(const char *path, int *created)
{
    *created = 0;
    struct stat st;
    if (lstat(path, &st) == 0) return S_ISREG(st.st_mode) ? 0 : -EINVAL;
    if (errno != ENOENT) return -errno;
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.new.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    unlink(tmp); /* a file of that name is a dead process's: a live one with this pid is this one */
    int r = write_new_key(tmp);
    if (r == 0 && link(tmp, path) < 0)
        r = errno == EEXIST ? 1 : -errno; /* 1: another made it first */
    unlink(tmp);
    if (r == 0) *created = 1;
    return r < 0 ? r : 0;
}

static int load_private(const char *path, EVP_PKEY **key)
{
    _cleanup_bio_ BIO *bio = BIO_new_file(path, "r");
    if (bio == NULL) return errno ? -errno : -ENOENT;
    *key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
    if (!is_ed25519(*key)) {
        EVP_PKEY_free(*key);
        *key = NULL;
        return -EINVAL;
    }
    return 0;
}

static int load_public(const char *pem, size_t len, EVP_PKEY **key)
{
    if (len > INT_MAX) return -EINVAL;
    _cleanup_bio_ BIO *bio = BIO_new_mem_buf(pem, (int)len);
    if (bio == NULL) return -ENOMEM;
    *key = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    if (!is_ed25519(*key)) {
        EVP_PKEY_free(*key);
        *key = NULL;
        return -EINVAL;
    }
    return 0;
}

static int raw_public(EVP_PKEY *key, uint8_t raw[CORRAL_ED25519_RAW_LEN])
{
    size_t n = CORRAL_ED25519_RAW_LEN;
    if (EVP_PKEY_get_raw_public_key(key, raw, &n) != 1 || n != CORRAL_ED25519_RAW_LEN)
        return -EINVAL;
    return 0;
}

int corral_key_public(const char *path, char **pem, uint8_t raw[CORRAL_ED25519_RAW_LEN])
{
    _cleanup_pkey_ EVP_PKEY *key = NULL;
    int r = load_private(path, &key);
    if (r < 0) return r;
    size_t len;
    r = pem_of(key, 0, pem, &len);
    if (r < 0) return r;
    return raw_public(key, raw);
}

int corral_key_sign(const char *path, const void *msg, size_t len,
                    uint8_t sig[CORRAL_ED25519_SIG_LEN])
{
    _cleanup_pkey_ EVP_PKEY *key = NULL;
    int r = load_private(path, &key);
    if (r < 0) return r;
    _cleanup_mdctx_ EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) return -ENOMEM;
    size_t n = CORRAL_ED25519_SIG_LEN;
    if (EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) != 1 ||
        EVP_DigestSign(ctx, sig, &n, msg, len) != 1 || n != CORRAL_ED25519_SIG_LEN)
        return -EINVAL;
    return 0;
}

int corral_pub_raw(const char *pem, size_t pem_len, uint8_t raw[CORRAL_ED25519_RAW_LEN])
{
    _cleanup_pkey_ EVP_PKEY *key = NULL;
    int r = load_public(pem, pem_len, &key);
    return r < 0 ? r : raw_public(key, raw);
}

int corral_pub_verify(const char *pub_pem, size_t pem_len, const void *msg, size_t len,
                      const uint8_t *sig, size_t sig_len)
{
    _cleanup_pkey_ EVP_PKEY *key = NULL;
    int r = load_public(pub_pem, pem_len, &key);
    if (r < 0) return r;
    _cleanup_mdctx_ EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) return -ENOMEM;
    if (EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) != 1) return -EINVAL;
    return EVP_DigestVerify(ctx, sig, sig_len, msg, len) == 1 ? 0 : -EBADMSG;
}

int corral_b64_encode(const void *in, size_t len, char *out)
{
    if (len > (size_t)INT_MAX / 4 * 3) return -EINVAL;
    return EVP_EncodeBlock((unsigned char *)out, in, (int)len);
}

/* EVP_DecodeBlock skips surrounding blanks and counts padding as zero bytes: the text
 * is checked to be padded base64 alone first, and the padding taken off the count. */
int corral_b64_decode(const char *in, size_t len, uint8_t *out)
{
    if (len % 4 != 0 || len > INT_MAX) return -EINVAL;
    size_t pad = 0;
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        int alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '+' || c == '/';
        if (c == '=' && i + 2 >= len && in[len - 1] == '=')
            pad++;
        else if (!alpha || pad > 0)
            return -EINVAL;
    }
    if (len == 0) return 0;
    int n = EVP_DecodeBlock(out, (const unsigned char *)in, (int)len);
    if (n < 0) return -EINVAL;
    return n - (int)pad;
}
