/*
 * The session socket's C side: core/lib/session_wire.c (ids, the socket path, the exec
 * request read back by the JSON reader, the answer shapes and the ones refused),
 * core/lib/rundir.c (the rule, and a directory's owner and mode checked on real
 * directories).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "rundir.h"
#include "session_wire.h"

static void test_ids(void)
{
    CHECK(corral_session_id_valid("a"));
    CHECK(corral_session_id_valid("Box-1.two_3"));
    char max[64];
    memset(max, 'x', 63);
    max[63] = '\0';
    CHECK(corral_session_id_valid(max));
    char over[65];
    memset(over, 'x', 64);
    over[64] = '\0';
    CHECK(!corral_session_id_valid(over));
    CHECK(!corral_session_id_valid(""));
    CHECK(!corral_session_id_valid("-a"));
    CHECK(!corral_session_id_valid(".a"));
    CHECK(!corral_session_id_valid("a/b"));
    CHECK(!corral_session_id_valid("a b"));
    CHECK(!corral_session_id_valid(".."));
}

static void test_socket_path(void)
{
    char out[128];
    CHECK(corral_session_socket_path(out, sizeof out, "/run/corral/0", "box") == 0);
    CHECK(strcmp(out, "/run/corral/0/session-box.sock") == 0);
    /* past sun_path (108 bytes) even when the buffer would hold it */
    char dir[100], big[512];
    memset(dir, 'd', sizeof dir - 1);
    dir[0] = '/';
    dir[sizeof dir - 1] = '\0';
    CHECK(corral_session_socket_path(big, sizeof big, dir, "box") == -ENAMETOOLONG);
    CHECK(corral_session_socket_path(out, 10, "/run/corral/0", "box") == -ENAMETOOLONG);
}

static long long int_member(const char *doc, size_t len, const char *key)
{
    struct corral_json_value v;
    long long n = -1;
    if (corral_json_member(doc, len, key, &v) != 1 || corral_json_integer(&v, &n) < 0) return -1;
    return n;
}

static void test_exec_line(void)
{
    char *argv[] = {"sh", "-c", "echo \"$X\"\n"};
    char *names[] = {"X", "Y"};
    char *values[] = {"a\\b", "\x01"};
    struct corral_exec_request r = {argv, 3, names, values, 2, "/work dir", 1, 40, 120, NULL};
    struct corral_textbuf b = {0};
    corral_session_exec_line(&b, &r);
    CHECK(!b.failed && b.len > 0 && b.data[b.len - 1] == '\n');
    CHECK(memchr(b.data, '\n', b.len - 1) == NULL); /* one line */
    const char *want = "{\"op\":\"exec\",\"argv\":[\"sh\",\"-c\",\"echo \\\"$X\\\"\\n\"],"
                       "\"env\":{\"X\":\"a\\\\b\",\"Y\":\"\\u0001\"},\"cwd\":\"/work dir\","
                       "\"tty\":true,\"rows\":40,\"cols\":120,\"term\":null}\n";
    CHECK(strcmp(b.data, want) == 0);
    CHECK(int_member(b.data, b.len - 1, "rows") == 40);
    struct corral_json_value v;
    CHECK(corral_json_member(b.data, b.len - 1, "term", &v) == 1 && v.type == CORRAL_JSON_NULL);
    corral_textbuf_free(&b);

    struct corral_exec_request plain = {argv, 1, NULL, NULL, 0, NULL, 0, 24, 80, "xterm"};
    corral_session_exec_line(&b, &plain);
    CHECK(strcmp(b.data, "{\"op\":\"exec\",\"argv\":[\"sh\"],\"env\":{},\"cwd\":null,\"tty\":false,"
                         "\"rows\":24,\"cols\":80,\"term\":\"xterm\"}\n") == 0);
    corral_textbuf_free(&b);

    char line[64];
    CHECK(corral_session_signal_line(line, sizeof line, 15) > 0);
    CHECK(strcmp(line, "{\"op\":\"signal\",\"signal\":15}\n") == 0);
    CHECK(corral_session_signal_line(line, 8, 15) == -ENAMETOOLONG);
}

static int parses(const char *line, struct corral_session_answer *a)
{
    return corral_session_answer_parse(line, strlen(line), a);
}

