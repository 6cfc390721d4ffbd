/*
 * getaddrinfo for permitted connections (see lookup.h). Results are de-duplicated and
 * kept in the resolver's order; the caller checks each against the forbidden ranges.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>

#include "lookup.h"

int corral_lookup_host(const char *name, char (*out)[46], size_t max)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int r = getaddrinfo(name, NULL, &hints, &res);
    if (r != 0) {
        if (r == EAI_NONAME || r == EAI_NODATA) return -ENOENT;
        if (r == EAI_AGAIN) return -EAGAIN;
        if (r == EAI_SYSTEM) return -errno;
        return -EIO;
    }
    size_t n = 0;
    for (struct addrinfo *ai = res; ai && n < max; ai = ai->ai_next) {
        char text[46];
        const void *a = ai->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        if (!inet_ntop(ai->ai_family, a, text, sizeof text)) continue;
        int dup = 0;
        for (size_t i = 0; i < n; i++)
            dup |= strcmp(out[i], text) == 0;
        if (!dup) memcpy(out[n++], text, sizeof text);
    }
    freeaddrinfo(res);
    return (int)n;
}
