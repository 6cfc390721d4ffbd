/*
 * The name a client means, read from the first bytes it sends, without terminating
 * anything: a TLS ClientHello's server_name (RFC 6066 section 3) or an HTTP/1.x
 * request's Host header. Pure: no allocation, no I/O; every input is a hostile tenant's.
 */
#ifndef CORRAL_SNI_H
#define CORRAL_SNI_H

#include <stddef.h>
#include <stdint.h>

/* The most a caller needs to peek: one TLS record (a ClientHello is one handshake
 * message in the first record, 2^14 bytes at most) and its header; an HTTP request's
 * head is read within the same bound. */
#define CORRAL_SNI_PEEK_MAX (16384 + 5)
#define CORRAL_SNI_NAME_MAX 255

enum corral_sni_kind {
    CORRAL_SNI_OTHER = 0, /* neither TLS nor HTTP: nothing names a host */
    CORRAL_SNI_TLS = 1,
    CORRAL_SNI_HTTP = 2,
};

struct corral_sni {
    enum corral_sni_kind kind;
    char name[CORRAL_SNI_NAME_MAX + 1]; /* lowercase, no trailing dot, NUL-terminated */
    size_t name_len;                    /* 0: the ClientHello or request names no host */
};

/*
 * Reads the first `len` bytes a client sent. 0: `out` says what they are and the name
 * they carry (if any). -EAGAIN: a prefix of a ClientHello or of an HTTP request head
 * that is still incomplete (peek again when more has arrived, up to
 * CORRAL_SNI_PEEK_MAX). -EBADMSG: TLS or HTTP that breaks its grammar (a ClientHello
 * split across records, two host names, a Host that is not a hostname, a head past
 * CORRAL_SNI_PEEK_MAX); `out->kind` then says which.
 */
int corral_sni_parse(const uint8_t *buf, size_t len, struct corral_sni *out);

#endif
