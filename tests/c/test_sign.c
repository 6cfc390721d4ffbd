/*
 * Ed25519 through OpenSSL: a key made at first use (mode 0600, kept on the second call),
 * a signature that verifies (control) and fails once one byte of the message, the
 * signature or the key changes; RFC 8032's test vector 1 checks the verifier against the
 * standard rather than against itself; base64 against RFC 4648's vectors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sign.h"

/* RFC 8032 section 7.1, TEST 1: the empty message. */
static const char RFC_PUB_PEM[] = "-----BEGIN PUBLIC KEY-----\n"
                                  "MCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n"
                                  "-----END PUBLIC KEY-----\n";
static const char RFC_SIG_HEX[] =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
    "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

static int b64_is(const char *in, const char *want)
{
    char out[64];
    int n = corral_b64_encode(in, strlen(in), out);
    if (n < 0 || strcmp(out, want) != 0) return 0;
    uint8_t back[64];
    n = corral_b64_decode(want, strlen(want), back);
    return n == (int)strlen(in) && memcmp(back, in, (size_t)n) == 0;
}

int main(void)
{
    char dir[] = "/tmp/corral-test-sign-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char key[128], other[128];
    snprintf(key, sizeof key, "%s/key", dir);
    snprintf(other, sizeof other, "%s/other", dir);

    int created = 0;
    CHECK(corral_key_ensure(key, &created) == 0 && created == 1);
    struct stat st;
    CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600);
    char *pem = NULL;
    uint8_t raw[CORRAL_ED25519_RAW_LEN], raw2[CORRAL_ED25519_RAW_LEN];
    CHECK(corral_key_public(key, &pem, raw) == 0);
    CHECK(corral_key_ensure(key, &created) == 0 && created == 0); /* kept */
    char *pem2 = NULL;
    CHECK(corral_key_public(key, &pem2, raw2) == 0 && memcmp(raw, raw2, sizeof raw) == 0);
    uint8_t parsed[CORRAL_ED25519_RAW_LEN];
    CHECK(corral_pub_raw(pem, strlen(pem), parsed) == 0 && memcmp(parsed, raw, sizeof raw) == 0);

    const char msg[] = "DSSEv1 4 test 5 hello";
    uint8_t sig[CORRAL_ED25519_SIG_LEN];
    CHECK(corral_key_sign(key, msg, sizeof msg - 1, sig) == 0);
    CHECK(corral_pub_verify(pem, strlen(pem), msg, sizeof msg - 1, sig, sizeof sig) ==
          0); /* control */
    char bad_msg[sizeof msg];
    memcpy(bad_msg, msg, sizeof msg);
    bad_msg[7] ^= 1;
    CHECK(corral_pub_verify(pem, strlen(pem), bad_msg, sizeof msg - 1, sig, sizeof sig) ==
          -EBADMSG);
    sig[10] ^= 1;
    CHECK(corral_pub_verify(pem, strlen(pem), msg, sizeof msg - 1, sig, sizeof sig) == -EBADMSG);
    sig[10] ^= 1;
    /* another key's public half */
    CHECK(corral_key_ensure(other, &created) == 0 && created == 1);
    char *other_pem = NULL;
    CHECK(corral_key_public(other, &other_pem, raw2) == 0);
    CHECK(corral_pub_verify(other_pem, strlen(other_pem), msg, sizeof msg - 1, sig, sizeof sig) ==
          -EBADMSG);
    CHECK(corral_pub_verify(pem, strlen(pem), msg, sizeof msg - 1, sig, sizeof sig) ==
          0); /* control after */
    /* not a key at all */
    CHECK(corral_pub_verify("junk", 4, msg, sizeof msg - 1, sig, sizeof sig) == -EINVAL);
    CHECK(corral_key_public("/nonexistent/key", &pem2, raw2) == -ENOENT);

    /* RFC 8032 TEST 1 verifies; with one bit of its signature changed it does not */
    uint8_t rfc_sig[CORRAL_ED25519_SIG_LEN];
    unhex(RFC_SIG_HEX, rfc_sig, sizeof rfc_sig);
    CHECK(corral_pub_verify(RFC_PUB_PEM, strlen(RFC_PUB_PEM), "", 0, rfc_sig, sizeof rfc_sig) == 0);
    rfc_sig[63] ^= 0x40;
    CHECK(corral_pub_verify(RFC_PUB_PEM, strlen(RFC_PUB_PEM), "", 0, rfc_sig, sizeof rfc_sig) ==
          -EBADMSG);

    /* RFC 4648 section 10; and text that is not padded base64 is refused */
    CHECK(b64_is("f", "Zg=="));
    CHECK(b64_is("fo", "Zm8="));
    CHECK(b64_is("foobar", "Zm9vYmFy"));
    uint8_t out[16];
    CHECK(corral_b64_decode("Zg=", 3, out) == -EINVAL);
    CHECK(corral_b64_decode("Z=g=", 4, out) == -EINVAL);
    CHECK(corral_b64_decode(" Zg=", 4, out) == -EINVAL);
    CHECK(corral_b64_decode("Zm8=", 4, out) == 2); /* control */

    free(pem);
    free(pem2);
    free(other_pem);
    unlink(key);
    unlink(other);
    rmdir(dir);
    return DONE();
}
