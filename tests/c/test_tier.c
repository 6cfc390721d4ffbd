/*
 * The tier S1 runner (core/lib/tier.c) and its seccomp programs against the real kernel.
 * Each denial is checked with its control: the same program without the layer does what
 * the layer denies, and the confined program still does what it is allowed after the
 * denied attempt.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "landlock.h"
#include "seccomp_tables.h"
#include "tier.h"
#include "tier_seccomp.h"

#define TABLE(t)                                                                                   \
    {                                                                                              \
        (struct sock_filter *)t, sizeof t / sizeof t[0]                                            \
    }
static const struct corral_bpf nosub = TABLE(corral_nosubprocess_filter);
static const struct corral_bpf nonet = TABLE(corral_nonet_filter);

static void tables_match_fresh_builds(void)
{
    struct corral_bpf fresh;
    CHECK(corral_seccomp_nosubprocess_program(&fresh) == 0);
    CHECK(fresh.len == nosub.len &&
          memcmp(fresh.insns, nosub.insns, sizeof corral_nosubprocess_filter) == 0);
    corral_bpf_free(&fresh);
    CHECK(corral_seccomp_nonet_program(&fresh) == 0);
    CHECK(fresh.len == nonet.len &&
          memcmp(fresh.insns, nonet.insns, sizeof corral_nonet_filter) == 0);
    corral_bpf_free(&fresh);
}

/* Runs argv[0] (a path) under the given layers; returns the exit status (-1: did not
 * start) and what it wrote on stdout and stderr. */
static int run(char *const *argv, int ruleset, const struct corral_bpf *filter,
               const struct corral_bpf *supervised, char *out, size_t outlen,
               struct corral_tier_result *res)
{
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};
    FILE *f = tmpfile();
    struct corral_tier_plan plan = {.path = argv[0],
                                    .argv = argv,
                                    .envp = envp,
                                    .netns_fd = -1,
                                    .ruleset_fd = ruleset,
                                    .supervised = supervised,
                                    .stdio = {-1, fileno(f), fileno(f)},
                                    .timeout_ms = 10000};
    if (filter) plan.filters[plan.n_filters++] = filter;
    const char *step = "";
    int r = corral_tier_run(&plan, res, &step);
    size_t n = 0;
    if (r == 0) {
        rewind(f);
        n = fread(out, 1, outlen - 1, f);
    }
    out[n] = '\0';
    fclose(f);
    return r < 0 ? -1 : res->status;
}

static int run_sh(const char *script, int ruleset, const struct corral_bpf *filter,
                  const struct corral_bpf *supervised, char *out, size_t outlen,
                  struct corral_tier_result *res)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    return run(argv, ruleset, filter, supervised, out, outlen, res);
}

static void subprocess_denied_after_start(void)
{
    char out[512];
    struct corral_tier_result res;
    /* The control: unsupervised, sh runs a child and execs. */
    CHECK(run_sh("/bin/true && echo forked; exec /bin/echo execd", -1, NULL, NULL, out, sizeof out,
                 &res) == 0);
    CHECK(strstr(out, "forked") && strstr(out, "execd"));
    /* Supervised: sh itself starts (the first exec passes) and its fork is refused. */
    CHECK(run_sh("/bin/true", -1, NULL, &nosub, out, sizeof out, &res) == 2);
    CHECK(strstr(out, "fork") != NULL);
    /* bash with execfail survives a refused exec: the echo after it is the control. */
    if (access("/bin/bash", X_OK) != 0) return;
    char *argv[] = {"/bin/bash", "-c", "shopt -s execfail; exec /bin/true; echo still-here", NULL};
    CHECK(run(argv, -1, NULL, &nosub, out, sizeof out, &res) == 0);
    CHECK(strstr(out, "not permitted") && strstr(out, "still-here"));
    CHECK(res.execs_denied == 1);
}

static void network_denied_but_unix_pairs(void)
{
    char out[512], script[160];
    struct corral_tier_result res;
    /* bash's /dev/tcp makes a plain socket() + connect() (dash has none). */
    if (access("/bin/bash", X_OK) != 0) return;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    CHECK(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 4) == 0 &&
          getsockname(l, (struct sockaddr *)&sa, &len) == 0);
    snprintf(script, sizeof script,
             "exec 3<>/dev/tcp/127.0.0.1/%d 2>/dev/null; echo rc=$?; echo ok | cat",
             ntohs(sa.sin_port));
    char *argv[] = {"/bin/bash", "-c", script, NULL};
    /* The control: unfiltered, the connect to our listener succeeds. */
    CHECK(run(argv, -1, NULL, NULL, out, sizeof out, &res) == 0);
    CHECK(strstr(out, "rc=0") != NULL);
    /* Filtered, the same connect fails; the pipe after it (not a socket) still works. */
    CHECK(run(argv, -1, &nonet, NULL, out, sizeof out, &res) == 0);
    CHECK(strstr(out, "rc=1") && strstr(out, "ok"));
    close(l);
}

static void landlock_denies_outside(void)
{
    int abi = corral_landlock_abi();
    if (abi < 1) return;
    char dir[] = "/tmp/corral-test-tier-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char secret[64];
    snprintf(secret, sizeof secret, "%s/secret", dir);
    FILE *s = fopen(secret, "w");
    fputs("secret\n", s);
    fclose(s);
    struct corral_tier_rule rules[] = {{"/usr", CORRAL_LL_READ_EXEC, 0},
                                       {"/lib", CORRAL_LL_READ_EXEC, 1},
                                       {"/lib64", CORRAL_LL_READ_EXEC, 1},
                                       {"/bin", CORRAL_LL_READ_EXEC, 1},
                                       {"/etc/ld.so.cache", CORRAL_LL_READ_FILE, 1}};
    size_t failed;
    char script[256];
    snprintf(
        script, sizeof script,
        "if read x < %s; then echo BREACH; fi; read y < /usr/lib/os-release && echo control-ok",
        secret);
    char out[512];
    struct corral_tier_result res;
    /* The control: without the ruleset the secret is read. */
    CHECK(run_sh(script, -1, NULL, NULL, out, sizeof out, &res) == 0);
    CHECK(strstr(out, "BREACH") != NULL);
    int rs = corral_tier_ruleset(abi, rules, sizeof rules / sizeof rules[0], &failed);
    CHECK(rs >= 0);
    CHECK(run_sh(script, rs, NULL, NULL, out, sizeof out, &res) == 0);
    CHECK(strstr(out, "BREACH") == NULL && strstr(out, "control-ok") != NULL);
    close(rs);
    unlink(secret);
    rmdir(dir);
}

static void failed_exec_is_reported(void)
{
    char *argv[] = {"x", NULL};
    char *envp[] = {NULL};
    struct corral_tier_plan plan = {.path = "/nonexistent/x",
                                    .argv = argv,
                                    .envp = envp,
                                    .netns_fd = -1,
                                    .ruleset_fd = -1,
                                    .supervised = &nosub,
                                    .stdio = {-1, -1, -1}};
    struct corral_tier_result res;
    const char *step = "";
    int before = count_fds();
    CHECK(corral_tier_run(&plan, &res, &step) == -ENOENT);
    CHECK(strcmp(step, "exec") == 0);
    CHECK(count_fds() == before);
}

int main(void)
{
    tables_match_fresh_builds();
    subprocess_denied_after_start();
    network_denied_but_unix_pairs();
    landlock_denies_outside();
    failed_exec_is_reported();
    return DONE();
}
