/*
 * The run's certificate authority (see tls_ca.h), through OpenSSL 3's EVP and X509 APIs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "tls_ca.h"

#define LEAVES_MAX 256
#define VALID_SECONDS (7L * 86400)

struct leaf {
    char *name;
    X509 *cert;
    EVP_PKEY *key;
};

struct corral_tls_ca {
    EVP_PKEY *key;
    X509 *cert;
    char *pem;
    struct leaf leaves[LEAVES_MAX];
    size_t n;
};

static EVP_PKEY *p256_key(void)
{
    return EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
}

/* A random positive 127-bit serial, as RFC 5280 asks (at most 20 octets, unique). */
static int set_serial(X509 *x)
{
    unsigned char b[16];
    if (RAND_bytes(b, sizeof b) != 1) return -1;
    b[0] &= 0x7f;
    BIGNUM *bn = BN_bin2bn(b, sizeof b, NULL);
    if (!bn) return -1;
    int ok = BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok ? 0 : -1;
}

static int add_ext(X509 *issuer, X509 *x, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!e) return -1;
    int ok = X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok ? 0 : -1;
}

/* A certificate for key with subject CN cn, valid an hour back (clock skew) to a week on. */
static X509 *new_cert(EVP_PKEY *key, const char *cn)
{
    X509 *x = X509_new();
    if (!x) return NULL;
    X509_NAME *subject = X509_get_subject_name(x);
    if (X509_set_version(x, 2) != 1 || set_serial(x) < 0 ||
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), VALID_SECONDS) || X509_set_pubkey(x, key) != 1 ||
        X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC, (const unsigned char *)"corral run",
                                   -1, -1, 0) != 1 ||
        X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1,
                                   0) != 1) {
        X509_free(x);
        return NULL;
    }
    return x;
}

int corral_tls_ca_new(struct corral_tls_ca **out)
{
    struct corral_tls_ca *ca = calloc(1, sizeof *ca);
    if (!ca) return -ENOMEM;
    ca->key = p256_key();
    ca->cert = ca->key ? new_cert(ca->key, "corral run CA") : NULL;
    if (!ca->cert || X509_set_issuer_name(ca->cert, X509_get_subject_name(ca->cert)) != 1 ||
        add_ext(ca->cert, ca->cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
        add_ext(ca->cert, ca->cert, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
        add_ext(ca->cert, ca->cert, NID_subject_key_identifier, "hash") < 0 ||
        X509_sign(ca->cert, ca->key, EVP_sha256()) <= 0)
        goto fail;
    BIO *b = BIO_new(BIO_s_mem());
    if (!b) goto fail;
    char *mem;
    long n = PEM_write_bio_X509(b, ca->cert) == 1 ? BIO_get_mem_data(b, &mem) : -1;
    if (n > 0 && (ca->pem = malloc((size_t)n + 1))) {
        memcpy(ca->pem, mem, (size_t)n);
        ca->pem[n] = '\0';
    }
    BIO_free(b);
    if (!ca->pem) goto fail;
    *out = ca;
    return 0;
fail:
    corral_tls_ca_free(ca);
    return -ENOMEM;
}

void corral_tls_ca_free(struct corral_tls_ca *ca)
{
    if (!ca) return;
    for (size_t i = 0; i < ca->n; i++) {
        free(ca->leaves[i].name);
        X509_free(ca->leaves[i].cert);
        EVP_PKEY_free(ca->leaves[i].key);
    }
    X509_free(ca->cert);
    EVP_PKEY_free(ca->key);
    free(ca->pem);
    free(ca);
}

const char *corral_tls_ca_pem(const struct corral_tls_ca *ca)
{
    return ca->pem;
}

X509 *corral_tls_ca_cert(const struct corral_tls_ca *ca)
{
    return ca->cert;
}

static X509 *mint(struct corral_tls_ca *ca, const char *name, EVP_PKEY *key)
{
    unsigned char bin[16];
    int is_ip = inet_pton(AF_INET, name, bin) == 1 || inet_pton(AF_INET6, name, bin) == 1;
    char san[300];
    if (strlen(name) > 253) return NULL;
    snprintf(san, sizeof san, "%s:%s", is_ip ? "IP" : "DNS", name);
    X509 *x = new_cert(key, name);
    if (!x) return NULL;
    if (X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) != 1 ||
        add_ext(ca->cert, x, NID_subject_alt_name, san) < 0 ||
        add_ext(ca->cert, x, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
        add_ext(ca->cert, x, NID_key_usage, "critical,digitalSignature") < 0 ||
        add_ext(ca->cert, x, NID_ext_key_usage, "serverAuth") < 0 ||
        add_ext(ca->cert, x, NID_authority_key_identifier, "keyid:always") < 0 ||
        X509_sign(x, ca->key, EVP_sha256()) <= 0) {
        X509_free(x);
        return NULL;
    }
    return x;
}

int corral_tls_ca_leaf(struct corral_tls_ca *ca, const char *name, X509 **cert, EVP_PKEY **key)
{
    for (size_t i = 0; i < ca->n; i++) {
        if (strcmp(ca->leaves[i].name, name) == 0) {
            *cert = ca->leaves[i].cert;
            *key = ca->leaves[i].key;
            return 0;
        }
    }
    if (ca->n == LEAVES_MAX) return -ENOSPC;
    struct leaf l = {strdup(name), NULL, p256_key()};
    if (l.name && l.key) l.cert = mint(ca, name, l.key);
    if (!l.cert) {
        free(l.name);
        EVP_PKEY_free(l.key);
        return -EINVAL;
    }
    ca->leaves[ca->n++] = l;
    *cert = l.cert;
    *key = l.key;
    return 0;
}
