/*
 * Host-name lookup for the egress acceptor (path resolution is path.h): only for a
 * connection already permitted, never for a tenant's query (those are answered locally
 * and never forwarded).
 */
#ifndef CORRAL_LOOKUP_H
#define CORRAL_LOOKUP_H

#include <stddef.h>

/* Looks name up with the host's resolver (getaddrinfo, numeric results only) into up to
 * max text addresses of size 46 each; returns the count or -errno (-ENOENT: no such
 * name, -EAGAIN: temporary failure). */
int corral_lookup_host(const char *name, char (*out)[46], size_t max);

#endif
