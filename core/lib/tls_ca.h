/*
 * A run's own certificate authority (EC P-256) for the TLS connections corral terminates
 * (core/lib/intercept.h): its private key exists only in this process's memory, never in
 * a file; leaf certificates for a name are minted on demand, signed by it, and kept for
 * the run. The CA certificate alone is shown to the tenant (PEM), added to its trust.
 *
 * Built into corral/tls.so only (with intercept.c and core/lua/l_tls.c): the one module
 * linked against libssl, loaded when a run binds a secret.
 *
 * Every function returns 0 or -errno (-ENOMEM, -EINVAL for what OpenSSL refuses). Not
 * thread-safe by itself: intercept.c serialises minting.
 */
#ifndef CORRAL_TLS_CA_H
#define CORRAL_TLS_CA_H

#include <stddef.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

struct corral_tls_ca;

/* A new CA, valid from an hour ago (clock skew) for a week, its subject naming the run. */
int corral_tls_ca_new(struct corral_tls_ca **out);

/* Frees the CA, its key and every minted leaf. NULL is a no-op. */
void corral_tls_ca_free(struct corral_tls_ca *ca);

/* The CA certificate as PEM (a NUL-terminated string the CA owns). */
const char *corral_tls_ca_pem(const struct corral_tls_ca *ca);

/* The leaf certificate and key for name (a DNS name, or an IP literal: its SAN is then an
 * IP address), minted at the first call and kept: *cert and *key stay the CA's. */
int corral_tls_ca_leaf(struct corral_tls_ca *ca, const char *name, X509 **cert, EVP_PKEY **key);

/* The CA's own certificate (for the chain a leaf is served with). */
X509 *corral_tls_ca_cert(const struct corral_tls_ca *ca);

#endif
