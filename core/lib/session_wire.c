/*
 * The `exec` exchange's text (see session_wire.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "session_wire.h"

#define SESSION_ID_MAX 63

static int id_char(char c, int first)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return 1;
    return !first && (c == '_' || c == '.' || c == '-');
}

int corral_session_id_valid(const char *id)
{
    size_t n = strlen(id);
    /* no "..": a sandbox's id never holds one (corral.sandbox), nor a path made of it */
    if (n == 0 || n > SESSION_ID_MAX || strstr(id, "..") != NULL) return 0;
    for (size_t i = 0; i < n; i++)
        if (!id_char(id[i], i == 0)) return 0;
    return 1;
}

int corral_session_socket_path(char *out, size_t cap, const char *rundir, const char *id)
{
    int n = snprintf(out, cap, "%s/session-%s.sock", rundir, id);
    if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof((struct sockaddr_un *)0)->sun_path)
        return -ENAMETOOLONG;
    return 0;
}

static void add_string_or_null(struct corral_textbuf *b, const char *s)
{
    if (s == NULL)
        corral_textbuf_addstr(b, "null");
    else
        corral_json_add_bytes(b, s, strlen(s));
}

void corral_session_exec_line(struct corral_textbuf *b, const struct corral_exec_request *r)
{
    char num[64];
    corral_textbuf_addstr(b, "{\"op\":\"exec\",\"argv\":[");
    for (int i = 0; i < r->argc; i++) {
        if (i > 0) corral_textbuf_add(b, ",", 1);
        corral_json_add_bytes(b, r->argv[i], strlen(r->argv[i]));
    }
    corral_textbuf_addstr(b, "],\"env\":{");
    for (int i = 0; i < r->nenv; i++) {
        if (i > 0) corral_textbuf_add(b, ",", 1);
        corral_json_add_bytes(b, r->env_names[i], strlen(r->env_names[i]));
        corral_textbuf_add(b, ":", 1);
        corral_json_add_bytes(b, r->env_values[i], strlen(r->env_values[i]));
    }
    corral_textbuf_addstr(b, "},\"cwd\":");
    add_string_or_null(b, r->cwd);
    snprintf(num, sizeof num,
             ",\"tty\":%s,\"rows\":%u,\"cols\":%u,\"term\":", r->tty ? "true" : "false", r->rows,
             r->cols);
    corral_textbuf_addstr(b, num);
    add_string_or_null(b, r->term);
    corral_textbuf_addstr(b, "}\n");
}

int corral_session_signal_line(char *out, size_t cap, int sig)
{
    int n = snprintf(out, cap, "{\"op\":\"signal\",\"signal\":%d}\n", sig);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

/* The integer member key of the object text, within [lo, hi]; 1 found, 0 absent,
 * -EINVAL malformed or out of range. */
static int integer_member(const char *text, size_t len, const char *key, long long lo, long long hi,
                          long long *out)
{
    struct corral_json_value v;
    int r = corral_json_member(text, len, key, &v);
    if (r <= 0) return r;
    if (corral_json_integer(&v, out) < 0 || *out < lo || *out > hi) return -EINVAL;
    return 1;
}

static int parse_refusal(const char *line, size_t len, struct corral_session_answer *a)
{
    struct corral_json_value v;
    long long status;
    if (corral_json_member(line, len, "error", &v) != 1) return -EINVAL;
    if (integer_member(line, len, "status", 1, 255, &status) != 1) return -EINVAL;
    int r = corral_json_string(&v, &a->error);
    if (r < 0) return r;
    a->kind = CORRAL_ANSWER_REFUSED;
    a->status = (int)status;
    return 0;
}

static int parse_result(const char *line, size_t len, struct corral_session_answer *a)
{
    struct corral_json_value res;
    long long n;
    if (corral_json_member(line, len, "result", &res) != 1 || res.type != CORRAL_JSON_OBJECT)
        return -EINVAL;
    int has_pid = integer_member(res.start, res.len, "pid", 1, 0x7fffffff, &a->pid);
    int has_exit = integer_member(res.start, res.len, "exit", 0, 255, &n);
    if (has_pid < 0 || has_exit < 0 || has_pid + has_exit != 1) return -EINVAL;
    if (has_exit) {
        a->kind = CORRAL_ANSWER_ENDED;
        a->exit = (int)n;
    } else {
        a->kind = CORRAL_ANSWER_STARTED;
    }
    return 0;
}

int corral_session_answer_parse(const char *line, size_t len, struct corral_session_answer *a)
{
    struct corral_json_value ok;
    memset(a, 0, sizeof *a);
    if (corral_json_member(line, len, "ok", &ok) != 1) return -EINVAL;
    int yes = corral_json_bool(&ok);
    if (yes < 0) return -EINVAL;
    return yes ? parse_result(line, len, a) : parse_refusal(line, len, a);
}
