/*
 * A connected TCP pair on loopback for the C unit tests, built from the verbs under test
 * (corral_tcp_listen / connect / accept in core/lib/sock.c).
 */
#ifndef CORRAL_NETPAIR_H
#define CORRAL_NETPAIR_H

#include <unistd.h>

#include "sock.h"

/* *x is the connecting end, *y the accepted one. Returns 0, or -1 with whichever end
 * was made left open for the caller to close. */
static inline int tcp_pair(int *x, int *y)
{
    int port = 0;
    int l = corral_tcp_listen("127.0.0.1", 0, &port);
    if (l < 0) return -1;
    *x = corral_tcp_connect("127.0.0.1", port, 1000);
    *y = corral_tcp_accept(l, 1000);
    close(l);
    return *x >= 0 && *y >= 0 ? 0 : -1;
}

#endif