static void test_answers(void)
{
    struct corral_session_answer a;
    CHECK(parses("{\"ok\":true,\"result\":{\"pid\":4242}}", &a) == 0);
    CHECK(a.kind == CORRAL_ANSWER_STARTED && a.pid == 4242);
    CHECK(parses("{\"result\":{\"exit\":143},\"ok\":true}", &a) == 0);
    CHECK(a.kind == CORRAL_ANSWER_ENDED && a.exit == 143);
    CHECK(parses("{\"ok\":false,\"error\":\"--env: \\\"AWS_SECRET\\\" refused\",\"status\":2}",
                 &a) == 0);
    CHECK(a.kind == CORRAL_ANSWER_REFUSED && a.status == 2 && a.error &&
          strcmp(a.error, "--env: \"AWS_SECRET\" refused") == 0);
    free(a.error);
    /* members unknown to the client are ignored, in any order */
    CHECK(parses("{\"status\":127,\"extra\":[1,{}],\"error\":\"nope: not found\",\"ok\":false}",
                 &a) == 0);
    CHECK(a.kind == CORRAL_ANSWER_REFUSED && a.status == 127);
    free(a.error);

    static const char *const bad[] = {
        "",
        "{}",
        "{\"ok\":1}",
        "{\"ok\":true}",
        "{\"ok\":true,\"result\":{}}",
        "{\"ok\":true,\"result\":{\"pid\":0}}",
        "{\"ok\":true,\"result\":{\"pid\":-3}}",
        "{\"ok\":true,\"result\":{\"pid\":1.5}}",
        "{\"ok\":true,\"result\":{\"exit\":256}}",
        "{\"ok\":true,\"result\":{\"exit\":\"0\"}}",
        "{\"ok\":true,\"result\":{\"pid\":1,\"exit\":0}}",
        "{\"ok\":true,\"result\":[]}",
        "{\"ok\":false,\"status\":2}",
        "{\"ok\":false,\"error\":\"x\"}",
        "{\"ok\":false,\"error\":\"x\",\"status\":0}",
        "{\"ok\":false,\"error\":3,\"status\":2}",
        "{\"ok\":true,\"result\":{\"exit\":0}} trailing",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int r = parses(bad[i], &a);
        if (r != -EINVAL) fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(r == -EINVAL);
    }
}

static void test_rundir(void)
{
    char out[128];
    CHECK(corral_rundir_path(out, sizeof out, 0, "/run/user/0") == 0);
    CHECK(strcmp(out, "/run/corral/0") == 0);
    CHECK(corral_rundir_path(out, sizeof out, 1000, "/run/user/1000") == 0);
    CHECK(strcmp(out, "/run/user/1000/corral") == 0);
    CHECK(corral_rundir_path(out, sizeof out, 1000, "relative") == 0);
    CHECK(strcmp(out, "/tmp/corral-1000") == 0);
    CHECK(corral_rundir_path(out, sizeof out, 1000, NULL) == 0);
    CHECK(strcmp(out, "/tmp/corral-1000") == 0);
    CHECK(corral_rundir_path(out, 8, 1000, NULL) == -ENAMETOOLONG);

    char dir[] = "/tmp/corral-rundir-XXXXXX", file[64], link[64];
    CHECK(mkdtemp(dir) != NULL);
    uid_t me = geteuid();
    CHECK(chmod(dir, 0700) == 0 && corral_rundir_check(dir, me) == 0);
    CHECK(corral_rundir_check(dir, me + 1) == -EPERM);
    CHECK(chmod(dir, 0750) == 0 && corral_rundir_check(dir, me) == -EACCES);
    CHECK(chmod(dir, 0701) == 0 && corral_rundir_check(dir, me) == -EACCES);
    CHECK(chmod(dir, 0700) == 0 && corral_rundir_check(dir, me) == 0); /* control */
    snprintf(file, sizeof file, "%s/f", dir);
    snprintf(link, sizeof link, "%s/l", dir);
    int fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    close(fd);
    CHECK(corral_rundir_check(file, me) == -ENOTDIR);
    CHECK(symlink(dir, link) == 0 && corral_rundir_check(link, me) == -ENOTDIR);
    CHECK(corral_rundir_check("/tmp/corral-rundir-missing-dir", me) == -ENOENT);
    unlink(link);
    unlink(file);
    rmdir(dir);
}

int main(void)
{
    test_ids();
    test_socket_path();
    test_exec_line();
    test_answers();
    test_rundir();
    return DONE();
}
