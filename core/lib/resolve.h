/*
 * Host-side name resolution for the egress acceptor: only for a connection already
 * permitted, never for a tenant's query (those are answered locally and never forwarded).
 */
#ifndef CORRAL_RESOLVE_H
#define CORRAL_RESOLVE_H

#include <stddef.h>

/* Resolves name with the host's resolver (getaddrinfo, numeric results only) into up to
 * max text addresses of size 46 each; returns the count or -errno (-ENOENT: no such
 * name, -EAGAIN: temporary failure). */
int corral_resolve_host(const char *name, char (*out)[46], size_t max);

#endif
