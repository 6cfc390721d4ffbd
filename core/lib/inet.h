/*
 * IP address text and prefix arithmetic for the egress policy: parsing the addresses an
 * operator writes in an allowlist, formatting the ones the kernel reports, and testing
 * CIDR containment. Pure computation over caller buffers: no allocation, no I/O.
 *
 * Addresses are network-order byte strings of 4 (IPv4) or 16 (IPv6) bytes. Nothing here
 * folds an IPv4-mapped IPv6 address (::ffff:a.b.c.d) into IPv4 behind the caller's back:
 * corral_inet_unmap() reports it, and the policy layer decides to compare it as IPv4.
 */
#ifndef CORRAL_INET_H
#define CORRAL_INET_H

#include <stddef.h>
#include <stdint.h>

/* Longest text corral_inet_format() writes, NUL included (INET6_ADDRSTRLEN). */
#define CORRAL_INET_TEXT_MAX 46

/* Parses the len bytes at s as an address: dotted-quad IPv4 ("1.2.3.4", exactly four
 * decimal parts, no leading zeros, as inet_pton), or IPv6 text, bare or in brackets
 * ("2001:db8::1", "[2001:db8::1]"). No zone ("%eth0"), no port, no prefix length, no
 * brackets around IPv4. Returns the address length (4 or 16) with the bytes in out, or
 * -EINVAL. */
int corral_inet_parse(const char *s, size_t len, uint8_t out[16]);

/* Returns 1 and the embedded IPv4 address in out4 if addr is a 16-byte IPv4-mapped
 * address (::ffff:0:0/96), 0 otherwise (including every 4-byte address). */
int corral_inet_unmap(const uint8_t *addr, size_t len, uint8_t out4[4]);

/* Writes the text form of a 4- or 16-byte address into out (size bytes, NUL included).
 * Returns the text length, -EINVAL for another length, -ENOSPC if out is too small. */
int corral_inet_format(const uint8_t *addr, size_t len, char *out, size_t size);

/* Whether addr lies in net/prefix. Returns 1 or 0; 0 whenever the lengths differ (an
 * IPv4 address is never inside an IPv6 network, mapped or not: unmap first). -EINVAL if
 * a length is not 4 or 16, or prefix exceeds the network's bit length. */
int corral_inet_in_cidr(const uint8_t *addr, size_t alen, const uint8_t *net, size_t nlen,
                        unsigned prefix);

/* Clears the host bits of addr past prefix, in place. Returns 0, or -EINVAL for a length
 * other than 4 or 16 or a prefix past its bit length. */
int corral_inet_mask(uint8_t *addr, size_t len, unsigned prefix);

#endif
