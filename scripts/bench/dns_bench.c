/*
 * build/bench/dns_bench (run by scripts/bench/dns): parses and answers a fixed mix
 * of queries with the DNS codec alone for argv[1] seconds and prints
 * "rate answers checksum seconds".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dns.h"

struct sample {
    size_t len;
    uint8_t b[128];
};

static size_t put_name(uint8_t *p, const char *dotted)
{
    size_t n = 0;
    while (*dotted) {
        size_t l = strcspn(dotted, ".");
        p[n++] = (uint8_t)l;
        memcpy(p + n, dotted, l);
        n += l;
        dotted += l;
        if (*dotted) dotted++;
    }
    p[n++] = 0;
    return n;
}

static void query(struct sample *s, const char *name, unsigned qtype, int edns)
{
    static const uint8_t hdr[12] = {0x12, 0x34, 0x01, 0x20, 0, 1, 0, 0, 0, 0, 0, 0};
    static const uint8_t opt[] = {0,  0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 12, 0,
                                  10, 0, 8,  1,    2,    3, 4, 5, 6, 7, 8};
    memcpy(s->b, hdr, 12);
    s->len = 12 + put_name(s->b + 12, name);
    s->b[s->len++] = (uint8_t)(qtype >> 8);
    s->b[s->len++] = (uint8_t)qtype;
    s->b[s->len++] = 0;
    s->b[s->len++] = 1;
    if (edns) {
        s->b[11] = 1;
        memcpy(s->b + s->len, opt, sizeof opt);
        s->len += sizeof opt;
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    struct sample m[8];
    query(&m[0], "pypi.org", 1, 0);
    query(&m[1], "files.pythonhosted.org", 28, 1);
    query(&m[2], "github.com", 1, 1);
    query(&m[3], "pypi.org", 16, 0);
    query(&m[4], "exfil-0123456789abcdef.attacker.example", 1, 1);
    query(&m[5], "objects.githubusercontent.com", 28, 0);
    query(&m[6], "pypi.org", 1, 0);
    m[6].b[12] = 0xc0; /* compression pointer: FORMERR */
    m[6].b[13] = 0x0c;
    query(&m[7], "registry.npmjs.org", 1, 0);

    static const uint8_t v4[4] = {198, 18, 0, 1};
    static const uint8_t v6[16] = {0xfd, 0, 0xc0, 0x44, [15] = 1};
    uint8_t out[CORRAL_DNS_ANSWER_MAX];
    unsigned long answers = 0, dropped = 0, sum = 0;
    double start = now(), t = start;
    while (t - start < seconds) {
        for (int rep = 0; rep < 1000; rep++) {
            for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
                struct corral_dns_query q;
                int r = corral_dns_parse_query(m[i].b, m[i].len, &q), n;
                if (r < 0) {
                    int rcode = corral_dns_error_rcode(r);
                    if (rcode < 0) {
                        dropped++;
                        continue;
                    }
                    n = corral_dns_build_answer(&q, out, sizeof out, rcode, NULL, 0, 0);
                } else if (!q.hostname || q.name[0] == 'e') {
                    n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_NXDOMAIN, NULL, 0,
                                                0);
                } else if (q.qtype == 1) {
                    n = corral_dns_build_answer(&q, out, sizeof out, 0, v4, 4, 60);
                } else if (q.qtype == 28) {
                    n = corral_dns_build_answer(&q, out, sizeof out, 0, v6, 16, 60);
                } else {
                    n = corral_dns_build_answer(&q, out, sizeof out, CORRAL_DNS_REFUSED, NULL, 0,
                                                0);
                }
                if (n < 0) {
                    fprintf(stderr, "dns_bench: sample %zu: build failed: %s\n", i, strerror(-n));
                    return 1;
                }
                sum += out[n - 1];
                answers++;
            }
        }
        t = now();
    }
    double rate = (double)answers / (t - start);
    printf("%.0f %lu %lu %.3f\n", rate, answers, sum, t - start);
    return dropped ? 1 : 0;
}
